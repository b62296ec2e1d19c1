"""A warm plan's states, as the planner records them and the API reports them: issued, then warming while
its warmer reports progress, then one final state from the warmer's `warm.finished` (or `superseded` when a
newer plan for the replica replaced it). Pure: no I/O."""

from __future__ import annotations

from typing import Final, Literal

from warmplane.shared.events import WarmFinished

PlanState = Literal["issued", "warming", "verified", "partial", "failed", "superseded"]
FINAL_PLAN_STATES: Final[frozenset[PlanState]] = frozenset({"verified", "partial", "failed", "superseded"})


def plan_state(result: WarmFinished) -> PlanState:
    """`verified` when nothing failed, `partial` when some prefixes are held, else `failed`."""
    if not result.partial and not result.failures:
        return "verified"
    return "partial" if result.verified_hits > 0 else "failed"
