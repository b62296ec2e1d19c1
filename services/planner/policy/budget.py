"""Warm budgets: how many prefill tokens one replica's warm set may cost. Pure: no I/O.

Budget tiers follow the seed's cold-start budget, in this order: a starting replica spends its time on
weights first (nothing is served without them), then on KV prefixes (this package), then on the semantic
result cache (cheap to fill, and it helps only once the replica serves). A tier gets what the tiers before
it left of the start-up deadline; `kv_prefix_seconds` is that rule for the KV tier.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum


class BudgetTier(IntEnum):
    """The start-up tiers, in the order they are served (lower first)."""

    WEIGHTS = 0
    KV_PREFIXES = 1
    RESULT_CACHE = 2


def kv_prefix_seconds(deadline_s: float, weights_load_s: float) -> float:
    """Seconds left for KV prefixes once the weights tier has taken `weights_load_s` of a start-up
    deadline of `deadline_s`; never negative."""
    return max(0.0, deadline_s - weights_load_s)


@dataclass(frozen=True, slots=True)
class WarmBudget:
    """A warm set's budget: at most `tokens` prefill tokens and, when both are given, at most `seconds`
    of prefill at the replica's measured `prefill_tokens_per_s`.

    Raises `ValueError` for negative tokens or seconds, a non-positive rate, or seconds without a rate.
    """

    tokens: int
    seconds: float | None = None
    prefill_tokens_per_s: float | None = None

    def __post_init__(self) -> None:
        if self.tokens < 0:
            raise ValueError(f"tokens must not be negative, got {self.tokens}")
        if self.seconds is not None and (self.seconds < 0 or math.isnan(self.seconds)):
            raise ValueError(f"seconds must not be negative, got {self.seconds}")
        if self.prefill_tokens_per_s is not None and not self.prefill_tokens_per_s > 0:
            raise ValueError(f"prefill_tokens_per_s must be positive, got {self.prefill_tokens_per_s}")
        if self.seconds is not None and self.prefill_tokens_per_s is None:
            raise ValueError("a budget in seconds needs a measured prefill rate (prefill_tokens_per_s)")

    def token_limit(self, kv_capacity_tokens: int, capacity_fraction: float) -> int:
        """The tokens a warm set may cost: the least of `tokens`, the seconds' worth of prefill, and
        `capacity_fraction` (in [0, 1]) of the replica's KV capacity, since a warm set near capacity evicts
        its own beginning. Raises `ValueError` for a fraction outside [0, 1] or a negative capacity."""
        if not 0 <= capacity_fraction <= 1:
            raise ValueError(f"capacity_fraction must be in [0, 1], got {capacity_fraction}")
        if kv_capacity_tokens < 0:
            raise ValueError(f"kv_capacity_tokens must not be negative, got {kv_capacity_tokens}")
        limit = min(self.tokens, math.floor(kv_capacity_tokens * capacity_fraction))
        if self.seconds is not None and self.prefill_tokens_per_s is not None:
            limit = min(limit, math.floor(self.seconds * self.prefill_tokens_per_s))
        return limit
