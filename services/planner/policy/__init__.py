"""The planner's warm-set policy: decayed prefix statistics and warm-set selection. Pure: no I/O, no clock.

`PrefixTrie` counts requests through each prefix of their chains with exponential decay; `select_warm_set`
chooses, for one replica, the prefixes worth pre-filling by marginal gain under a `WarmBudget`, restricted
to the replica's `RoutingShare` of the gateway's hash ring (`select_warm_sets`: many replicas in one pass).
`trie_from_counts`, `fit_calibration` (score to observed reuse, backtested on the same counts) and
`choose_for_replicas` are the one path from stored counts to replicas' warm sets, and `decide_warm` says
when a set is not worth warming at all,
the planner's and the trace evaluator's. Every
call is handed `now` (seconds, any epoch, as long as one trie sees one clock). An import contract in CI
keeps this package free of I/O.
"""

from warmplane.services.planner.policy.budget import BudgetTier, WarmBudget, kv_prefix_seconds
from warmplane.services.planner.policy.calibration import (
    PRIOR,
    ReliabilityRow,
    ReuseCalibration,
    calibration_gap,
    fit_isotonic,
    reliability,
)
from warmplane.services.planner.policy.prefix_trie import PrefixTrie, TrieNode
from warmplane.services.planner.policy.replica_plan import (
    LeafCount,
    PolicyKnobs,
    RingSpec,
    StoredPrefix,
    choose_for_replica,
    choose_for_replicas,
    fit_calibration,
    trie_from_counts,
    weight_horizon_s,
)
from warmplane.services.planner.policy.routing_share import RoutingShare
from warmplane.services.planner.policy.warm_decision import (
    EmptyReason,
    WarmDecision,
    WarmThresholds,
    decide_warm,
    expected_saved_tokens,
)
from warmplane.services.planner.policy.warm_set import (
    ChosenPrefix,
    candidate_probabilities,
    reuse_probability,
    select_warm_set,
    select_warm_sets,
)

__all__ = [
    "PRIOR",
    "BudgetTier",
    "ChosenPrefix",
    "EmptyReason",
    "LeafCount",
    "PolicyKnobs",
    "PrefixTrie",
    "ReliabilityRow",
    "ReuseCalibration",
    "RingSpec",
    "RoutingShare",
    "StoredPrefix",
    "TrieNode",
    "WarmBudget",
    "WarmDecision",
    "WarmThresholds",
    "calibration_gap",
    "candidate_probabilities",
    "choose_for_replica",
    "choose_for_replicas",
    "decide_warm",
    "expected_saved_tokens",
    "fit_calibration",
    "fit_isotonic",
    "kv_prefix_seconds",
    "reliability",
    "reuse_probability",
    "select_warm_set",
    "select_warm_sets",
    "trie_from_counts",
    "weight_horizon_s",
]
