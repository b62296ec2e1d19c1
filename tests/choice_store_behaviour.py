"""One behaviour suite for what choosing plans reads (`plan_choice.ChoiceStore`), run against the memory
twin (`tests/unit/planner/test_choice_store_memory.py`) and Postgres
(`tests/integration/planner/test_choice_store_pg.py`). Both are seeded the way production fills them:
events through the ingest store's `write` (the twin's `MemoryIngest`, or `PgIngestStore`), plans through
the plan store's `record`."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from tests.ingest_store_behaviour import AT, BUCKET, leaf_counts, request
from warmplane.services.planner.plan_choice import HeldItem, LiveReplica, ModelStatistics
from warmplane.services.planner.plans import PlanStore
from warmplane.services.planner.policy import StoredPrefix
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import (
    EpochBumped,
    Event,
    HeldPrefixes,
    ModelRef,
    PrefixPayload,
    ReplicaBecameReady,
    ReplicaCrashed,
    ReplicaDrainingStarted,
    ReplicaEvent,
    ReplicaLost,
    ReplicaResidency,
    ReplicaStarted,
    ReplicaStopped,
    WarmFinished,
    WarmItem,
    WarmPlanIssued,
)

MINUTE = timedelta(minutes=1)


@dataclass(frozen=True, slots=True)
class ChoiceWorld:
    store: PlanStore
    """Its `ChoiceStore` reads are the suite's; `record` seeds plans."""
    ingest: Callable[[list[Event]], Awaitable[None]]
    """Write `events` as ingestion does, in one batch (of buckets `ingest_store_behaviour.BUCKET_SECONDS`
    wide)."""


def replica(
    kind: type[ReplicaEvent], name: str, *, at: datetime = AT, model: str = "m", capacity: int | None = None
) -> ReplicaEvent:
    return kind(
        event_id=new_event_id(), occurred_at=at, producer="warmer", model=ModelRef(model, "r1"), replica=name,
        node=f"node-{name}", kv_capacity_tokens=capacity,
    )  # fmt: skip


async def statistics_since_a_bucket_hold_newer_buckets_and_no_older(world: ChoiceWorld) -> None:
    await world.ingest([request(7, at=AT - 2 * MINUTE), request(9, tenant="globex", at=AT - 3 * MINUTE)])
    await world.ingest([request(7), request(7), request(8, at=AT + MINUTE)])
    since = await world.store.statistics("m", BUCKET)
    assert leaf_counts(since) == [(7, BUCKET, 2), (8, BUCKET + 1, 1)]
    [acme] = {scope for scope, _leaf, _bucket, _requests in since.counts}
    # A scope without a count since (globex's) is not read at all: neither its chains nor its catalogue.
    assert sorted(since.prefixes, key=lambda p: p[1].prefix_id) == [
        (acme, StoredPrefix(1, None, 16)), (acme, StoredPrefix(7, 1, 32)), (acme, StoredPrefix(8, 1, 32))
    ]  # fmt: skip
    assert since.catalogued == {(acme, 7), (acme, 8)}
    earlier = await world.store.statistics("m", BUCKET - 3)
    assert leaf_counts(earlier) == [
        (7, BUCKET - 2, 1),
        (7, BUCKET, 2),
        (8, BUCKET + 1, 1),
        (9, BUCKET - 3, 1),
    ]
    assert {prefix.prefix_id for _scope, prefix in earlier.prefixes} == {1, 7, 8, 9}
    assert await world.store.statistics("m", BUCKET + 2) == ModelStatistics([], [], set())


async def a_read_holds_only_the_chains_of_leaves_counted_since(world: ChoiceWorld) -> None:
    await world.ingest([request(6, at=AT - 10 * MINUTE), request(7)])
    since = await world.store.statistics("m", BUCKET - 3)
    assert leaf_counts(since) == [(7, BUCKET, 1)]
    assert sorted(p.prefix_id for _s, p in since.prefixes) == [1, 7], "6 was counted before the window"
    assert {key[1] for key in since.catalogued} == {7}


async def a_bounded_read_takes_the_leaves_counted_last_whose_chains_fit(world: ChoiceWorld) -> None:
    await world.ingest([request(7, at=AT - 2 * MINUTE), request(8, at=AT - MINUTE), request(7, at=AT)])
    await world.ingest([*[request(9, at=AT) for _ in range(3)], request(10, at=AT - 3 * MINUTE)])
    # Latest bucket first, then more requests in the window: 9 (three), 7 (two), 8, 10.
    everything = await world.store.statistics("m", BUCKET - 5, None)
    assert len(leaf_counts(everything)) == 5
    within_3 = await world.store.statistics("m", BUCKET - 5, 3)
    assert leaf_counts(within_3) == [(7, BUCKET - 2, 1), (7, BUCKET, 1), (9, BUCKET, 3)]
    assert sorted(p.prefix_id for _s, p in within_3.prefixes) == [1, 7, 9]
    assert {key[1] for key in within_3.catalogued} == {7, 9}
    within_2 = await world.store.statistics("m", BUCKET - 5, 2)
    assert (leaf_counts(within_2), sorted(p.prefix_id for _s, p in within_2.prefixes)) == (
        [(9, BUCKET, 3)],
        [1, 9],
    )
    assert await world.store.statistics("m", BUCKET - 5, 1) == ModelStatistics(
        [], [], set(), everything.positions
    ), "no chain fits"


