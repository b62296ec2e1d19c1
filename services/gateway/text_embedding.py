"""Turning a query into a vector the semantic tier compares by cosine similarity. Pure.

`Embedder` is the seam: any model that maps text to a fixed-length vector can serve the tier. The one
built in, `NgramEmbedder`, needs no model and no network: it hashes the character trigrams of the
normalised text (lower case, punctuation dropped, whitespace collapsed) into `dimensions` signed
buckets and scales the result to unit length. It matches queries that differ in case, punctuation,
spacing and small edits ("What is the capital of France?" and "what's the capital of france"), not
paraphrases with other words: that needs a learned embedding model behind the same protocol.
"""

from __future__ import annotations

import math
import re
import zlib
from collections import Counter
from typing import Protocol

_PUNCTUATION = re.compile(r"[^\w\s]+")
_SPACE = re.compile(r"\s+")


class Embedder(Protocol):
    @property
    def name(self) -> str:
        """Names the vector space: vectors are only ever compared with vectors of the same name."""
        ...

    async def embed(self, text: str) -> list[float]:
        """A unit-length vector for `text` (all zeros for text with nothing to compare). A learned model
        runs off the event loop; raises what its transport raises (the cache counts it and misses)."""
        ...


class NgramEmbedder:
    """Feature-hashed character trigrams, unit length. Each distinct trigram's signed bucket is
    remembered (at most `memory` of them), so repeated vocabulary costs a dictionary lookup."""

    def __init__(self, dimensions: int = 256, *, memory: int = 65_536) -> None:
        if dimensions < 8:
            raise ValueError("an n-gram embedding needs at least 8 dimensions")
        self._dimensions = dimensions
        self._memory = memory
        self._buckets: dict[str, tuple[int, float]] = {}

    @property
    def name(self) -> str:
        return f"ngram3-{self._dimensions}"

    async def embed(self, text: str) -> list[float]:
        return self.vector(text)

    def vector(self, text: str) -> list[float]:
        """`embed`, synchronously: the trigrams cost microseconds, so they run on the caller's loop."""
        normal = " " + _SPACE.sub(" ", _PUNCTUATION.sub("", text.lower())).strip() + " "
        vector = [0.0] * self._dimensions
        for gram, count in Counter(map("".join, zip(normal, normal[1:], normal[2:], strict=False))).items():
            bucket, sign = self._bucket(gram)
            vector[bucket] += sign * count
        norm = math.sqrt(sum(value * value for value in vector))
        return [value / norm for value in vector] if norm else vector

    def _bucket(self, gram: str) -> tuple[int, float]:
        known = self._buckets.get(gram)
        if known is None:
            if len(self._buckets) >= self._memory:
                self._buckets.clear()
            digest = zlib.crc32(gram.encode())
            known = self._buckets[gram] = (digest % self._dimensions, 1.0 if digest & 0x8000_0000 else -1.0)
        return known


def cosine(a: list[float], b: list[float]) -> float:
    """The cosine similarity of two unit-length vectors (their dot product)."""
    return sum(x * y for x, y in zip(a, b, strict=True))
