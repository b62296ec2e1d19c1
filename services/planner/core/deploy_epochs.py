"""When a deploy bumps a (tenant, model) epoch. Pure: no I/O.

A deploy event (`deploy.started` or `deploy.finished`) names the weights revision being rolled out
(`model.revision`) and the prompt revisions (`prompt_revs`, and the envelope's `prompt_rev` if set). KV
computed under other weights or another prompt is worthless to the new one, so a deploy whose revisions
differ from the ones the (tenant, model)'s current epoch was bumped for moves it to the next epoch; the same
revisions again (the `finished` of a rollout whose `started` bumped, a redelivered event) change nothing. A
(tenant, model) no deploy was recorded for is bumped by its first one: the revisions it served before are
not known, and a needless bump costs one warm-up while a missed one serves stale KV.
"""

from __future__ import annotations

from dataclasses import dataclass

from warmplane.shared.events import DeployFinished, DeployStarted


@dataclass(frozen=True, slots=True)
class Revisions:
    """What a deploy rolls out: the weights revision and the sorted, distinct prompt revisions."""

    model_revision: str
    prompt_revs: tuple[str, ...]

    @staticmethod
    def of(deploy: DeployStarted | DeployFinished) -> Revisions:
        prompts = {*deploy.prompt_revs, *([deploy.prompt_rev] if deploy.prompt_rev else [])}
        return Revisions(deploy.model.revision, tuple(sorted(prompts)))


@dataclass(frozen=True, slots=True)
class EpochState:
    """A (tenant, model)'s current epoch (0 without a row) and the revisions of the deploy that last
    bumped it (None when no deploy did)."""

    tenant: str
    epoch: int
    deployed: Revisions | None


def deploy_bumps(states: list[EpochState], deployed: Revisions) -> list[tuple[str, int, int]]:
    """(tenant, current epoch, next epoch) for each state the deploy of `deployed` bumps, in order. The
    next epoch is always the current one plus one: epochs only rise."""
    return [(s.tenant, s.epoch, s.epoch + 1) for s in states if s.deployed != deployed]
