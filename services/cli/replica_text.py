"""A replica as the API answers it, as text: a row of the replicas table, and its residency line."""

from __future__ import annotations

from typing import Any

REPLICA_COLUMNS = (
    "replica",
    "model",
    "node",
    "state",
    "plan",
    "done",
    "items",
    "verified",
    "epoch",
    "requests",
    "hit_rate",
    "reason",
)
"""`requests` and `hit_rate` (cached ÷ prompt tokens, `-` without traffic) are over the API's window."""


def replica_row(replica: dict[str, Any]) -> dict[str, Any]:
    """A replica as the API answers it, flattened into `REPLICA_COLUMNS`."""
    plan = replica.get("latest_plan") or {}
    hits = replica.get("hits") or {}
    return {
        **replica,
        "plan": plan.get("state"),
        "done": plan.get("items_done"),
        "items": plan.get("items"),
        "verified": plan.get("verified_hits"),
        "epoch": plan.get("epoch"),
        "requests": hits.get("requests"),
        "hit_rate": hits.get("prefix_hit_ratio"),
    }


def residency_line(residency: dict[str, Any]) -> str:
    """A replica's `residency` as one line: its counts, then each namespace as `tenant[/prompt_rev]@epoch`
    with its prefixes held (`-` for the empty tenant)."""
    figures = [f"{residency['held']} held"]
    if residency["lost"] is not None:
        figures.append(f"{residency['lost']} lost")
    if not residency["complete"]:
        figures.append("incomplete: more may be held")
    line = f"residency (reported {residency['reported_at']}): {', '.join(figures)}"
    namespaces = [f"{_namespace(n)}: {n['prefixes']}" for n in residency["by_tenant"]]
    return f"{line}; {', '.join(namespaces)}" if namespaces else line


def _namespace(held: dict[str, Any]) -> str:
    revision = f"/{held['prompt_rev']}" if held["prompt_rev"] else ""
    return f"{held['tenant'] or '-'}{revision}@{held['epoch']}"
