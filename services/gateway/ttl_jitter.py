"""Times to live with jitter, so that entries filled together do not all expire together (and send
their requests to the engines together). Pure: the caller hands in the random draw."""

from __future__ import annotations

from collections.abc import Callable


def jittered(ttl_s: float, spread: float, uniform: Callable[[float, float], float]) -> float:
    """`ttl_s` scaled by a factor drawn from [1 - spread, 1 + spread] with `uniform(a, b)`
    (`random.Random.uniform`); `spread` is a fraction, 0 for none."""
    return ttl_s * (1.0 + uniform(-spread, spread)) if spread else ttl_s
