"""The traffic sums a statistics row holds per bucket, named once: `prefix_stats`, the `scope_traffic` it is
rolled up into (the planner's retention sweep) and `replica_stats` all carry these columns, and the API adds
them across tables. A column added to the three tables is added here, and every query that moves or reads
the sums follows."""

from __future__ import annotations

from typing import Final

TRAFFIC_SUMS: Final = (
    "requests",
    "cold_requests",
    "prompt_tokens",
    "cached_tokens",
    "ttft_ms_sum",
    "ttft_count",
)
"""Requests, those that found nothing cached, prompt and cached tokens, the sum and count of their TTFTs."""
