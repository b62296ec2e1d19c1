"""The chain nodes a plan's read keeps: only those above the leaves it counts, and at most a bound. Pure.

A model's stored chains (`prefix_chains`: a row per committed batch and scope, its new nodes packed by
`shared/chain_nodes.py`) hold every node its traffic passed within the detail retention; on chat traffic
most of them lie on chains no counted leaf of the plan's window reaches any more, and their number grows
with the traffic rate. So the read does not hold them all: it streams the rows newest first
(`ChainsNeeded.take`), keeps each node some counted leaf's chain reaches, and then needs its parent. A
parent is stored in its child's row or in an older one (a batch anchors its new nodes only at nodes that
committed before it), so it is met later in that order; one never met (its row swept) ends the chain
there (`unresolved`).

Where one node is stored twice (a planner whose node cache forgot it wrote its chain again), the oldest
row's word stands, as the `prefix_nodes` view has it.

`ChainsNeeded.bounded` then keeps the leaves most recently counted whose chains fit in `max_nodes`
together: what the planner holds for a plan is bounded by a setting (`PlanSettings.max_nodes`), not by the
history.

The counts themselves are kept in two places (migration 0017): `prefix_stats` sums the requests at leaves
stored before their batch, and a chain row's `leaves` lists the requests at leaves that row adds (chat: a
turn's new leaf). `LeafCounts` adds the two: the first read whole, the second met row by row as the chains
stream, each such leaf wanted before its own row is taken (it is a node of that row).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from warmplane.services.planner.policy import StoredPrefix
from warmplane.services.planner.policy.replica_plan import NodeKey
from warmplane.shared.chain_nodes import ChainNodes, parent_of


class ChainsNeeded:
    """The nodes on the chains of some leaves, gathered from chain rows handed newest first. Held per scope
    as plain ids: a read takes every row a scope holds, and a tuple made per node passed was most of it."""

    def __init__(self, leaves: Iterable[NodeKey]) -> None:
        self._wanted: dict[int, set[int]] = {}
        """Nodes some leaf's chain passes that no row handed so far held, by scope."""
        self._found: dict[int, dict[int, tuple[int | None, int]]] = {}
        """(parent, cumulative tokens) of each node found, by scope."""
        for scope, prefix in leaves:
            self._wanted.setdefault(scope, set()).add(prefix)
            self._found.setdefault(scope, {})

    def want(self, scope: int, leaves: Iterable[int]) -> None:
        """Need the chains of `leaves` too: leaves counted in the row about to be taken (they are its nodes,
        and their ancestors are in it or in older rows)."""
        found = self._found.setdefault(scope, {})
        self._wanted.setdefault(scope, set()).update(leaf for leaf in leaves if leaf not in found)

    def needs(self, scope: int) -> bool:
        """Whether some leaf of `scope` was wanted: rows of other scopes need not be unpacked."""
        return scope in self._wanted

    def take(self, scope: int, nodes: ChainNodes) -> None:
        """One stored row of `scope`'s chains (`shared/chain_nodes.py`): keeps each node some counted leaf's
        chain reaches, and then needs its parent. Its nodes are taken last first, so a parent added by the
        same batch is met after its children."""
        wanted = self._wanted.get(scope)
        if wanted is None:
            return
        found = self._found[scope]
        ids, parents, tokens = nodes.ids, nodes.parents, nodes.tokens
        for at in range(len(ids) - 1, -1, -1):
            prefix = ids[at]
            if prefix in wanted or prefix in found:
                parent = parent_of(prefix, parents[at])
                found[prefix] = (parent, tokens[at])
                wanted.discard(prefix)
                if parent is not None and parent not in found:
                    wanted.add(parent)

    def unresolved(self) -> set[NodeKey]:
        """Nodes needed that no row handed so far held: once every row was handed, their rows are gone
        (swept) or were never stored, and the chains through them end there."""
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


class LeafCounts:
    """A plan's requests per (scope, leaf, bucket) from `since_bucket` on, added from both places they are
    kept (module doc): `stored`, the `prefix_stats` rows read first (their SQL already bounds them to the
    most recently counted leaves), then each chain row's counted leaves as the rows stream newest first
    (`take`). Of leaves met only in rows, at most `max_leaves` (None: all) are kept: the newest rows'."""

    def __init__(
        self, stored: Iterable[tuple[int, int, int, int]], since_bucket: int, max_leaves: int | None
    ) -> None:
        self._since = since_bucket
        self._room = max_leaves
        self._by_leaf: dict[NodeKey, dict[int, int]] = {}
        for scope, leaf, bucket, requests in stored:
            buckets = self._by_leaf.setdefault((scope, leaf), {})
            buckets[bucket] = buckets.get(bucket, 0) + requests

    def __iter__(self) -> Iterator[NodeKey]:
        """The leaves counted so far, in no order (`leaves` sorts them)."""
        return iter(self._by_leaf)

    def take(self, scope: int, entries: Iterable[tuple[int, int]]) -> list[int]:
        """Count a row's (leaf, bucket) entries, one a request; the leaves met here first, in order."""
        by_leaf, since, new = self._by_leaf, self._since, []
        for leaf, bucket in entries:
            if bucket < since:
                continue
            buckets = by_leaf.get((scope, leaf))
            if buckets is None:
                if self._room is not None:
                    if self._room == 0:
                        continue
                    self._room -= 1
                buckets = by_leaf[(scope, leaf)] = {}
                new.append(leaf)
            buckets[bucket] = buckets.get(bucket, 0) + 1
        return new

    def leaves(self) -> list[NodeKey]:
        """Every leaf counted, most recently counted first: by its latest bucket, then by its requests,
        then by (scope, leaf), as the SQL of the stored counts orders them."""
        return sorted(
            self._by_leaf,
            key=lambda key: (-max(self._by_leaf[key]), -sum(self._by_leaf[key].values()), key),
        )

    def counts(self, leaves: Sequence[NodeKey]) -> list[tuple[int, int, int, int]]:
        """(scope, leaf, bucket, requests) of `leaves`, in their order, each leaf's buckets in order."""
        by_leaf = self._by_leaf
        return [
            (scope, leaf, bucket, requests)
            for scope, leaf in leaves
            for bucket, requests in sorted(by_leaf[(scope, leaf)].items())
        ]
