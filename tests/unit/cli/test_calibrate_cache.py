"""`warmplane calibrate-cache` on the shipped pairs with the trigram embedder: the threshold it prints keeps
precision at the target, counted again here from the pairs themselves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from warmplane.services.cli.main import main
from warmplane.services.gateway.labelled_pairs import read_pairs, shipped_pairs_path
from warmplane.services.gateway.result_keys import query_literals
from warmplane.services.gateway.settings import ResultCacheSettings
from warmplane.services.gateway.text_embedding import NgramEmbedder


@pytest.fixture(autouse=True)
def trigram_embedder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARMPLANE_RESULT_CACHE__EMBEDDER", "ngram")


def _printed(pattern: str, text: str) -> str:
    found = re.search(pattern, text, re.MULTILINE)
    assert found is not None, f"{pattern!r} not in:\n{text}"
    return found.group(1)


@pytest.mark.parametrize("target", [0.95, 0.9])
def test_the_printed_setting_keeps_precision_at_the_target_on_the_shipped_set(
    target: float, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["calibrate-cache", "--target-precision", str(target)]) == 0
    out = capsys.readouterr().out
    setting = float(_printed(r"^WARMPLANE_RESULT_CACHE__SIMILARITY=(\S+)$", out))
    embedder = NgramEmbedder(ResultCacheSettings().embedding_dimensions)
    matched = []
    for pair in read_pairs(shipped_pairs_path()):
        a, b = embedder.vector(pair.a), embedder.vector(pair.b)
        compared = query_literals(pair.a) == query_literals(pair.b)  # as the cache compares them
        if compared and sum(x * y for x, y in zip(a, b, strict=True)) >= setting:
            matched.append(pair)
    right = sum(pair.same for pair in matched)
    assert matched and right / len(matched) >= target
    assert float(_printed(r"^precision\s+(\S+)", out)) == pytest.approx(right / len(matched), abs=5e-4)
    assert re.search(r"^near_miss\s+\d+", out, re.MULTILINE)


def test_a_malformed_pairs_file_exits_2_naming_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text('{"a": "x", "b": "y", "same": true}\n{"a": "x", "same": true}\n')
    assert main(["calibrate-cache", str(path)]) == 2
    assert "mine.jsonl, line 2: 'b' must be a non-empty string" in capsys.readouterr().err


def test_a_target_no_threshold_reaches_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "hard.jsonl"
    # Punctuation is dropped before the trigrams: the two queries embed alike, and share no answer.
    path.write_text(
        '{"a": "Solve 2x + 6 = 14.", "b": "Solve 2x - 6 = 14.", "same": false}\n'
        '{"a": "Who wrote Hamlet?", "b": "Which city is France\'s capital?", "same": true}\n'
    )
    assert main(["calibrate-cache", str(path), "--target-precision", "0.6"]) == 1
    assert "no similarity threshold keeps precision at or above 0.6" in capsys.readouterr().out


@pytest.mark.parametrize("target", ["0", "1.5"])
def test_a_target_outside_0_to_1_exits_2(target: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate-cache", "--target-precision", target]) == 2
    assert "--target-precision must be in (0, 1]" in capsys.readouterr().err
