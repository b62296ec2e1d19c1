"""One replica's warm set from stored statistics: the trie of a model's counts, decayed to `now`, and the
selection for the replica's share of the ring over the model's live replicas. Pure: no I/O, no clock.

The planner stores request counts per leaf prefix and time bucket, and each prefix's parent and cumulative
tokens. Decay is exponential, so a leaf's buckets fold into one weight at `now` (the sum of each bucket's
count decayed from the bucket's middle), observed once through the leaf's chain: the trie holds exactly what
observing every request would have given, up to the bucket width. The trace evaluator feeds its history
through the same two functions, so what it measures is what the planner issues.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Collection, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass

from warmplane.services.planner.policy.budget import WarmBudget
from warmplane.services.planner.policy.calibration import ReuseCalibration, fit_isotonic, reused_prefixes
from warmplane.services.planner.policy.prefix_trie import PrefixTrie
from warmplane.services.planner.policy.warm_set import ChosenPrefix, select_warm_sets
from warmplane.shared.hash_ring import DEFAULT_LOAD_FACTOR, DEFAULT_VNODES, HashRing

NodeKey = tuple[int, int]
"""(scope id, prefix id): a stored prefix's key (prefix ids are namespaced by scope)."""


@dataclass(frozen=True, slots=True)
class StoredPrefix:
    """A prefix as stored: its parent (None at a root) and its cumulative tokens."""

    prefix_id: int
    parent: int | None
    tokens: int


@dataclass(frozen=True, slots=True)
class LeafCount:
    """`requests` that ended at `leaf` in the bucket whose middle is `at_s` (seconds)."""

    leaf: int
    at_s: float
    requests: int


SPREAD_DEPTH = sys.maxsize
"""A routing depth no chain reaches: every prefix lies above it, in every replica's share."""


@dataclass(frozen=True, slots=True)
class RingSpec:
    """How the gateway builds its ring and keys requests (its `WARMPLANE_ROUTING__*`): the planner must
    use the same values, or it warms prefixes that are routed elsewhere."""

    depth: int = 0
    vnodes: int = DEFAULT_VNODES
    load_factor: float = DEFAULT_LOAD_FACTOR
    spread: bool = False
    """The router is not this ring (round robin, least load, or a prefix hash of its own the planner cannot
    reproduce): each replica is planned for its weight share of every prefix's traffic, as if requests
    reached it at random, so replicas of a model get alike plans of the fleet's most reused prefixes."""

    @property
    def share_depth(self) -> int:
        """The routing depth a replica's share is taken at: spread, past every chain (all prefixes shared)."""
        return SPREAD_DEPTH if self.spread else self.depth


@dataclass(frozen=True, slots=True)
class PolicyKnobs:
    """The selection's tuning: see `select_warm_set`; the two half-lives are `trie_from_counts`'s. The
    defaults are the planner's and the trace evaluator's (`PlanSettings`, `EvalParams`)."""

    half_life_s: float = 60.0
    frequency_half_life_s: float | None = 600.0
    ramp_window_s: float = 300.0
    min_reuse_probability: float = 0.05
    capacity_fraction: float = 0.5
    min_expected_saved_tokens: int = 256
    """`decide_warm`'s floor: a plan expected to save less prefill than this is issued empty."""


WEIGHT_HALVINGS = 12
"""A count older than this many of the longest half-life weighs under 2 ** -12 of a fresh one: a plan's read
need not reach further back (`weight_horizon_s`)."""


def weight_horizon_s(half_life_s: float, frequency_half_life_s: float | None) -> float:
    """How far back counts still weigh: `WEIGHT_HALVINGS` of the longest half-life (2 hours at the
    planner's 600 s). A read of older buckets changes no rate by more than 2 ** -12 of what they held."""
    return WEIGHT_HALVINGS * max(half_life_s, frequency_half_life_s or 0.0)


