"""The trace evaluator's parameters, with the defaults `bench.evaluate_policy` and the CLI share."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from warmplane.services.planner.policy import PolicyKnobs

_PLANNER = PolicyKnobs()
"""The planner's defaults: what the evaluator measures unless told otherwise."""


@dataclass(frozen=True, slots=True)
class EvalParams:
    """How the fleet is simulated and how the planner's policy is tuned.

    `block_tokens`: tokens per block (hash id); `capacity_blocks`: KV capacity of a replica in blocks;
    `capacity_fraction`: the warm-set cap as a share of it (every policy but the seed replay is held to
    it); `join_at`: when the newcomer joins, as a share of the trace's span; `routing_depth`: the chain
    depth requests are routed by, None for automatic (see `fleet_sim.auto_routing_depth`); `load_window`
    (s): requests counted as a replica's load by the ring's bounded-load pick; `half_life` (s),
    `frequency_half_life` (s, None for none), `ramp_window` (s), `min_reuse`, `min_saved_tokens` and
    `bucket_seconds`: the planner policy's knobs, its floor on a plan's expected saving and its statistics
    bucket. The cap and the knobs default to the planner's own. `admit_after`: the history is stored as
    if behind a sighting filter, a chain node kept once that many requests have passed it and a request
    counted at its deepest kept node (1, the planner's store, keeps every node; 2 is a first-sighting
    filter, issue 19's candidate for chat-scale storage). `store_nodes`: the store holds at most that many
    nodes, the least recently passed evicted with their counts rolled up into their parents' (None: no
    bound); see `store_sim`.
    """

    block_tokens: int = 512
    replicas: int = 4
    capacity_blocks: int = 8000
    capacity_fraction: float = _PLANNER.capacity_fraction
    join_at: float = 0.5
    routing_depth: int | None = None
    load_factor: float = 1.25
    load_window: float = 60.0
    half_life: float = _PLANNER.half_life_s
    frequency_half_life: float | None = _PLANNER.frequency_half_life_s
    ramp_window: float = _PLANNER.ramp_window_s
    min_reuse: float = _PLANNER.min_reuse_probability
    min_saved_tokens: int = _PLANNER.min_expected_saved_tokens
    bucket_seconds: int = 60
    admit_after: int = 1
    store_nodes: int | None = None

    def __post_init__(self) -> None:
        if self.block_tokens <= 0 or self.capacity_blocks <= 0 or self.replicas <= 0:
            raise ValueError("block_tokens, capacity_blocks and replicas must be positive")
        if self.admit_after < 1:
            raise ValueError("admit_after counts sightings: at least 1")
        if not 0.0 <= self.join_at <= 1.0:
            raise ValueError("join_at is a share of the trace's span, in [0, 1]")
        if self.frequency_half_life is not None and not self.frequency_half_life > self.half_life:
            raise ValueError(
                f"the frequency half-life ({self.frequency_half_life:g} s) must be longer than the half-life"
                f" ({self.half_life:g} s), or none"
            )

    @property
    def limit_tokens(self) -> int:
        """The warm-set cap in tokens."""
        return int(self.capacity_blocks * self.block_tokens * self.capacity_fraction)

    def describe(self) -> str:
        """`name=value, ...` sorted by name, `routing_depth=auto` when automatic."""
        values = {
            **asdict(self),
            "routing_depth": "auto" if self.routing_depth is None else self.routing_depth,
        }
        return ", ".join(f"{name}={value}" for name, value in sorted(values.items()))
