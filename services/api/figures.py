"""Figures the API derives from rows: windows, ratios, warm-set coverage, payload previews. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

PREVIEW_CHARS = 160


@dataclass(frozen=True, slots=True)
class Window:
    """The buckets a figure covers: from `since_bucket` on, summed `step_buckets` at a time."""

    since_bucket: int
    step_buckets: int
    bucket_seconds: int

    @property
    def start_s(self) -> int:
        """Unix seconds at which the window's first bucket starts: whole buckets are summed, so a
        window reaches up to one bucket further back than asked."""
        return self.since_bucket * self.bucket_seconds


def window(now_s: float, window_s: int, step_s: int | None, bucket_seconds: int) -> Window:
    """The buckets of the last `window_s` seconds before `now_s`, in steps of `step_s` (whole buckets,
    at least one; None: one step for the whole window)."""
    since = int(now_s - window_s) // bucket_seconds
    step = max(1, (step_s if step_s is not None else window_s) // bucket_seconds)
    return Window(since_bucket=since, step_buckets=step, bucket_seconds=bucket_seconds)


def ratio(part: float, whole: float) -> float | None:
    """`part / whole`, or None when there is nothing to divide (no traffic is not a 0% hit rate)."""
    return part / whole if whole else None


def coverage(
    warm: Iterable[int], parents: Mapping[int, int | None], leaf_requests: Mapping[int, int]
) -> tuple[int, int]:
    """(requests whose chain passes through a warm prefix, all requests) over `leaf_requests`.

    A request is counted at its chain's last element; it is covered when that element or any ancestor
    (by `parents`) is warm, i.e. its leading blocks would have been found in a warmed cache.
    """
    warm_set = set(warm)
    through: dict[int, bool] = {}

    def covered(prefix: int) -> bool:
        path: list[int] = []
        node: int | None = prefix
        answer = False
        while node is not None:
            if node in through:
                answer = through[node]
                break
            if node in warm_set:
                answer = True
                break
            path.append(node)
            node = parents.get(node)
        for seen in path:
            through[seen] = answer
        return answer

    hit = total = 0
    for leaf, count in leaf_requests.items():
        total += count
        if covered(leaf):
            hit += count
    return hit, total


def preview(payload: Any, chars: int = PREVIEW_CHARS) -> str:
    """The start of a catalogued payload as text: chat messages as `role: content` lines, a text prompt
    as it is, a token prompt as its first ids."""
    if not isinstance(payload, dict):
        return ""
    messages = payload.get("messages")
    if isinstance(messages, list):
        lines = []
        for message in messages:
            if isinstance(message, dict):
                content = message.get("content")
                text = content if isinstance(content, str) else str(content)
                lines.append(f"{message.get('role', '?')}: {text}")
        text = "\n".join(lines)
    else:
        prompt = payload.get("prompt")
        text = prompt if isinstance(prompt, str) else f"tokens {prompt}"
    return text if len(text) <= chars else text[: chars - 1] + "…"