async def another_models_counts_never_appear(world: ChoiceWorld) -> None:
    await world.ingest([request(7), *[request(8, model="other") for _ in range(3)]])
    ours, theirs = await world.store.statistics("m", BUCKET), await world.store.statistics("other", BUCKET)
    assert (leaf_counts(ours), leaf_counts(theirs)) == ([(7, BUCKET, 1)], [(8, BUCKET, 3)])
    assert not {s for s, *_ in ours.counts} & {s for s, *_ in theirs.counts}, "one scope per model"
    assert {p.prefix_id for _s, p in ours.prefixes} == {1, 7} and {k[1] for k in ours.catalogued} == {7}
    assert await world.store.statistics("nobody", 0) == ModelStatistics([], [], set())


async def payloads_are_those_of_catalogued_keys(world: ChoiceWorld) -> None:
    await world.ingest([request(7), request(8, tenant="globex")])
    known = sorted((await world.store.statistics("m", BUCKET)).catalogued)
    unknown = [(max(k[0] for k in known) + 1, 7), (known[0][0], 12345)]
    payloads = await world.store.payloads([*known, *unknown])
    assert sorted(payloads.values(), key=lambda p: p.prefix_id) == [
        PrefixPayload(7, prompt="acme 7"), PrefixPayload(8, prompt="globex 8")
    ]  # fmt: skip
    assert set(payloads) == set(known)
    assert await world.store.payloads([]) == {}


async def scope_names_are_tenant_and_prompt_revision(world: ChoiceWorld) -> None:
    await world.ingest([request(7), request(7, rev="v2"), request(7, tenant="globex")])
    scopes = sorted({scope for scope, *_ in (await world.store.statistics("m", BUCKET)).counts})
    names = await world.store.scope_names([*scopes, max(scopes) + 1])
    assert sorted(names) == scopes, "an unknown id is absent"
    assert sorted(names.values()) == [("acme", ""), ("acme", "v2"), ("globex", "")]


def bump(tenant: str, epoch: int, model: str = "m") -> EpochBumped:
    return EpochBumped(
        event_id=new_event_id(),
        occurred_at=AT,
        producer="api",
        tenant=tenant,
        model=ModelRef(model),
        epoch=epoch,
    )


async def current_epochs_are_each_bumped_tenants_highest_of_the_model(world: ChoiceWorld) -> None:
    await world.ingest([bump("acme", 3), bump("globex", 1), bump("acme", 7, "other")])
    await world.ingest([bump("acme", 2)])  # late: an epoch never goes back
    assert await world.store.current_epochs("m") == {"acme": 3, "globex": 1}
    assert await world.store.current_epochs("other") == {"acme": 7}
    assert await world.store.current_epochs("nobody") == {}


async def live_replicas_are_the_models_starting_to_ready_ones(world: ChoiceWorld) -> None:
    await world.ingest([
        replica(ReplicaStarted, "h"), replica(ReplicaStarted, "a"),
        replica(ReplicaBecameReady, "b", capacity=900),
        replica(ReplicaDrainingStarted, "c"), replica(ReplicaStopped, "d"), replica(ReplicaLost, "e"),
        replica(ReplicaCrashed, "f"), replica(ReplicaStarted, "g", model="other"),
    ])  # fmt: skip
    # An older event arriving late changes no state, but a capacity the row lacked is kept from it.
    await world.ingest([replica(ReplicaBecameReady, "h", at=AT - MINUTE, capacity=500)])
    assert await world.store.live_replicas("m") == [
        LiveReplica("a", "node-a", "r1", "starting", None),
        LiveReplica("b", "node-b", "r1", "ready", 900),
        LiveReplica("h", "node-h", "r1", "starting", 500),
    ]
    assert [r.replica for r in await world.store.live_replicas("other")] == ["g"]


async def held_by_one(world: ChoiceWorld, replica: str) -> list[HeldItem]:
    return (await world.store.held_by([replica]))[replica]


def report(start: ReplicaEvent, at: datetime, *held: HeldPrefixes) -> ReplicaResidency:
    return ReplicaResidency(
        event_id=new_event_id(), occurred_at=at, producer="warmer", model=ModelRef("m", "r1"),
        replica=start.replica, node=start.node, incarnation=start.event_id, held=list(held),
    )  # fmt: skip


