"""One behaviour suite for the planner's fleet store (`fleet_reactions.FleetStore`), run against the memory
twin (`tests/unit/planner/test_fleet_store_memory.py`) and the Postgres adapter
(`tests/integration/planner/test_fleet_store_pg.py`): what fleet reactions rely on, stated once, so the twin
the unit tests use cannot drift from the store production uses."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from warmplane.services.planner.core.deploy_epochs import EpochState, Revisions
from warmplane.services.planner.fleet_reactions import FleetStore
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import EpochBumped, ModelRef

AT = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
WINDOW = (AT - timedelta(minutes=5), AT)


@dataclass(frozen=True, slots=True)
class FleetWorld:
    store: FleetStore
    traffic: Callable[[str, str], Awaitable[None]]
    """Make (tenant, model) a pair the store has seen traffic of."""


def _bump(tenant: str, model: str, epoch: int, at: datetime = AT) -> EpochBumped:
    return EpochBumped(
        event_id=new_event_id(),
        occurred_at=at,
        producer="planner",
        tenant=tenant,
        model=ModelRef(model, "r2"),
        epoch=epoch,
        reason="deploy",
    )


async def a_tenant_never_bumped_is_at_epoch_zero_with_no_deploy(world: FleetWorld) -> None:
    assert await world.store.epoch_states("m", "acme") == [EpochState("acme", 0, None)]


async def a_bump_applies_only_over_the_epoch_it_was_decided_from(world: FleetWorld) -> None:
    deployed = Revisions("r2", ("p1",))
    assert await world.store.record_bump(_bump("acme", "m", 1), deployed, expected_epoch=0)
    assert not await world.store.record_bump(_bump("acme", "m", 1), deployed, expected_epoch=0)
    assert await world.store.epoch_states("m", "acme") == [EpochState("acme", 1, deployed)]
    assert await world.store.record_bump(_bump("acme", "m", 2), Revisions("r3", ()), expected_epoch=1)
    assert await world.store.epoch_states("m", "acme") == [EpochState("acme", 2, Revisions("r3", ()))]


async def epochs_are_per_model(world: FleetWorld) -> None:
    assert await world.store.record_bump(_bump("acme", "m", 5), Revisions("r2", ()), expected_epoch=0)
    assert await world.store.epoch_states("other", "acme") == [EpochState("acme", 0, None)]
    assert await world.store.record_bump(_bump("acme", "other", 1), Revisions("r9", ()), expected_epoch=0)
    assert [s.epoch for s in await world.store.epoch_states("m", "acme")] == [5]


async def a_models_tenants_are_those_with_traffic_or_an_epoch(world: FleetWorld) -> None:
    await world.traffic("globex", "m")
    await world.traffic("initech", "other")
    assert await world.store.record_bump(_bump("acme", "m", 3), Revisions("r2", ()), expected_epoch=0)
    states = await world.store.epoch_states("m", "")
    assert [(s.tenant, s.epoch) for s in states] == [("acme", 3), ("globex", 0)]


async def a_bump_is_unpublished_until_marked_and_only_before_the_time_asked(world: FleetWorld) -> None:
    early, late = _bump("acme", "m", 1, AT), _bump("globex", "m", 1, AT + timedelta(minutes=1))
    assert await world.store.record_bump(early, Revisions("r2", ()), expected_epoch=0)
    assert await world.store.record_bump(late, Revisions("r2", ()), expected_epoch=0)
    assert [b.event_id for b in await world.store.unpublished_bumps(AT + timedelta(seconds=30))] == [
        early.event_id
    ]
    await world.store.mark_bump_published(early.event_id, AT + timedelta(seconds=1))
    pending = await world.store.unpublished_bumps(AT + timedelta(hours=1))
    assert pending == [late], "as it was to be published, whole"


async def a_newer_bump_replaces_an_unpublished_older_one(world: FleetWorld) -> None:
    first, second = _bump("acme", "m", 1), _bump("acme", "m", 2, AT + timedelta(seconds=1))
    assert await world.store.record_bump(first, Revisions("r2", ()), expected_epoch=0)
    assert await world.store.record_bump(second, Revisions("r3", ()), expected_epoch=1)
    assert await world.store.unpublished_bumps(AT + timedelta(hours=1)) == [second]


async def a_model_has_one_open_alarm_until_it_is_cleared(world: FleetWorld) -> None:
    opened = await world.store.open_alarm("m", window=WINDOW, requests=100, cold_requests=80, at=AT)
    assert opened is not None
    assert await world.store.open_alarm("m", window=WINDOW, requests=90, cold_requests=70, at=AT) is None
    assert (
        await world.store.open_alarm("other", window=WINDOW, requests=9, cold_requests=7, at=AT) is not None
    )
    await world.store.alarm_planned(opened, 3)
    assert await world.store.clear_alarm("m", AT + timedelta(minutes=1))
    assert not await world.store.clear_alarm("m", AT + timedelta(minutes=2)), "none open any more"
    again = await world.store.open_alarm("m", window=WINDOW, requests=100, cold_requests=80, at=AT)
    assert again is not None and again != opened


BEHAVIOURS: dict[str, Callable[[FleetWorld], Awaitable[None]]] = {
    behaviour.__name__: behaviour
    for behaviour in (
        a_tenant_never_bumped_is_at_epoch_zero_with_no_deploy,
        a_bump_applies_only_over_the_epoch_it_was_decided_from,
        epochs_are_per_model,
        a_models_tenants_are_those_with_traffic_or_an_epoch,
        a_bump_is_unpublished_until_marked_and_only_before_the_time_asked,
        a_newer_bump_replaces_an_unpublished_older_one,
        a_model_has_one_open_alarm_until_it_is_cleared,
    )
}