def trie_from_counts(
    prefixes: Iterable[StoredPrefix],
    counts: Iterable[LeafCount],
    now: float,
    half_life_s: float,
    frequency_half_life_s: float | None = None,
) -> tuple[PrefixTrie, int]:
    """The trie of `counts` at `now`, and how many leaves were left out.

    With `frequency_half_life_s` (longer than `half_life_s`), the trie counts at that half-life and is
    blended with one counting at `half_life_s` (`PrefixTrie.blend`): its rates are the mean of a frequency
    and a recency estimate. A leaf's chain is walked up `prefixes` to its root. A prefix counts at least
    its parent's cumulative tokens: stored token counts are per-request estimates (the gateway scales its
    estimate to each request's own prompt count), so two requests through one prefix may record it a few
    tokens apart, and a chain assembled from both may dip. A leaf that is unknown, whose chain loops or
    whose root has no tokens (data being retired, or corrupt) is left out and counted; nothing else is lost
    (a count decayed to nothing is simply gone). Counts stamped after
    `now` count as at `now`. Raises `ValueError` for a half-life that is not positive, or a frequency
    half-life not longer than `half_life_s`.
    """
    by_id = {prefix.prefix_id: prefix for prefix in prefixes}
    counts = [count for count in counts if count.requests > 0]
    forest = _Forest(by_id, {count.leaf for count in counts})  # once for both tries
    if frequency_half_life_s is None:
        return _decayed_trie(forest, counts, now, half_life_s)
    trie, left_out = _decayed_trie(forest, counts, now, frequency_half_life_s)
    trie.blend(_decayed_trie(forest, counts, now, half_life_s)[0])
    return trie, left_out


def fit_calibration(
    prefixes: Sequence[StoredPrefix], counts: Sequence[LeafCount], now: float, knobs: PolicyKnobs
) -> ReuseCalibration:
    """The map from score to observed reuse on this history (`calibration.py`): every prefix scored on
    the counts up to `now - knobs.ramp_window_s` (the trie as `trie_from_counts` built it then), each
    marked reused if a count after that ends on its chain, fitted by isotonic regression; the prior when
    too few prefixes were scored."""
    start = now - knobs.ramp_window_s
    past = [count for count in counts if count.at_s < start]
    recent = {count.leaf for count in counts if count.at_s >= start and count.requests > 0}
    trie, _ = trie_from_counts(prefixes, past, start, knobs.half_life_s, knobs.frequency_half_life_s)
    reused = reused_prefixes({prefix.prefix_id: prefix.parent for prefix in prefixes}, recent)
    return fit_isotonic(
        (trie.rate(node.prefix_id, start) * knobs.ramp_window_s, node.prefix_id in reused)
        for node in trie.nodes()
    )


def _decayed_trie(
    forest: _Forest, counts: Sequence[LeafCount], now: float, half_life_s: float
) -> tuple[PrefixTrie, int]:
    """The trie of `counts` (each with requests) at `now`, and how many leaves were left out (their
    chains are not in `forest`, or a weight is not finite). Leaves are observed heaviest first."""
    trie = PrefixTrie(half_life_s)
    weights: dict[int, float] = {}
    decays: dict[float, float] = {}  # counts share their buckets' times: one factor a time, not a count
    for count in counts:
        at = count.at_s
        decay = decays.get(at)
        if decay is None:
            decay = decays[at] = trie.decay_factor(max(0.0, now - at))
        weights[count.leaf] = weights.get(count.leaf, 0.0) + count.requests * decay
    left_out = 0
    observed: list[tuple[int, float]] = []
    for leaf in sorted(weights, key=lambda leaf: (-weights[leaf], leaf)):
        weight = weights[leaf]
        if weight == 0:  # decayed below the smallest float: nothing left to count
            continue
        if leaf not in forest.valid or not math.isfinite(weight):
            left_out += 1
            continue
        observed.append((leaf, weight))
    trie.observe_leaves(observed, forest.parents, forest.tokens, now)
    return trie, left_out