async def a_replica_holds_what_the_report_on_its_latest_start_names(world: ChoiceWorld) -> None:
    first = replica(ReplicaStarted, "r")
    held = [HeldPrefixes("acme", "", 2, [5, 6]), HeldPrefixes("globex", "v1", 0, [7])]
    await world.ingest([first, report(first, AT + MINUTE, *held)])
    assert sorted(await held_by_one(world, "r"), key=lambda h: h.prefix_id) == [
        HeldItem(5, "acme", 2), HeldItem(6, "acme", 2), HeldItem(7, "globex", 0)
    ]  # fmt: skip
    assert await held_by_one(world, "s") == []
    again = replica(ReplicaStarted, "r", at=AT + 2 * MINUTE)
    await world.ingest([again, report(first, AT + 3 * MINUTE, *held)])  # a report on the old start
    assert await held_by_one(world, "r") == []


def plan(start: ReplicaEvent, at: datetime, *prefixes: int) -> WarmPlanIssued:
    items = [
        WarmItem(p, 32, PrefixPayload(p, prompt="x"), "acme", "", 1 if p % 2 else None) for p in prefixes
    ]
    return WarmPlanIssued(
        event_id=new_event_id(), occurred_at=at, producer="planner", model=ModelRef("m", "r1"),
        plan_id=uuid.uuid4(), replica=start.replica, node=start.node, epoch=4, items=items,
        budget_tokens=32 * len(items), deadline=at + 10 * MINUTE, trigger_event_id=start.event_id,
    )  # fmt: skip


def finished(issued: WarmPlanIssued, at: datetime, *failures: str) -> WarmFinished:
    return WarmFinished(
        event_id=new_event_id(), occurred_at=at, producer="warmer", model=issued.model,
        plan_id=issued.plan_id, replica=issued.replica, items_done=1, tokens_prefilled=32, verified_hits=1,
        failures=list(failures),
    )  # fmt: skip


async def a_replica_holds_its_verified_plans_items_from_its_start_on(world: ChoiceWorld) -> None:
    start = replica(ReplicaStarted, "r")
    await world.ingest([start])
    answering, partial = plan(start, AT, 5, 6), plan(start, AT + MINUTE, 8)
    await world.store.record([(answering, start.event_id), (partial, uuid.uuid4())])
    assert await held_by_one(world, "r") == [], "issued, not verified"
    await world.ingest(
        [finished(answering, AT + MINUTE), finished(partial, AT + MINUTE, "prefix 8: HTTP 400")]
    )
    # An item without an epoch is in the plan's.
    assert sorted(await held_by_one(world, "r"), key=lambda h: h.prefix_id) == [
        HeldItem(5, "acme", 1), HeldItem(6, "acme", 4)
    ]  # fmt: skip
    # A report after that plan finished says what is left of it; a plan verified after the report adds.
    later = plan(start, AT + 3 * MINUTE, 9)
    await world.store.record([(later, uuid.uuid4())])
    await world.ingest(
        [report(start, AT + 2 * MINUTE, HeldPrefixes("acme", "", 1, [5])), finished(later, AT + 4 * MINUTE)]
    )
    assert sorted(await held_by_one(world, "r"), key=lambda h: h.prefix_id) == [
        HeldItem(5, "acme", 1), HeldItem(9, "acme", 1)
    ]  # fmt: skip


async def each_replica_asked_at_once_holds_only_its_own(world: ChoiceWorld) -> None:
    r, s = replica(ReplicaStarted, "r"), replica(ReplicaStarted, "s")
    await world.ingest([r, s])
    answering = plan(r, AT, 5, 6)
    await world.store.record([(answering, r.event_id)])
    await world.ingest(
        [finished(answering, AT + MINUTE), report(s, AT + MINUTE, HeldPrefixes("acme", "", 2, [7]))]
    )
    held = await world.store.held_by(["r", "s", "t"])
    assert {name: sorted(items, key=lambda h: h.prefix_id) for name, items in held.items()} == {
        "r": [HeldItem(5, "acme", 1), HeldItem(6, "acme", 4)],
        "s": [HeldItem(7, "acme", 2)],
        "t": [],
    }


BEHAVIOURS: dict[str, Callable[[ChoiceWorld], Awaitable[None]]] = {
    behaviour.__name__: behaviour
    for behaviour in (
        statistics_since_a_bucket_hold_newer_buckets_and_no_older,
        a_read_holds_only_the_chains_of_leaves_counted_since,
        a_bounded_read_takes_the_leaves_counted_last_whose_chains_fit,
        another_models_counts_never_appear,
        payloads_are_those_of_catalogued_keys,
        scope_names_are_tenant_and_prompt_revision,
        current_epochs_are_each_bumped_tenants_highest_of_the_model,
        live_replicas_are_the_models_starting_to_ready_ones,
        a_replica_holds_what_the_report_on_its_latest_start_names,
        a_replica_holds_its_verified_plans_items_from_its_start_on,
        each_replica_asked_at_once_holds_only_its_own,
    )
}
