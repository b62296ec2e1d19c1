"""Labelled prompt pairs: two queries and whether one answer serves both, the input of
`warmplane calibrate-cache`. The project's own set ships here as package data (provenance, licence and
the kinds of pair in this package's README.md), found through `importlib.resources`.

A pairs file is JSON Lines, one object a line: `a` and `b` (non-empty strings), `same` (a boolean) and,
optionally, `kind` (a non-empty string naming the pair's family; `KIND_UNSET` when absent). Blank lines
are skipped; anything else that is not such an object is an error naming its line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Final

SHIPPED: Final = "similarity_pairs.jsonl"
"""The project's labelled set: paraphrases, surface variants, near-misses and unrelated pairs."""
KIND_UNSET: Final = "(none)"
"""The kind of a pair whose line names none."""


@dataclass(frozen=True, slots=True)
class LabelledPair:
    a: str
    b: str
    same: bool
    """True when one answer serves both queries: a semantic hit between them is right."""
    kind: str = KIND_UNSET


class MalformedPairs(ValueError):
    """A pairs file that cannot be read as labelled pairs; the message names the file and line."""


def shipped_pairs_path() -> Path:
    """The project's labelled set, as a real file (setuptools installs package data as plain files)."""
    return Path(str(resources.files(__name__).joinpath(SHIPPED)))


def read_pairs(path: Path) -> list[LabelledPair]:
    """The pairs of the file at `path`. Raises `MalformedPairs` naming the first bad line (or an empty
    file), `OSError` when it cannot be read."""
    with path.open(encoding="utf-8") as lines:
        return parse_pairs(lines, source=str(path))


def parse_pairs(lines: Iterable[str], *, source: str = "pairs") -> list[LabelledPair]:
    """The pairs of `lines` (see the module for the format); `source` names them in errors."""
    pairs: list[LabelledPair] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            pairs.append(_pair(line))
        except ValueError as exc:  # json.JSONDecodeError is one
            raise MalformedPairs(f"{source}, line {number}: {exc}") from None
    if not pairs:
        raise MalformedPairs(f"{source}: no pairs")
    return pairs


def _pair(line: str) -> LabelledPair:
    record = json.loads(line)
    if not isinstance(record, dict):
        raise ValueError("not a JSON object")
    a, b = _text(record, "a"), _text(record, "b")
    same = record.get("same")
    if not isinstance(same, bool):
        raise ValueError("'same' must be true or false")
    kind = record.get("kind", KIND_UNSET)
    if not isinstance(kind, str) or not kind.strip():
        raise ValueError("'kind', when given, must be a non-empty string")
    return LabelledPair(a, b, same, kind)


def _text(record: dict[str, object], field: str) -> str:
    text = record.get(field)
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{field!r} must be a non-empty string")
    return text