class _Forest:
    """The stored prefixes above `leaves` as a trie observes them: each one's `parents` (None at a root,
    or where the stored parent is unknown) and cumulative `tokens` (the most of its chain's so far: a
    prefix counts at least its parent's), and the leaves whose chains can be observed (`valid`): known,
    free of loops, under a root that has tokens. Each prefix is resolved once, however many leaves lie
    below it, where each leaf's whole chain was walked and listed before."""

    def __init__(self, by_id: Mapping[int, StoredPrefix], leaves: Iterable[int]) -> None:
        self.parents: dict[int, int | None] = {}
        self.tokens: dict[int, int] = {}
        self.valid: set[int] = set()
        rooted: dict[int, bool] = {}
        """Each resolved prefix: whether its root has tokens."""
        for leaf in leaves:
            path: list[StoredPrefix] = []
            on_path: set[int] = set()
            prefix: int | None = leaf
            while prefix is not None and prefix not in rooted:
                stored = by_id.get(prefix)
                if stored is None or prefix in on_path:
                    break  # an unknown leaf (parents are followed only when known), or a loop: left out
                path.append(stored)
                on_path.add(prefix)
                prefix = stored.parent if stored.parent in by_id else None
            else:  # up to a root, or to a prefix resolved for an earlier leaf
                parent, above, has_tokens = prefix, None, True
                if prefix is not None:
                    above, has_tokens = self.tokens[prefix], rooted[prefix]
                for stored in reversed(path):
                    cumulative = stored.tokens if above is None else max(above, stored.tokens)
                    if above is None:
                        has_tokens = cumulative > 0
                    self.parents[stored.prefix_id] = parent
                    self.tokens[stored.prefix_id] = cumulative
                    rooted[stored.prefix_id] = has_tokens
                    parent, above = stored.prefix_id, cumulative
                if rooted[leaf]:
                    self.valid.add(leaf)


def choose_for_replica(
    trie: PrefixTrie,
    now: float,
    *,
    replica: str,
    members: Collection[str],
    ring: RingSpec,
    budget: WarmBudget,
    kv_capacity_tokens: int | None,
    knobs: PolicyKnobs,
    resident: Collection[int] = frozenset(),
    renderable: Container[int] | None = None,
    max_items: int | None = None,
    calibration: Callable[[float], float] | None = None,
) -> tuple[list[ChosenPrefix], int]:
    """The warm set of `replica` at `now`, ancestors first, and the token limit it was chosen under:
    `choose_for_replicas` for one replica."""
    return choose_for_replicas(
        trie,
        now,
        capacities={replica: kv_capacity_tokens},
        members=members,
        ring=ring,
        budget=budget,
        knobs=knobs,
        resident={replica: resident},
        renderable=renderable,
        max_items=max_items,
        calibration=calibration,
    )[replica]


def choose_for_replicas(
    trie: PrefixTrie,
    now: float,
    *,
    capacities: Mapping[str, int | None],
    members: Collection[str],
    ring: RingSpec,
    budget: WarmBudget,
    knobs: PolicyKnobs,
    resident: Mapping[str, Collection[int]] | None = None,
    renderable: Container[int] | None = None,
    max_items: int | None = None,
    calibration: Callable[[float], float] | None = None,
) -> dict[str, tuple[list[ChosenPrefix], int]]:
    """The warm set at `now` of each replica of `capacities` (its KV capacity in tokens, None while
    unknown), ancestors first, and the token limit it was chosen under.

    The ring holds `members` and the replicas planned (a starting replica is planned for the share it will
    take), at full weight: a warm set is for the replica's steady share, not for its first ramped seconds.
    A replica's limit is `budget.token_limit` at `knobs.capacity_fraction` of its capacity, or the budget
    alone while the capacity is unknown (the warmer still cuts a plan at its own fill cap once the engine
    reports one). One pass over the trie serves every replica (`select_warm_sets`); `calibration` (see
    `fit_calibration`) maps scores to probabilities. Raises `ValueError` as `select_warm_set` does.
    """
    hash_ring = HashRing(sorted({*members, *capacities}), vnodes=ring.vnodes, load_factor=ring.load_factor)
    limits = {
        replica: (
            budget.token_limit(budget.tokens, 1.0)
            if capacity is None
            else budget.token_limit(capacity, knobs.capacity_fraction)
        )
        for replica, capacity in capacities.items()
    }
    chosen = select_warm_sets(
        trie,
        now,
        ring=hash_ring,
        routing_depth=ring.share_depth,
        limits=limits,
        ramp_window_s=knobs.ramp_window_s,
        min_reuse_probability=knobs.min_reuse_probability,
        resident=resident,
        renderable=renderable,
        max_items=max_items,
        calibration=calibration,
    )
    return {replica: (chosen[replica], limits[replica]) for replica in capacities}
