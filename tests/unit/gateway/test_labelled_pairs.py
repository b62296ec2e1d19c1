"""Labelled prompt pairs: the shipped set's shape, and a malformed file refused at its line."""

from __future__ import annotations

import re
from collections import Counter
from importlib import resources
from pathlib import Path

import pytest

from warmplane.services.gateway.labelled_pairs import (
    KIND_UNSET,
    LabelledPair,
    MalformedPairs,
    parse_pairs,
    read_pairs,
    shipped_pairs_path,
)

SAME_KINDS = {"paraphrase": True, "surface": True, "near_miss": False, "unrelated": False}


def test_the_shipped_set_is_a_few_hundred_balanced_pairs_of_every_kind() -> None:
    pairs = read_pairs(shipped_pairs_path())
    assert 300 <= len(pairs) <= 400
    kinds = Counter(pair.kind for pair in pairs)
    assert set(kinds) == set(SAME_KINDS)
    assert all(pair.same == SAME_KINDS[pair.kind] for pair in pairs)
    same = sum(pair.same for pair in pairs)
    assert 0.4 <= same / len(pairs) <= 0.6
    assert kinds["near_miss"] >= 100  # the pairs a semantic hit must not join
    assert len({(pair.a, pair.b) for pair in pairs}) == len(pairs)
    assert all(pair.a != pair.b for pair in pairs)


def test_the_shipped_set_states_its_provenance_and_licence() -> None:
    readme = resources.files("warmplane.services.gateway.labelled_pairs").joinpath("README.md").read_text()
    assert "written by hand for Warmplane" in readme
    assert "Apache-2.0" in readme


def test_blank_lines_are_skipped_and_kind_is_optional() -> None:
    lines = [
        '{"a": "x", "b": "y", "same": true, "kind": "surface"}\n',
        "\n",
        '{"a": "x", "b": "z", "same": false}',
    ]
    assert parse_pairs(lines) == [
        LabelledPair("x", "y", True, "surface"),
        LabelledPair("x", "z", False, KIND_UNSET),
    ]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"a": "x", "b": "y", "same": tru}', "Expecting value"),
        ('["x", "y", true]', "not a JSON object"),
        ('{"b": "y", "same": true}', "'a' must be a non-empty string"),
        ('{"a": "x", "b": "  ", "same": true}', "'b' must be a non-empty string"),
        ('{"a": "x", "b": "y", "same": "yes"}', "'same' must be true or false"),
        ('{"a": "x", "b": "y", "same": 1}', "'same' must be true or false"),
        ('{"a": "x", "b": "y", "same": true, "kind": 3}', "'kind', when given"),
    ],
)
def test_a_malformed_line_is_refused_naming_its_number(line: str, reason: str, tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"a": "x", "b": "y", "same": true}\n\n' + line + "\n")
    with pytest.raises(MalformedPairs, match=re.escape(f"pairs.jsonl, line 3: {reason}")):
        read_pairs(path)


def test_a_file_without_pairs_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(MalformedPairs, match=re.escape("empty.jsonl: no pairs")):
        read_pairs(path)
