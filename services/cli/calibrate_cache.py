"""`warmplane calibrate-cache [PAIRS] [--target-precision 0.95]`: the result cache's semantic threshold,
chosen on labelled prompt pairs. Embeds both queries of every pair with the embedder the gateway's settings
choose (`WARMPLANE_RESULT_CACHE__EMBEDDER`, opened as the gateway opens it), takes the lowest similarity at
which precision reaches the target (`similarity_calibration.py`), and prints precision and recall there, a
row per kind of pair (how many near-misses would be served a wrong answer), and the setting's line.

Exit codes: 0 a threshold was found; 1 no threshold reaches the target on these pairs; 2 a malformed pairs
file, a bad target, or an embedder that cannot start (a missing model).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from warmplane.services.cli.tables import render
from warmplane.services.gateway.embedders import open_embedder
from warmplane.services.gateway.labelled_pairs import LabelledPair, read_pairs
from warmplane.services.gateway.result_keys import query_literals
from warmplane.services.gateway.settings import ResultCacheSettings
from warmplane.services.gateway.similarity_calibration import Calibration, ScoredPair, by_kind, calibrate
from warmplane.services.gateway.text_embedding import Embedder, cosine

SETTING = "WARMPLANE_RESULT_CACHE__SIMILARITY"
SIMILARITY_DIGITS = 6
"""Similarities are rounded to this many decimals: pgvector keeps vectors in single precision, so later
digits differ between here and the cache, and rounding makes the float noise of equal texts (1 ± 4e-16)
one tie at 1.0."""


@dataclass(frozen=True, slots=True)
class Scored:
    """The pairs' similarities in the vector space `space`."""

    space: str
    pairs: list[ScoredPair]


async def calibrate_cache(path: Path, target: float, settings: ResultCacheSettings, out: TextIO) -> int:
    """Read, embed, calibrate and report on `out` (see the module's exit codes). Raises
    `labelled_pairs.MalformedPairs` for a bad file, `ValueError` for a target outside (0, 1], what
    `embedders.open_embedder` raises when the embedder cannot start."""
    if not 0 < target <= 1:
        raise ValueError(f"--target-precision must be in (0, 1], not {target}")
    pairs = read_pairs(path)
    async with AsyncExitStack() as stack:
        scored = await score_pairs(pairs, await open_embedder(settings, stack))
    calibration = calibrate(scored.pairs, target)
    out.write(f"{len(pairs)} labelled pairs ({path.name}), embedder {scored.space}\n")
    if calibration is None:
        out.write(f"no similarity threshold keeps precision at or above {target} on these pairs\n")
        return 1
    out.write(report(calibration, scored.pairs) + "\n")
    return 0


NEVER_COMPARED = -1.0
"""The similarity of a pair the cache never compares: below every threshold."""


async def score_pairs(pairs: Sequence[LabelledPair], embedder: Embedder) -> Scored:
    """Each pair's cosine similarity under `embedder` (to `SIMILARITY_DIGITS`), or `NEVER_COMPARED` for
    queries whose numbers or negation differ, as the cache never compares those (`query_literals`); every
    distinct query is embedded once, all of them at once, so a batching embedder gets full batches."""
    texts = sorted({pair.a for pair in pairs} | {pair.b for pair in pairs})
    vectors = dict(zip(texts, await asyncio.gather(*map(embedder.embed, texts)), strict=True))
    return Scored(
        embedder.name,
        [
            ScoredPair(
                round(cosine(vectors[pair.a], vectors[pair.b]), SIMILARITY_DIGITS)
                if query_literals(pair.a) == query_literals(pair.b)
                else NEVER_COMPARED,
                pair.same,
                pair.kind,
            )
            for pair in pairs
        ],
    )


def report(calibration: Calibration, scored: Sequence[ScoredPair]) -> str:
    """The threshold, precision and recall, a row per kind, and the setting's line, for people."""
    counts = calibration.counts
    matched = counts.true_matches + counts.false_matches
    same = counts.true_matches + counts.missed
    rows = [
        {
            "kind": row.kind,
            "pairs": row.pairs,
            "same answer": row.same,
            "matched": row.true_matches,
            "missed": row.missed,
            "wrongly matched": row.false_matches,
        }
        for row in by_kind(scored, calibration.threshold)
    ]
    lines = [
        f"threshold  {calibration.threshold:.4f}  lowest similarity with precision >= {calibration.target}",
        f"precision  {counts.precision:.3f}   {counts.true_matches} of {matched} matches share an answer",
        f"recall     {counts.recall:.3f}   {counts.true_matches} of {same} same-answer pairs matched",
        "",
        render(rows, list(rows[0])),
        "",
    ]
    if 0 < calibration.setting <= 1:
        lines.append(f"{SETTING}={calibration.setting}")
    else:  # the setting must be in (0, 1]: a threshold at or below 0 matches every query anyway
        lines.append(f"{SETTING} cannot be set to {calibration.setting}: it must be in (0, 1]")
    return "\n".join(lines)
