"""The replica state machine: its lifecycle, which plans it accepts, what it holds and when it turns ready."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Literal

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warmplane.services.warmer.core.replica import (
    Outcome,
    Phase,
    ReplicaTracker,
    RunOrder,
    Transition,
    held_key,
    keys_of,
    policy_from,
)
from warmplane.shared.events import ModelRef, PrefixPayload, WarmItem, WarmPlanIssued

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
DEADLINE = NOW + timedelta(minutes=10)
MODEL = ModelRef("m", "r1")
OnDeadline = Literal["ready_partial", "stay_unready"]


def counting_ids() -> Callable[[], uuid.UUID]:
    counter = itertools.count(1)
    return lambda: uuid.UUID(int=next(counter))


def tracker(
    *, min_verified_fraction: float = 1.0, on_deadline: OnDeadline = "ready_partial"
) -> ReplicaTracker:
    policy = policy_from(
        concurrency=8,
        ready_concurrency=1,
        crash_after_failures=3,
        plan_wait_s=60.0,
        on_deadline=on_deadline,
        min_verified_fraction=min_verified_fraction,
    )
    return ReplicaTracker("replica-0", policy, counting_ids())


def loaded(
    *, min_verified_fraction: float = 1.0, on_deadline: OnDeadline = "ready_partial"
) -> ReplicaTracker:
    """A tracker whose engine has just answered its first health check (at NOW)."""
    replica = tracker(min_verified_fraction=min_verified_fraction, on_deadline=on_deadline)
    replica.start()
    replica.health(True, NOW)
    return replica


def item(prefix_id: int, *, tenant: str = "acme", prompt_rev: str = "v1") -> WarmItem:
    return WarmItem(prefix_id, 64, PrefixPayload(prefix_id, prompt=[prefix_id] * 64), tenant, prompt_rev)


def plan(
    number: int,
    items: list[WarmItem],
    *,
    epoch: int = 1,
    model: ModelRef = MODEL,
    trigger: uuid.UUID | None = None,
    deadline: datetime = DEADLINE,
) -> WarmPlanIssued:
    return WarmPlanIssued(
        event_id=uuid.UUID(int=10**6 + number),
        occurred_at=NOW,
        producer="planner",
        model=model,
        plan_id=uuid.UUID(int=2 * 10**6 + number),
        replica="replica-0",
        node="node-0",
        epoch=epoch,
        items=items,
        budget_tokens=10_000,
        deadline=deadline,
        trigger_event_id=trigger,
    )


def outcome(order: RunOrder, verified: list[WarmItem] | None = None, stopped: str = "") -> Outcome:
    """What a run of `order` reports when its probe verified `verified` (all its items by default)."""
    done = order.items if verified is None else verified
    return Outcome(
        order.plan.plan_id, keys_of(order.plan, done), len(order.items), order.already_held, stopped
    )


def accept_and_run(replica: ReplicaTracker, warm_plan: WarmPlanIssued) -> RunOrder:
    assert replica.offer(warm_plan, NOW).accepted
    order = replica.next_run()
    assert order is not None
    return order


def crash(replica: ReplicaTracker) -> list[Transition]:
    return [t for _ in range(3) for t in replica.health(False, NOW)]


def phases(transitions: list[Transition]) -> list[Phase]:
    return [transition.phase for transition in transitions]


def test_start_opens_an_incarnation_named_by_its_starting_event() -> None:
    replica = tracker()

    (started,) = replica.start()
    first = replica.incarnation
    (restarted,) = replica.start("engine restarted")

    assert (started.phase, started.event_id) == (Phase.STARTING, first)
    assert (restarted.phase, restarted.event_id, restarted.reason) == (
        Phase.STARTING,
        replica.incarnation,
        "engine restarted",
    )
    assert restarted.event_id != started.event_id
    assert not replica.ready


def test_a_verified_plan_takes_the_replica_from_starting_to_ready() -> None:
    replica = tracker()
    seen = replica.start() + replica.health(True, NOW) + replica.health(True, NOW)
    order = accept_and_run(replica, plan(1, [item(1), item(2)], trigger=replica.incarnation))
    seen += order.transitions
    assert not replica.ready

    seen += replica.finished(outcome(order), NOW)

    assert phases(seen) == [Phase.STARTING, Phase.LOADING, Phase.WARMING, Phase.READY]
    assert (replica.ready, replica.partial) == (True, False)
    assert replica.reason == "warm verified: 2 of 2 prefixes held"


def test_enough_verified_items_make_the_replica_ready_and_the_reason_counts_them() -> None:
    replica = loaded(min_verified_fraction=0.5)
    order = accept_and_run(replica, plan(1, [item(1), item(2)]))

    assert phases(replica.finished(outcome(order, [item(1)]), NOW)) == [Phase.READY]

    assert (replica.ready, replica.partial) == (True, False)
    assert replica.reason == "warm verified: 1 of 2 prefixes held"


def test_too_few_verified_items_wait_for_the_deadline_then_turn_ready_partial() -> None:
    replica = loaded()
    order = accept_and_run(replica, plan(1, [item(1), item(2)]))

    assert replica.finished(outcome(order, [item(1)]), NOW) == []
    assert replica.tick(DEADLINE - timedelta(microseconds=1)) == []
    assert (replica.phase, replica.ready) == (Phase.WARMING, False)

    assert phases(replica.tick(DEADLINE)) == [Phase.READY]
    assert (replica.ready, replica.partial) == (True, True)
    assert replica.reason == "deadline passed with 1 of 2 prefixes verified"


def test_a_run_stopped_at_its_deadline_turns_ready_partial_at_once_saying_why() -> None:
    replica = loaded()
    order = accept_and_run(replica, plan(1, [item(1), item(2)]))

    transitions = replica.finished(outcome(order, [], stopped="the plan's deadline passed"), DEADLINE)

    assert phases(transitions) == [Phase.READY]
    assert replica.partial
    assert replica.reason == "deadline passed with 0 of 2 prefixes verified (the plan's deadline passed)"


def test_the_stay_unready_policy_keeps_waiting_past_the_deadline() -> None:
    replica = loaded(on_deadline="stay_unready")
    order = accept_and_run(replica, plan(1, [item(1), item(2)]))
    replica.finished(outcome(order, [item(1)]), NOW)

    assert replica.tick(DEADLINE + timedelta(hours=1)) == []
    assert (replica.phase, replica.ready) == (Phase.WARMING, False)


def test_an_empty_plan_makes_the_replica_ready_at_once() -> None:
    replica = loaded()
    order = accept_and_run(replica, plan(1, []))

    assert phases(replica.finished(outcome(order), NOW)) == [Phase.READY]
    assert (replica.ready, replica.partial) == (True, False)


def test_a_loaded_replica_without_a_plan_turns_ready_partial_after_the_plan_wait() -> None:
    replica = loaded()
    assert not replica.offer(plan(1, [item(1)], deadline=NOW), NOW).accepted  # a refused plan is no plan

    assert replica.tick(NOW + timedelta(seconds=59)) == []
    assert phases(replica.tick(NOW + timedelta(seconds=60))) == [Phase.READY]

    assert (replica.ready, replica.partial) == (True, True)
    assert replica.reason == "no plan arrived within 60 s: serving cold"


def test_an_empty_plan_says_there_was_nothing_to_warm() -> None:
    replica = loaded()
    order = accept_and_run(replica, plan(1, []))
    replica.finished(outcome(order), NOW)

    assert replica.reason == "nothing to warm: the plan holds no cacheable prefix"


def test_an_empty_plan_the_planner_explained_turns_ready_with_its_reason() -> None:
    replica = loaded()
    why = "warming buys little for model m: nothing is likely enough to be used in the ramp window"
    order = accept_and_run(replica, msgspec.structs.replace(plan(1, []), empty_reason=why))
    replica.finished(outcome(order), NOW)

    assert (replica.ready, replica.partial) == (True, False)
    assert replica.reason == f"nothing to warm: {why}"


def test_a_partially_warm_replica_whose_later_plan_verifies_is_ready_in_full() -> None:
    replica = loaded()
    replica.tick(NOW + timedelta(seconds=60))
    assert (replica.ready, replica.partial) == (True, True)

    order = accept_and_run(replica, plan(1, [item(1), item(2)]))
    assert order.concurrency == 1  # it serves traffic meanwhile
    transitions = replica.finished(outcome(order), NOW + timedelta(seconds=61))

    assert phases(transitions) == [Phase.READY]
    assert (replica.ready, replica.partial) == (True, False)
    assert replica.reason == "warm verified: 2 of 2 prefixes held (after serving partially warm)"


def test_a_replica_with_an_accepted_plan_does_not_stop_waiting_for_it_at_the_plan_wait() -> None:
    replica = tracker()
    replica.start()
    assert replica.offer(plan(1, [item(1)], trigger=replica.incarnation), NOW).accepted
    replica.health(True, NOW)

    assert replica.tick(NOW + timedelta(minutes=5)) == []
    assert not replica.ready


def test_a_starting_replica_is_not_failed_by_unanswered_health_checks() -> None:
    replica = tracker()
    replica.start()

    assert [t for _ in range(10) for t in replica.health(False, NOW)] == []
    assert replica.phase is Phase.STARTING


def test_only_consecutive_failed_health_checks_crash_the_replica() -> None:
    replica = loaded()
    accept_and_run(replica, plan(1, []))

    assert replica.health(False, NOW) + replica.health(False, NOW) == []
    assert replica.health(True, NOW) == []
    assert replica.health(False, NOW) + replica.health(False, NOW) == []
    (crashed,) = replica.health(False, NOW)

    assert crashed.phase is Phase.FAILED
    assert crashed.reason == "engine stopped answering: 3 health checks failed"


def test_a_failed_replica_is_never_ready() -> None:
    replica = loaded()
    order = accept_and_run(replica, plan(1, [item(1)]))
    replica.finished(outcome(order), NOW)
    assert replica.ready

    assert phases(crash(replica)) == [Phase.FAILED]

    assert (replica.ready, replica.partial) == (False, False)
    assert replica.tick(DEADLINE + timedelta(days=1)) == []
    assert replica.health(False, NOW) == []
    assert replica.finished(outcome(order), NOW) == []
    refused = replica.offer(plan(2, [item(2)]), NOW)
    assert not refused.accepted
    assert refused.reason == "the engine is not answering; its next start gets a new plan"
    assert replica.next_run() is None
    assert (replica.phase, replica.ready) == (Phase.FAILED, False)


def test_a_crash_forgets_what_was_held_so_a_restart_warms_it_again() -> None:
    replica = loaded()
    order = accept_and_run(replica, plan(1, [item(1), item(2)]))
    replica.finished(outcome(order), NOW)
    before = replica.incarnation
    crash(replica)

    assert replica.held == set()
    restarted = replica.health(True, NOW)
    assert phases(restarted) == [Phase.STARTING, Phase.LOADING]
    assert restarted[0].event_id == replica.incarnation != before

    again = accept_and_run(replica, plan(2, [item(1), item(2)], trigger=replica.incarnation))
    assert (again.items, again.already_held) == ([item(1), item(2)], 0)


def test_a_rewarm_plan_warms_even_what_the_replica_is_believed_to_hold() -> None:
    replica = loaded()
    first = accept_and_run(replica, plan(1, [item(1), item(2)]))
    replica.finished(outcome(first), NOW)
    again = accept_and_run(replica, plan(2, [item(1), item(2), item(3)]))
    assert (again.items, again.already_held) == ([item(3)], 2)
    replica.finished(outcome(again), NOW)
    forced = accept_and_run(replica, msgspec.structs.replace(plan(3, [item(1), item(2)]), rewarm=True))
    assert (forced.items, forced.already_held) == ([item(1), item(2)], 0)


def test_an_outcome_of_an_earlier_incarnations_run_is_ignored() -> None:
    replica = loaded()
    earlier = accept_and_run(replica, plan(1, [item(1)]))
    crash(replica)
    replica.health(True, NOW)
    current = accept_and_run(replica, plan(2, [item(2)], trigger=replica.incarnation))

    assert replica.finished(outcome(earlier), NOW) == []

    assert (replica.held, replica.running, replica.phase) == (set(), current.plan, Phase.WARMING)
    assert phases(replica.finished(outcome(current), NOW)) == [Phase.READY]
    assert replica.held == keys_of(current.plan, current.items)


def test_an_outcome_that_arrives_while_failed_holds_nothing() -> None:
    replica = loaded()
    order = accept_and_run(replica, plan(1, [item(1)]))
    crash(replica)

    assert replica.finished(outcome(order), NOW) == []

    assert (replica.held, replica.running, replica.ready) == (set(), None, False)


def test_a_plan_that_arrives_twice_is_applied_once() -> None:
    replica = loaded()
    warm_plan = plan(1, [item(1)])
    order = accept_and_run(replica, warm_plan)

    again = replica.offer(warm_plan, NOW)
    replica.finished(outcome(order), NOW)

    assert (again.accepted, again.reason) == (False, "duplicate: this plan was already received")
    assert replica.next_run() is None


def test_a_plan_from_an_older_epoch_is_dropped() -> None:
    replica = loaded()
    assert replica.offer(plan(1, [item(1)], epoch=2), NOW).accepted

    older = replica.offer(plan(2, [item(1)], epoch=1), NOW)

    assert (older.accepted, older.reason) == (False, "epoch 1 is older than epoch 2 already planned")
    assert replica.offer(plan(3, [item(1)], epoch=2), NOW).accepted
    assert replica.offer(plan(4, [item(1)], epoch=1, model=ModelRef("other-model")), NOW).accepted


def test_epochs_are_per_tenant_and_an_items_own_epoch_wins_over_the_plans() -> None:
    replica = loaded()
    acme_at_3 = msgspec.structs.replace(item(1), epoch=3)
    assert replica.offer(plan(1, [acme_at_3], epoch=0), NOW).accepted

    mixed = plan(2, [item(2), item(3, tenant="globex")], epoch=1)  # acme at 1 is stale, globex is not
    decision = replica.offer(mixed, NOW)
    order = replica.next_run()  # the first plan
    assert order is not None and order.items == [acme_at_3]
    assert held_key(order.plan, acme_at_3)[3] == 3

    assert (decision.accepted, decision.reason) == (True, "accepted; 1 items of an older epoch left out")
    replica.finished(outcome(order), NOW)
    second = replica.next_run()
    assert second is not None and [each.tenant for each in second.items] == ["globex"]


def test_a_plan_larger_than_the_cache_allows_is_cut_and_ready_on_what_fits() -> None:
    replica = loaded()
    items = [item(1), item(2), item(3)]  # 64 tokens each, most valuable first
    assert replica.offer(plan(1, items), NOW).accepted

    order = replica.next_run(fill_limit_tokens=150)

    assert order is not None and order.items == items[:2] and order.left_out == 1
    assert phases(replica.finished(outcome(order), NOW)) == [Phase.READY]
    assert replica.reason == "warm verified: 2 of 2 prefixes held"


def test_a_plan_past_its_deadline_is_refused() -> None:
    replica = loaded()

    expired = replica.offer(plan(1, [item(1)], deadline=NOW), NOW)

    assert not expired.accepted
    assert expired.reason == f"expired: its deadline {NOW.isoformat()} has passed"
    assert replica.offer(plan(2, [item(1)], deadline=NOW + timedelta(microseconds=1)), NOW).accepted


def test_a_plan_for_an_earlier_start_is_refused() -> None:
    replica = tracker()
    replica.start()
    earlier = replica.incarnation
    replica.start("engine restarted")

    stale = replica.offer(plan(1, [item(1)], trigger=earlier), NOW)

    assert (stale.accepted, stale.reason) == (False, "issued for an earlier start of this replica")
    assert replica.offer(plan(2, [item(1)], trigger=replica.incarnation), NOW).accepted
    assert replica.offer(plan(3, [item(1)]), NOW).accepted


def test_held_items_are_not_in_the_next_run_order() -> None:
    replica = loaded()
    first = accept_and_run(replica, plan(1, [item(1), item(2)]))
    replica.finished(outcome(first), NOW)

    second = accept_and_run(replica, plan(2, [item(1), item(2), item(3)]))

    assert (second.items, second.already_held) == ([item(3)], 2)


@pytest.mark.parametrize(
    ("again", "epoch", "model"),
    [
        (item(1, tenant="globex"), 1, MODEL),
        (item(1, prompt_rev="v2"), 1, MODEL),
        (item(1), 2, MODEL),
        (item(1), 1, ModelRef("other-model")),
    ],
    ids=["other-tenant", "other-prompt-revision", "later-epoch", "other-model"],
)
def test_a_prefix_is_held_only_in_its_own_namespace(again: WarmItem, epoch: int, model: ModelRef) -> None:
    replica = loaded()
    first = accept_and_run(replica, plan(1, [item(1)]))
    replica.finished(outcome(first), NOW)

    second = accept_and_run(replica, plan(2, [again], epoch=epoch, model=model))

    assert (second.items, second.already_held) == ([again], 0)


def test_only_verified_items_are_held() -> None:
    replica = loaded(min_verified_fraction=0.5)
    first = accept_and_run(replica, plan(1, [item(1), item(2)]))
    replica.finished(outcome(first, [item(1)]), NOW)

    second = accept_and_run(replica, plan(2, [item(1), item(2)]))

    assert (second.items, second.already_held) == ([item(2)], 1)


def test_ready_concurrency_is_used_once_ready() -> None:
    replica = loaded()
    first = accept_and_run(replica, plan(1, [item(1)]))
    replica.finished(outcome(first), NOW)

    second = accept_and_run(replica, plan(2, [item(2)]))

    assert (first.concurrency, second.concurrency) == (8, 1)
    assert second.transitions == []
    assert replica.finished(outcome(second), NOW) == []
    assert (replica.phase, replica.ready) == (Phase.READY, True)
    assert replica.held == keys_of(first.plan, [item(1), item(2)])


def test_next_run_waits_for_the_engine_and_for_the_running_plan() -> None:
    replica = tracker()
    replica.start()
    early = plan(1, [item(1)], trigger=replica.incarnation)
    assert replica.offer(early, NOW).accepted
    assert replica.next_run() is None

    replica.health(True, NOW)
    first = replica.next_run()
    assert first is not None
    assert (first.plan, phases(first.transitions)) == (early, [Phase.WARMING])

    later = plan(2, [item(2)])
    assert replica.offer(later, NOW).accepted
    assert replica.next_run() is None
    replica.finished(outcome(first), NOW)
    second = replica.next_run()
    assert second is not None
    assert second.plan == later


def test_overdue_names_the_running_plan_once_its_deadline_passed() -> None:
    replica = loaded()
    assert replica.overdue(DEADLINE) is None

    order = accept_and_run(replica, plan(1, [item(1)]))

    assert replica.overdue(DEADLINE - timedelta(microseconds=1)) is None
    assert replica.overdue(DEADLINE) == order.plan.plan_id
    replica.finished(outcome(order), DEADLINE)
    assert replica.overdue(DEADLINE) is None


# Weighted like a live replica's facts: mostly answers, plans and run results, now and then a crash.
FACTS = (
    *["health_ok"] * 3,
    "health_failed",
    "crash",
    *["offer"] * 3,
    "offer_again",
    *["finish_running"] * 3,
    "finish_any",
    *["tick"] * 2,
    "start",
)
POOL = [item(1), item(2), item(3, tenant="globex"), item(4, prompt_rev="v2")]


def random_plan(data: st.DataObject, number: int, replica: ReplicaTracker, now: datetime) -> WarmPlanIssued:
    """Mostly a plan the replica would take; now and then an expired, older-epoch or stale one."""
    return plan(
        number,
        data.draw(st.lists(st.sampled_from(POOL), max_size=4, unique_by=lambda i: i.prefix_id)),
        epoch=data.draw(st.sampled_from([1, 1, 1, 0, 2])),
        trigger=data.draw(
            st.sampled_from([None, replica.incarnation, replica.incarnation, uuid.UUID(int=999)])
        ),
        deadline=now + timedelta(seconds=data.draw(st.sampled_from([600, 600, 120, 0]))),
    )


def apply_fact(
    data: st.DataObject,
    replica: ReplicaTracker,
    now: datetime,
    offered: list[WarmPlanIssued],
    orders: list[RunOrder],
) -> WarmPlanIssued | None:
    """Feed `replica` one random fact; a plan to offer it is returned, not offered."""
    fact = data.draw(st.sampled_from(FACTS))
    if fact in ("health_ok", "health_failed"):
        replica.health(fact == "health_ok", now)
    elif fact == "crash":
        crash(replica)
    elif fact == "offer_again" and offered:
        return data.draw(st.sampled_from(offered))
    elif fact.startswith("offer"):
        return random_plan(data, len(offered), replica, now)
    elif fact.startswith("finish") and orders:
        order = orders[-1] if fact == "finish_running" else data.draw(st.sampled_from(orders))
        verified = (
            data.draw(st.lists(st.sampled_from(order.items), unique_by=lambda i: i.prefix_id))
            if order.items
            else []
        )
        replica.finished(outcome(order, verified, stopped=data.draw(st.sampled_from(["", "cancelled"]))), now)
    elif fact == "tick":
        replica.tick(now)
    elif fact == "start":
        replica.start()
    return None


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_no_sequence_of_facts_breaks_the_contracts(data: st.DataObject) -> None:
    """Ready iff phase READY, so never while FAILED; partial only when ready; a failed replica holds nothing;
    an accepted plan is new, unexpired, not from an older epoch and not for an earlier start."""
    replica = tracker(
        min_verified_fraction=data.draw(st.sampled_from([0.0, 0.5, 1.0])),
        on_deadline=data.draw(st.sampled_from(["ready_partial", "stay_unready"])),
    )
    replica.start()
    now = NOW
    newest: dict[str, int] = {}  # the newest epoch accepted per tenant (one model here)
    floors: dict[uuid.UUID, dict[str, int]] = {}  # `newest` as each accepted plan found it
    offered: list[WarmPlanIssued] = []
    orders: list[RunOrder] = []
    for _ in range(data.draw(st.integers(1, 40))):
        now += timedelta(seconds=data.draw(st.sampled_from([0, 1, 30, 90])))
        warm_plan = apply_fact(data, replica, now, offered, orders)
        if warm_plan is not None:
            if replica.offer(warm_plan, now).accepted:
                assert warm_plan not in offered
                assert warm_plan.deadline > now
                assert warm_plan.trigger_event_id in (None, replica.incarnation)
                floors[warm_plan.plan_id] = dict(newest)
                for each in warm_plan.items:
                    if warm_plan.epoch >= newest.get(each.tenant, 0):
                        newest[each.tenant] = warm_plan.epoch
            offered.append(warm_plan)
        if (order := replica.next_run()) is not None:  # as the driver does after every fact
            orders.append(order)
            floor = floors[order.plan.plan_id]
            assert all(each.epoch_in(order.plan.epoch) >= floor.get(each.tenant, 0) for each in order.items)

        assert replica.ready == (replica.phase is Phase.READY)
        assert replica.ready or not replica.partial
        if replica.phase is Phase.FAILED:
            assert (replica.ready, replica.held) == (False, set())


def test_with_warming_off_a_replica_is_ready_once_its_engine_answers_and_refuses_plans() -> None:
    policy = policy_from(
        concurrency=8,
        ready_concurrency=1,
        crash_after_failures=3,
        plan_wait_s=60.0,
        on_deadline="ready_partial",
        min_verified_fraction=1.0,
        warm=False,
    )
    replica = ReplicaTracker("replica-0", policy, counting_ids())
    replica.start()

    assert phases(replica.health(True, NOW)) == [Phase.LOADING, Phase.READY]
    assert (replica.ready, replica.partial) == (True, False)
    assert replica.reason == "warming is off: serving cold"
    decision = replica.offer(plan(1, [item(1)]), NOW)
    assert not decision.accepted and "warming is off" in decision.reason
    assert replica.next_run() is None


def test_a_draining_replica_is_not_ready_takes_no_plan_and_health_no_longer_moves_it() -> None:
    replica = loaded()
    order = accept_and_run(replica, plan(1, [item(1)]))
    replica.finished(outcome(order), NOW)
    assert replica.offer(plan(2, [item(2)]), NOW).accepted  # queued, not yet run
    assert replica.ready

    (draining,) = replica.drain("SIGTERM")

    assert (draining.phase, draining.reason, replica.ready) == (Phase.DRAINING, "SIGTERM", False)
    assert replica.next_run() is None  # the queued plan is dropped
    refused = replica.offer(plan(3, [item(3)]), NOW)
    assert (refused.accepted, refused.reason) == (False, "the replica is draining: it is leaving the fleet")
    # An engine shutting down stops answering: that is not a crash, and answering again is no restart.
    assert crash(replica) == []
    assert replica.health(True, NOW) == []
    assert replica.tick(NOW + timedelta(hours=1)) == []
    assert replica.drain("again") == []
    assert replica.phase is Phase.DRAINING


def test_stop_ends_a_draining_replica_and_forgets_what_it_held() -> None:
    replica = loaded()
    order = accept_and_run(replica, plan(1, [item(1)]))
    replica.finished(outcome(order), NOW)
    replica.drain("SIGTERM")

    (stopped,) = replica.stop("drained: no request in flight")

    assert (stopped.phase, replica.ready, replica.held) == (Phase.STOPPED, False, set())
    assert replica.stop("again") == []
    assert replica.drain("again") == []


def test_stop_without_a_drain_first_says_draining_then_stopped() -> None:
    replica = loaded()

    assert phases(replica.stop("the warmer stops")) == [Phase.DRAINING, Phase.STOPPED]


def test_a_run_that_ends_after_the_drain_began_changes_nothing() -> None:
    replica = loaded()
    order = accept_and_run(replica, plan(1, [item(1)]))
    replica.drain("SIGTERM")

    assert replica.finished(outcome(order), NOW) == []
    assert (replica.phase, replica.ready, replica.held) == (Phase.DRAINING, False, set())
