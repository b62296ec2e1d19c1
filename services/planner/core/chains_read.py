"""The chain nodes a plan's read keeps: only those above the leaves it counts, and at most a bound. Pure.

A model's stored chains (`prefix_paths`: a row per run of new nodes, anchored at a node stored before)
hold every node its traffic passed within the detail retention; on chat traffic most of them lie on chains
no counted leaf of the plan's window reaches any more, and their number grows with the traffic rate. So
the read does not hold them all: it streams the path rows newest first (`ChainsNeeded.take`), and keeps
a row's nodes only from the deepest one some counted leaf needs up to its first, whose anchor it then
needs in turn. An anchor is stored before the rows anchored at it, so it is met later in that order; the
few it is not met by (rows sharing a time, a late event's row) are looked up again (`unresolved`).

Where one node stands in several rows (a planner whose node cache forgot it wrote its chain again), the
oldest row's word stands, as the `prefix_nodes` view had it.

`ChainsNeeded.bounded` then keeps the leaves most recently counted whose chains fit in `max_nodes`
together: what the planner holds for a plan is bounded by a setting (`PlanSettings.max_nodes`), not by the
history.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from warmplane.services.planner.policy import StoredPrefix
from warmplane.services.planner.policy.replica_plan import NodeKey


class ChainsNeeded:
    """The nodes on the chains of some leaves, gathered from path rows handed newest first. Held per scope
    as plain ids: a read takes every row a scope holds, and a tuple made per node passed was most of it."""

    def __init__(self, leaves: Iterable[NodeKey]) -> None:
        self._wanted: dict[int, set[int]] = {}
        """Nodes some leaf's chain passes that no row handed so far held, by scope."""
        self._found: dict[int, dict[int, tuple[int | None, int]]] = {}
        """(parent, cumulative tokens) of each node found, by scope."""
        for scope, prefix in leaves:
            self._wanted.setdefault(scope, set()).add(prefix)
            self._found.setdefault(scope, {})

    def take(self, scope: int, anchor: int | None, ids: Sequence[int], tokens: Sequence[int]) -> None:
        """One stored path row: `ids` in chain order under `anchor` (None: `ids[0]` is a root), with their
        cumulative `tokens`. Keeps its nodes from the deepest one needed up to its first."""
        wanted = self._wanted.get(scope)
        if wanted is None:
            return
        found = self._found[scope]
        deepest = len(ids) - 1
        while deepest >= 0 and ids[deepest] not in wanted and ids[deepest] not in found:
            deepest -= 1
        if deepest < 0:
            return
        kept = ids[: deepest + 1]
        found.update(zip(kept, zip([anchor, *kept[:-1]], tokens[: deepest + 1], strict=True), strict=True))
        wanted.difference_update(kept)
        if anchor is not None and anchor not in found:
            wanted.add(anchor)

    def unresolved(self) -> set[NodeKey]:
        """Nodes needed that no row handed so far held: their rows were handed before the need was known
        (hand them again), or are gone (swept, or never stored)."""
        return {(scope, prefix) for scope, prefixes in self._wanted.items() for prefix in prefixes}

    def __len__(self) -> int:
        return sum(map(len, self._found.values()))

    def prefixes(self) -> dict[NodeKey, StoredPrefix]:
        """Every node found."""
        return {
            (scope, prefix): StoredPrefix(prefix, parent, tokens)
            for scope, nodes in self._found.items()
            for prefix, (parent, tokens) in nodes.items()
        }

    def bounded(
        self, leaves_recent_first: Sequence[NodeKey], max_nodes: int | None
    ) -> tuple[list[tuple[int, StoredPrefix]], set[NodeKey]]:
        """The nodes (scope, prefix) on the chains of the leaves taken most recent first while their chains
        hold at most `max_nodes` nodes together (no bound if None), and the leaves taken. A chain whose
        node is missing is taken as far as it is known (the trie build leaves such a leaf out)."""
        if max_nodes is None or len(self) <= max_nodes:  # every node found is on a leaf's chain
            every = [
                (scope, StoredPrefix(prefix, parent, tokens))
                for scope, nodes in self._found.items()
                for prefix, (parent, tokens) in nodes.items()
            ]
            return every, set(leaves_recent_first)
        kept: dict[NodeKey, StoredPrefix] = {}
        taken: set[NodeKey] = set()
        for leaf in leaves_recent_first:
            scope, nodes = leaf[0], self._found[leaf[0]]
            chain: list[StoredPrefix] = []
            prefix: int | None = leaf[1]
            while prefix is not None and (scope, prefix) not in kept and len(chain) <= len(nodes):
                stored = nodes.get(prefix)  # the bound on the walk stops a loop in bad data
                if stored is None:
                    break
                chain.append(StoredPrefix(prefix, *stored))
                prefix = stored[0]
            if len(kept) + len(chain) > max_nodes:
                break
            kept.update(((scope, node.prefix_id), node) for node in chain)
            taken.add(leaf)
        return [(key[0], prefix) for key, prefix in kept.items()], taken
