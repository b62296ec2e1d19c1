"""Reading the chains of given leaves from `prefix_paths`, without reading every chain the retention keeps.

Ingestion stores a chain as path rows: each holds the new end of a request's chain (`ids`, cumulative
`tokens`) below `anchor_id`, the deepest prefix known before it (migration 0001). A plan needs the chains
of the leaves counted in its window (24 h); the table keeps 31 days of them, on chat traffic about a row
a request. So the walk goes up from the leaves, a level of rows at a time:

- the row whose leaf a prefix is, by the primary key (a turn's leaf, and most anchors: the next turn
  hangs below it);
- else a row holding the prefix inside its `ids`: a conversation opening below a shared system prompt
  anchors inside the row of the first one that carried it, and a counted leaf can sit inside a longer
  chain's row. No index answers that (a GIN index on `ids` made path inserts four times as long:
  `python -m bench.paths_index_bench`), so such prefixes are put aside while the primary key finds the
  rest, then looked up together, in one scan of their scopes' rows a round.

Prefix ids are chained hashes, so every row holding a prefix agrees on what lies above it. A leaf no row
holds (its chain swept, or never written) is absent, and the trie leaves it out as before.
"""

from __future__ import annotations

from collections.abc import Iterable

import asyncpg

from warmplane.services.planner.policy import StoredPrefix

Key = tuple[int, int]
"""(scope id, prefix id)."""
Row = tuple[int | None, list[int], list[int]]
"""A path row's anchor, ids and cumulative tokens."""

ROWS_BY_LEAF = """
SELECT p.scope_id, p.leaf_id, p.anchor_id, p.ids, p.tokens FROM prefix_paths p
JOIN unnest($1::integer[], $2::bigint[]) AS k(scope_id, leaf_id) USING (scope_id, leaf_id)
"""
ROWS_HOLDING = """
SELECT scope_id, anchor_id, ids, tokens FROM prefix_paths
WHERE scope_id = ANY($1::integer[]) AND ids && $2::bigint[]
ORDER BY first_seen
"""
ROWS_HOLDING_MANY = """
SELECT p.scope_id, p.anchor_id, p.ids, p.tokens FROM prefix_paths p
CROSS JOIN LATERAL unnest(p.ids) AS u(prefix_id)
JOIN unnest($1::integer[], $2::bigint[]) AS k(scope_id, prefix_id)
  ON k.scope_id = p.scope_id AND k.prefix_id = u.prefix_id
WHERE p.scope_id = ANY($1::integer[])
ORDER BY p.first_seen
"""
FEW = 64
"""Up to this many prefixes are looked up with `&&`, which compares each of a row's ids with each of
them; more are hashed once and each row's ids probed (`ROWS_HOLDING_MANY`: a row holding several comes
once for each), a cost that a few do not repay."""


async def chain_nodes(
    connection: asyncpg.Connection, leaves: Iterable[Key]
) -> list[tuple[int, StoredPrefix]]:
    """Every prefix on the chains of `leaves`, with its parent and cumulative tokens, once each."""
    found: dict[Key, StoredPrefix] = {}
    frontier = set(leaves)
    inside: set[Key] = set()
    while frontier or inside:
        if frontier:
            rows = await connection.fetch(ROWS_BY_LEAF, *_columns(frontier))
            inside |= frontier.difference((scope, leaf) for scope, leaf, *_ in rows)
            anchors = [
                _take(found, scope, (anchor, ids, tokens), len(ids)) for scope, _, anchor, ids, tokens in rows
            ]
        else:
            query = ROWS_HOLDING if len(inside) <= FEW else ROWS_HOLDING_MANY
            rows = await connection.fetch(query, *_columns(inside))
            wanted, anchors = inside, []
            for scope, anchor, ids, tokens in rows:
                for position, prefix in enumerate(ids):
                    if (scope, prefix) in wanted and (scope, prefix) not in found:
                        anchors.append(_take(found, scope, (anchor, ids, tokens), position + 1))
            inside = set()  # what no row holds is dropped
        frontier = {key for key in anchors if key is not None and key not in found}
    return [(scope, prefix) for (scope, _), prefix in found.items()]


def _take(found: dict[Key, StoredPrefix], scope: int, row: Row, end: int) -> Key | None:
    """Add the row's first `end` prefixes to `found`; the key to walk on from (its anchor), if any."""
    anchor, ids, tokens = row
    parent = anchor
    for prefix, total in zip(ids[:end], tokens[:end], strict=True):
        found.setdefault((scope, prefix), StoredPrefix(prefix, parent, total))
        parent = prefix
    return None if anchor is None else (scope, anchor)


def _columns(keys: set[Key]) -> tuple[list[int], list[int]]:
    ordered = sorted(keys)
    return [scope for scope, _ in ordered], [prefix for _, prefix in ordered]
