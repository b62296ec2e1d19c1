"""The history as a planner's store would hold it at the join: what `planner_view` builds the trie from.

Today's store keeps every chain node a request passed (`admit_after=1`, `store_nodes=None`). The two
variants are issue 19's candidates for chat-scale storage, measured here before either is built:
- a sighting filter (`admit_after=N`): a node is kept once N requests have passed it, and a request is
  counted at its deepest kept node;
- a bounded store (`store_nodes=K`): at most K nodes, the least recently passed evicted first, each
  evicted node's counts rolled up into its parent's. A parent is passed by every request that passes
  its child, and later in the order kept here, so a node always goes after its children: the store stays
  a trie, and a kept node's requests-through count stays whole.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence

from warmplane.services.planner.policy import LeafCount, StoredPrefix
from warmplane.services.planner.trace_eval.fleet_sim import Request


def stored_history(
    history: Sequence[Request], *, bucket_seconds: int, admit_after: int = 1, store_nodes: int | None = None
) -> tuple[list[StoredPrefix], list[LeafCount]]:
    """The prefixes kept (first seen first; least recently passed first when bounded) and the requests
    counted per kept leaf and `bucket_seconds` bucket (each at its bucket's middle), for `history` in
    arrival order."""
    if store_nodes is not None and store_nodes < 1:
        raise ValueError(f"store_nodes bounds the store: at least 1, got {store_nodes}")
    prefixes: OrderedDict[int, StoredPrefix] = OrderedDict()
    counts: dict[int, Counter[int]] = {}
    sightings: Counter[int] = Counter()
    for request in history:
        if admit_after > 1:
            sightings.update(request.chain)
        parent = kept = None
        passed = []
        for block, tokens in zip(request.chain, request.cumulative, strict=True):
            if admit_after > 1 and sightings[block] < admit_after:
                break  # a child is never seen more often than its parent: the rest is not kept either
            prefixes.setdefault(block, StoredPrefix(block, parent, tokens))
            passed.append(block)
            parent = kept = block
        if kept is None:
            continue
        counts.setdefault(kept, Counter())[int(request.t // bucket_seconds)] += 1
        if store_nodes is None:
            continue
        for block in reversed(passed):  # the root last: the most recent, evicted after its children
            prefixes.move_to_end(block)
        while len(prefixes) > store_nodes:
            _, evicted = prefixes.popitem(last=False)
            rolled = counts.pop(evicted.prefix_id, None)
            if rolled and evicted.parent is not None:
                counts.setdefault(evicted.parent, Counter()).update(rolled)
    leaves = [
        LeafCount(leaf, bucket * bucket_seconds + bucket_seconds / 2, n)
        for leaf, buckets in counts.items()
        for bucket, n in buckets.items()
    ]
    return list(prefixes.values()), leaves
