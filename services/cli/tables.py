"""Rows of dicts as an aligned text table (numbers right-aligned), for people; `--json` is for scripts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def render(rows: Sequence[dict[str, Any]], columns: Sequence[str], *, empty: str = "(none)") -> str:
    if not rows:
        return empty
    cells = [[_text(row.get(column)) for column in columns] for row in rows]
    numeric = [all(_is_number(row.get(column)) for row in rows) for column in columns]
    widths = [max(len(column), *(len(line[i]) for line in cells)) for i, column in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        parts = [
            value.rjust(width) if right else value.ljust(width)
            for value, width, right in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line([c.upper() for c in columns]), *(line(values) for values in cells)])


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)
