"""Whether to warm at all: a replica's chosen warm set against what warming it costs. Pure: no I/O.

Each block of a warm set is already worth its tokens on its own (its calibrated chance of reuse is at least
the least reuse probability). A plan as a whole still costs something fixed: the replica waits for it
before it turns ready. So a plan is issued empty, with its reason, when
- nothing is likely enough to be reused (no block passed the least reuse probability);
- its expected saved prefill (each item's tokens times its chance of reuse, summed) is below a floor; or
- warming it would take longer, at the measured prefill rate, than the readiness budget allows.
An empty plan turns the replica ready at once. The reason is one line that names the model and the
figures, for the API, the CLI, the logs and the metrics (`EmptyReason` is its label there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from warmplane.services.planner.policy.warm_set import ChosenPrefix


class EmptyReason(StrEnum):
    """Why a plan is empty (a metric's label)."""

    NOTHING_LIKELY = "nothing_likely"
    LITTLE_SAVED = "little_saved"
    PAST_READINESS_BUDGET = "past_readiness_budget"


@dataclass(frozen=True, slots=True)
class WarmThresholds:
    """`min_expected_saved_tokens`: the floor on a plan's expected saved prefill; `prefill_tokens_per_s`
    (None: unknown) and `readiness_budget_s`: how long warming may hold readiness back;
    `min_reuse_probability`: the least chance a block was chosen at (named in the reason)."""

    min_expected_saved_tokens: int
    readiness_budget_s: float
    prefill_tokens_per_s: float | None
    min_reuse_probability: float


@dataclass(frozen=True, slots=True)
class WarmDecision:
    """The items to warm (all or none of those chosen) and, when none, why (`reason`, `message`)."""

    items: list[ChosenPrefix]
    reason: EmptyReason | None
    message: str | None


def expected_saved_tokens(items: Sequence[ChosenPrefix]) -> float:
    """The prefill `items` are expected to save in the ramp window: cost times chance of reuse, summed."""
    return sum(item.cost_tokens * item.reuse_probability for item in items)


def decide_warm(model: str, items: Sequence[ChosenPrefix], thresholds: WarmThresholds) -> WarmDecision:
    """`items` (a replica's chosen warm set) as they are, or none with the first reason that holds."""
    saved = expected_saved_tokens(items)
    cost = sum(item.cost_tokens for item in items)
    rate = thresholds.prefill_tokens_per_s
    if not items:
        return _empty(
            model,
            EmptyReason.NOTHING_LIKELY,
            f"no prefix is at least {thresholds.min_reuse_probability:.0%} likely to be reused",
        )
    if saved < thresholds.min_expected_saved_tokens:
        return _empty(
            model,
            EmptyReason.LITTLE_SAVED,
            f"expected saved prefill {saved:,.0f} tokens (of {cost:,} warmed) is below"
            f" {thresholds.min_expected_saved_tokens:,}",
        )
    if rate is not None and cost / rate > thresholds.readiness_budget_s:
        return _empty(
            model,
            EmptyReason.PAST_READINESS_BUDGET,
            f"warming {cost:,} tokens would take {cost / rate:,.0f} s, past the readiness budget of"
            f" {thresholds.readiness_budget_s:,.0f} s",
        )
    return WarmDecision(list(items), None, None)


def _empty(model: str, reason: EmptyReason, why: str) -> WarmDecision:
    return WarmDecision([], reason, f"warming buys little for model {model}: {why}")
