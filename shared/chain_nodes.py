"""Chain nodes packed for storage: what one ingestion batch adds to one scope's chains, in one value.

`prefix_chains` (migration 0016) holds a row per committed batch and scope, not a row per request: on chat
traffic, where nearly every request adds nodes, a row and three index entries a request were most of
Postgres's cost of a batch (`python -m bench.batch_write_bench`). A row's `nodes` is this packing: for n
nodes, n ids, then n parents, then n cumulative token counts, then n depths, each big-endian (signed 8,
8, 4 and 4 bytes; 24 bytes a node). A root's parent is its own id (no node is its own parent). Nodes come
in the order their batch added them, so a node's parent is earlier in the same value or in an earlier row.
Big-endian so that SQL can read it too (`warmplane_chain_nodes`, for the `prefix_nodes` view).

A row's `leaves` (migration 0017) holds the requests its batch counted at leaves the row adds: per
request, its leaf's id and its time bucket, big-endian int8 each, interleaved (SQL packs it, row by row;
`unpack_leaves` reads it, `warmplane_chain_leaves` in SQL).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

NODE_BYTES = 24
LEAF_BYTES = 16
_DEPTHS = array("i", range(4096))
"""Depths to copy from (`ChainNodes.add_run`); a chain deeper than this converts its own."""


@dataclass(slots=True)
class ChainNodes:
    """Nodes gathered for packing, in the order they are added (parents first)."""

    ids: array[int] = field(default_factory=lambda: array("q"))
    parents: array[int] = field(default_factory=lambda: array("q"))
    tokens: array[int] = field(default_factory=lambda: array("i"))
    depths: array[int] = field(default_factory=lambda: array("i"))

    def add_run(self, anchor: int | None, first_depth: int, ids: list[int], tokens: list[int]) -> None:
        """A run of nodes, each the parent of the next, the first under `anchor` (None: a root), with
        their cumulative `tokens`, the first at depth `first_depth`.

        The fold calls this for nearly every chat request, so each Python int is converted once, by
        `fromlist` (`extend` from a list takes a slower path, item by item): the parents after the first
        are copied from the ids just stored, the depths from a table (`python -m bench.fold_bench`
        measures the fold).
        """
        if not ids:
            return
        held = self.ids
        start = len(held)
        held.fromlist(ids)
        self.parents.append(ids[0] if anchor is None else anchor)
        self.parents += held[start:-1]
        self.tokens.fromlist(tokens)
        end = first_depth + len(ids)
        if end <= len(_DEPTHS):
            self.depths += _DEPTHS[first_depth:end]
        else:
            self.depths.extend(range(first_depth, end))

    def __iter__(self) -> Iterator[tuple[int, int | None, int, int]]:
        """Each node as (id, parent (None at a root), cumulative tokens, depth), in the order added."""
        ids = self.ids
        return zip(ids, map(parent_of, ids, self.parents), self.tokens, self.depths, strict=True)

    def pack(self) -> bytes:
        """The stored value (module doc)."""
        columns = [array(c.typecode, c) for c in (self.ids, self.parents, self.tokens, self.depths)]
        if sys.byteorder == "little":
            for column in columns:
                column.byteswap()
        return b"".join(column.tobytes() for column in columns)


def unpack(value: bytes) -> ChainNodes:
    """The nodes of a stored value; `ValueError` if its length is not a whole number of nodes."""
    count, rest = divmod(len(value), NODE_BYTES)
    if rest:
        raise ValueError(f"a packed chain value of {len(value)} bytes is not whole nodes of {NODE_BYTES}")
    nodes = ChainNodes()
    at = 0
    for column, width in ((nodes.ids, 8), (nodes.parents, 8), (nodes.tokens, 4), (nodes.depths, 4)):
        column.frombytes(value[at : at + width * count])
        at += width * count
        if sys.byteorder == "little":
            column.byteswap()
    return nodes


def pack_leaves(entries: Iterable[tuple[int, int]]) -> bytes:
    """(leaf id, bucket) a request, packed as `warmplane_ingest_events` packs them (for benches and tests:
    the planner's batches leave the packing to SQL)."""
    pairs = array("q", (number for entry in entries for number in entry))
    if sys.byteorder == "little":
        pairs.byteswap()
    return pairs.tobytes()


def unpack_leaves(value: bytes) -> Iterator[tuple[int, int]]:
    """(leaf id, bucket) of each request a stored `leaves` value counts; `ValueError` if its length is not
    a whole number of requests."""
    if len(value) % LEAF_BYTES:
        raise ValueError(f"a packed leaves value of {len(value)} bytes is not whole requests of {LEAF_BYTES}")
    pairs = array("q")
    pairs.frombytes(value)
    if sys.byteorder == "little":
        pairs.byteswap()
    return zip(pairs[0::2], pairs[1::2], strict=True)


def parent_of(prefix: int, stored_parent: int) -> int | None:
    """The parent a stored node names: None at a root (stored as its own id)."""
    return None if stored_parent == prefix else stored_parent


def pack_runs(runs: Iterable[tuple[int | None, int, list[int], list[int]]]) -> bytes:
    """`ChainNodes.add_run` for each (anchor, first depth, ids, tokens), packed."""
    nodes = ChainNodes()
    for anchor, first_depth, ids, tokens in runs:
        nodes.add_run(anchor, first_depth, ids, tokens)
    return nodes.pack()
