"""Per-tenant request rate limits (the gateway's and the API's): a token bucket per key. Pure: the
caller hands in `now`.

A bucket holds at most `burst` requests and refills at `requests_per_s`; a request takes one. A refused
request is told how long until one is back (`Retry-After`). Keys are tenants (gateway) or token names
(API), both fixed by the settings, so the table of buckets is bounded by configuration, never by traffic.
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import BaseModel, Field


class RateLimitSettings(BaseModel):
    """Off while `requests_per_s` is 0 (the default); otherwise each key gets `requests_per_s` on
    average and at most `burst` at once. Refusals are 429 with `Retry-After` in whole seconds."""

    requests_per_s: Annotated[float, Field(ge=0)] = 0.0
    """Requests a second each tenant (or token) may make on average; 0 turns the limit off."""
    burst: Annotated[int, Field(ge=1)] = 100
    """Requests a tenant (or token) may make at once before the rate applies."""


class RateLimiter:
    def __init__(self, settings: RateLimitSettings) -> None:
        self._rate = settings.requests_per_s
        self._burst = float(settings.burst)
        self._buckets: dict[str, tuple[float, float]] = {}
        """key -> (tokens left, when they were counted)"""

    @property
    def enabled(self) -> bool:
        return self._rate > 0

    def take(self, key: str, now: float) -> int:
        """0 if `key` may make a request at `now` (monotonic seconds), and it is counted; otherwise the
        whole seconds (at least 1) until it may, and nothing is taken."""
        if self._rate <= 0:
            return 0
        tokens, then = self._buckets.get(key, (self._burst, now))
        tokens = min(self._burst, tokens + max(0.0, now - then) * self._rate)
        if tokens >= 1.0:
            self._buckets[key] = (tokens - 1.0, now)
            return 0
        self._buckets[key] = (tokens, now)
        return max(1, math.ceil((1.0 - tokens) / self._rate))
