"""Bringing a kept trie up to date with batches committed after its read, instead of reading again. Pure.

A plan's trie is built from the counts read from Postgres (`policy.trie_from_counts`). The batches this
planner commits afterwards hold exactly what the next read would add: each request counted once at its leaf
in its time bucket, the new ends of chains, the payloads catalogued. `absorb` observes those into the kept
trie (and the faster trie it is blended with), stamped at their buckets' middles as a read would, so the
trie holds what reading again would give, up to where a count is stamped in the current bucket (a read
clamps a bucket's middle to its `now`; so does this, to the `now` it absorbs at).

A batch's count that cannot be placed leaves the trie untouched and returns False, and the caller reads
again: a request in a scope the read did not see (a new tenant or prompt revision), or a leaf that is
neither in the trie nor on a chain the batches add (a node stored before the read whose counts lay outside
its window), or a new chain whose root has no tokens.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from warmplane.services.planner.core.ingest_batch import IngestBatch, Scope, ScopedPrefix
from warmplane.services.planner.policy import PrefixTrie
from warmplane.shared.chain_nodes import ChainNodes


@dataclass(frozen=True, slots=True)
class CommittedCounts:
    """What one committed batch adds to the counts a plan reads: its requests summed per (scope, leaf,
    time bucket), as Postgres sums them; its new chain ends; the prefixes it catalogued."""

    requests: Counter[tuple[Scope, int, int]]
    chains: Mapping[Scope, ChainNodes]
    catalogued: Collection[ScopedPrefix]

    @classmethod
    def of(cls, batch: IngestBatch, bucket_seconds: int) -> CommittedCounts:
        """`batch`'s counts, summed in C (a batch repeats its keys: held summed, they cost a key, not a
        request, to keep and to absorb)."""
        columns = batch.requests
        buckets = [int(seconds) // bucket_seconds for seconds in columns.seconds]
        summed = Counter(zip(columns.scopes, columns.leaves, buckets, strict=True))
        return cls(summed, batch.chains, batch.catalog.keys())


def absorb(
    trie: PrefixTrie,
    scope_of: dict[int, int],
    renderable: set[int],
    batches: Iterable[CommittedCounts],
    *,
    scope_ids: Mapping[Scope, int],
    model: str,
    tenant: str | None,
    bucket_seconds: int,
    now: float,
) -> bool:
    """Observe the requests `batches` counted for `model` (of `tenant` only, if given) into `trie`, add
    their new prefixes to `scope_of` (prefix → scope id) and those catalogued to `renderable`; False, with
    nothing changed, when one cannot be placed (module doc). `scope_ids` maps the read's scopes to their
    ids; a count is stamped at its bucket's middle, or at `now` if that is later."""
    added = _Added(scope_ids, model, tenant)
    for batch in batches:
        if not added.take(batch, bucket_seconds, now):
            return False
    tokens = _cumulative_tokens(trie, added.parents, added.stated, {leaf for leaf, _ in added.counts})
    if tokens is None:
        return False
    by_time: defaultdict[float, list[tuple[int, float]]] = defaultdict(list)
    for (leaf, at), requests in added.counts.items():
        by_time[at].append((leaf, float(requests)))
    tries = [trie] if trie.blended is None else [trie, trie.blended]
    for at in sorted(by_time):
        for each in tries:
            each.observe_leaves(by_time[at], added.parents, tokens, at)
    for prefix in tokens:
        scope_of.setdefault(prefix, added.scope_of[prefix])
    renderable.update(prefix for scope_id, prefix in added.catalogued if scope_of.get(prefix) == scope_id)
    return True


class _Added:
    """What batches add to one model's (or one tenant's) counts, gathered before anything changes."""

    def __init__(self, scope_ids: Mapping[Scope, int], model: str, tenant: str | None) -> None:
        self._scope_ids = scope_ids
        self._model = model
        self._tenant = tenant
        self.parents: dict[int, int | None] = {}
        self.stated: dict[int, int] = {}
        """Each new prefix's tokens as its chain states them (`ChainNodes.tokens`)."""
        self.scope_of: dict[int, int] = {}
        self.counts: Counter[tuple[int, float]] = Counter()
        """Requests per (leaf, time stamped)."""
        self.catalogued: list[tuple[int, int]] = []

    def _ours(self, scope: Scope) -> bool:
        return scope[1] == self._model and (self._tenant is None or scope[0] == self._tenant)

    def take(self, batch: CommittedCounts, bucket_seconds: int, now: float) -> bool:
        """Gather `batch`; False if it counts in a scope of ours the read did not see."""
        scope_ids = self._scope_ids
        for scope, nodes in batch.chains.items():
            if not self._ours(scope):
                continue
            scope_id = scope_ids.get(scope)
            if scope_id is None:
                return False
            for prefix, parent, tokens, _depth in nodes:
                if prefix not in self.parents:
                    self.parents[prefix], self.stated[prefix] = parent, tokens
                    self.scope_of[prefix] = scope_id
        half = bucket_seconds / 2
        for (scope, leaf, bucket), requests in batch.requests.items():
            if not self._ours(scope):
                continue
            if scope not in scope_ids:
                return False
            self.counts[(leaf, min(now, bucket * bucket_seconds + half))] += requests
        self.catalogued.extend(
            (scope_ids[scope], prefix)
            for scope, prefix in batch.catalogued
            if self._ours(scope) and scope in scope_ids
        )
        return True


def _cumulative_tokens(
    trie: PrefixTrie, parents: Mapping[int, int | None], stated: Mapping[int, int], leaves: Iterable[int]
) -> dict[int, int] | None:
    """The cumulative tokens of each new prefix above `leaves` as `policy.trie_from_counts` resolves them
    (at least its parent's), or None when a leaf's chain does not reach the trie or a root with tokens."""
    tokens: dict[int, int] = {}
    for leaf in leaves:
        path: list[int] = []
        prefix: int | None = leaf
        while prefix is not None and prefix not in trie and prefix not in tokens:
            if prefix not in parents or len(path) > len(parents):  # unknown, or a loop
                return None
            path.append(prefix)
            prefix = parents[prefix]
        above: int | None = None
        if prefix is not None:
            node = trie.node(prefix)
            above = node.tokens if node is not None else tokens[prefix]
        for step in reversed(path):
            if above is None and stated[step] <= 0:
                return None
            above = tokens[step] = stated[step] if above is None else max(above, stated[step])
    return tokens
