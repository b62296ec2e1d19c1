"""The broker away and back under a running fleet (issue 21's fault suite: the broker stopped and started).

The embedded broker keeps its data in memory only, so a killed one comes back empty (test_emitter_broker.py
kills one under an emitter). This test freezes the broker instead: SIGSTOP to its process group for longer
than the clients' request timeouts and group session timeout, then SIGCONT. From every client's point of
view the broker is gone (requests time out, the group session expires) and then comes back with its data,
as a broker host that hangs and recovers, or a Kafka restart with durable logs, does.

One engine of the test's own serves a gateway and is warmed by a warmer; a planner consumes the topics. The
engine is frozen too, from before the warmer starts until the broker is frozen: the replica is announced
and planned, but its warm cannot finish before the outage, whatever the timing. With the broker frozen,
the warmer's replica turns ready while its reports wait in its outbox; then the gateway answers every chat
with 200 within a correctness bound, while its emitter holds at most its bound and counts what it refuses.
Once the broker is back, the planner counts exactly the request events the emitter reports sent and
records the warm's outcome, and a new plan reaches the warmer: every consumer group resumed.
"""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from tests.integration.gateway_harness import (
    TIMEOUT,
    chat_body,
    epoch_bumped,
    gateway_settings,
    headers,
    metric_sample,
)
from tests.integration.planner_harness import events_on, poll_until, produce
from tests.integration.warmer_harness import conversation_traffic, wait_for, warmer_settings
from tests.real_parts import planner_settings_for
from warmplane.services.gateway.service import Gateway
from warmplane.services.gateway.settings import GatewaySettings, StaticReplica
from warmplane.services.planner.app import running_planner
from warmplane.services.planner.settings import PlannerSettings
from warmplane.services.warmer.core.replica import Phase
from warmplane.services.warmer.service import Warmer
from warmplane.services.warmer.settings import WarmerSettings, WarmSettings
from warmplane.shared.embedded import EmbeddedKafka, EmbeddedPart
from warmplane.shared.embedded.vllm_engine import EmbeddedVllm
from warmplane.shared.emitter import Emitter, EmitterStats
from warmplane.shared.events import Event, ReplicaEvent, RequestObserved, WarmFinished
from warmplane.shared.settings import EmitterSettings
from warmplane.shared.topics import Topics

REQUEST_TIMEOUT_MS = 6_000
"""Every client's request timeout: above the 1 s the embedded broker holds a group join (half a session),
and above `MAX_CHAT_S`, so a chat that waited out one request to the broker fails that bound."""
SESSION_TIMEOUT_MS = 2_000
OUTAGE_S = 2 * max(REQUEST_TIMEOUT_MS, SESSION_TIMEOUT_MS) / 1000
"""The shortest freeze: every request in flight times out and every group session expires meanwhile."""
BUFFER = 8
"""The gateway emitter's bound, in events; the chats of the outage emit more."""
MIN_OUTAGE_CHATS = 2 * BUFFER
FIRST_CHATS = 3
# A correctness bound, not a performance one: a chat waiting on the broker would take a request timeout or
# the rest of the outage, where a tiny-model chat on an otherwise idle engine takes a fraction of a second
# (seconds at worst on this noisy 2-core machine).
MAX_CHAT_S = 5.0
WAIT_S = 60.0
"""How long any recovery may take before the test fails naming it."""


@dataclass
class CountingSink:
    """The gateway's event sink: its real emitter, each `emit()` call counted by event type and outcome."""

    emitter: Emitter
    accepted: Counter[type[Event]] = field(default_factory=Counter)
    refused: Counter[type[Event]] = field(default_factory=Counter)

    def emit(self, event: Event) -> bool:
        taken = self.emitter.emit(event)
        (self.accepted if taken else self.refused)[type(event)] += 1
        return taken

    @property
    def calls(self) -> int:
        return self.accepted.total() + self.refused.total()

    @property
    def observed(self) -> int:
        """`request.observed` events handed over, accepted or not: one per answered chat."""
        return self.accepted[RequestObserved] + self.refused[RequestObserved]


@dataclass(frozen=True, slots=True)
class Fleet:
    """The parts' settings, on one broker and one engine of the test's own."""

    engine: EmbeddedVllm
    planner: PlannerSettings
    gateway: GatewaySettings
    warmer: WarmerSettings
    key: str
    """acme's API key at the gateway."""
    rng: random.Random

    @property
    def dsn(self) -> str:
        return self.planner.postgres.asyncpg_dsn()


def fleet(broker: EmbeddedKafka, engine: EmbeddedVllm, database: str) -> Fleet:
    """Every client gives up on a request after `REQUEST_TIMEOUT_MS`. The gateway serves from `engine`
    (a static replica); its emitter holds `BUFFER` events and retries a batch for longer than the outage,
    so none is lost to it. The warmer drives `engine` and salts as the gateway does."""
    planner = planner_settings_for(broker.bootstrap_servers, database)
    kafka = planner.kafka.model_copy(
        update={
            "request_timeout_ms": REQUEST_TIMEOUT_MS,
            "session_timeout_ms": SESSION_TIMEOUT_MS,
            "commit_timeout_s": 3.0,
        }
    )
    gateway, keys = gateway_settings(kafka, uuid.uuid4().hex[:8])
    emitter = EmitterSettings(
        client_id="warmplane-gateway", linger_ms=1, close_timeout_s=5, buffer_max_events=BUFFER,
        batch_max_events=BUFFER, send_timeout_s=2, send_retries=100, retry_backoff_min_s=0.05,
        retry_backoff_max_s=1.0,
    )  # fmt: skip
    replica = StaticReplica(replica="r0", url=engine.base_url, model=engine.model_name)
    gateway = gateway.model_copy(update={"static_replicas": [replica], "emitter": emitter})
    secrets = {tenant: secret.get_secret_value() for tenant, secret in gateway.tenant_secrets.items()}
    warm = WarmSettings(
        health_interval_s=0.2, progress_interval_s=0.2, request_timeout_s=30, publish_timeout_s=2
    )
    warmer = warmer_settings(kafka, [engine], node="node-f", secrets=secrets, warm=warm)
    return Fleet(
        engine,
        planner.model_copy(update={"kafka": kafka}),
        gateway,
        warmer,
        keys["acme"],
        random.Random(uuid.uuid4().int),
    )


@contextmanager
def thawed_at_exit(*parts: EmbeddedPart) -> Iterator[None]:
    """Whatever happens inside, no part is left frozen."""
    try:
        yield
    finally:
        for part in parts:
            part.thaw()


async def chat(client: httpx.AsyncClient, parts: Fleet) -> float:
    """One chat through the gateway (fresh words: a new prefix); its seconds. Fails unless answered 200."""
    body = chat_body(parts.rng, parts.engine.model_name)
    began = time.monotonic()
    response = await client.post("/v1/chat/completions", json=body, headers=headers(parts.key))
    took = time.monotonic() - began
    assert response.status_code == 200, response.text
    return took


async def fetch(dsn: str, query: str, *args: Any) -> list[Any]:
    """The first column of `query`'s rows."""
    db = await asyncpg.connect(dsn)
    try:
        return [row[0] for row in await db.fetch(query, *args)]
    finally:
        await db.close()


async def requests_counted(dsn: str) -> int:
    """Requests the planner's statistics hold (one per `request.observed` event, at its leaf prefix)."""
    [total] = await fetch(dsn, "SELECT coalesce(sum(requests), 0) FROM prefix_requests")
    return int(total)


async def until_counted(dsn: str, expected: int) -> None:
    """Until the planner counted at least `expected` requests; then exactly that many (none twice)."""

    async def reached() -> bool:
        return await requests_counted(dsn) >= expected

    await poll_until(reached, timeout_s=WAIT_S, what=f"{expected} requests counted")
    assert await requests_counted(dsn) == expected


async def planner_view(dsn: str, replica: str) -> tuple[list[str], list[str]]:
    """The states of the planner's warm plans (oldest first), and of `replica`, from Postgres."""
    plans = await fetch(dsn, "SELECT state FROM warm_plans ORDER BY issued_at")
    return plans, await fetch(dsn, "SELECT state FROM replicas WHERE replica_id = $1", replica)


async def until_planner_sees(dsn: str, replica: str, view: tuple[list[str], list[str]], what: str) -> None:
    async def seen() -> bool:
        return await planner_view(dsn, replica) == view

    await poll_until(seen, timeout_s=WAIT_S, what=what)


def plans_accepted(warmer: Warmer) -> float:
    value = warmer.metrics.registry.get_sample_value("warmplane_warmer_plans_total", {"outcome": "accepted"})
    return value or 0.0


def publish_retries(warmer: Warmer) -> float:
    return warmer.metrics.registry.get_sample_value("warmplane_warmer_publish_retries_total") or 0.0


async def before_the_outage(
    client: httpx.AsyncClient, parts: Fleet, sink: CountingSink, produced: int
) -> None:
    """A few chats with the broker up: every event sent, none refused, all counted by the planner."""
    for _ in range(FIRST_CHATS):
        assert await chat(client, parts) < MAX_CHAT_S
    await wait_for(
        lambda: sink.observed == FIRST_CHATS and sink.emitter.stats.buffered == 0,
        timeout_s=WAIT_S,
        what="the first chats' events sent",
    )
    stats = sink.emitter.stats
    assert (stats.emitted, stats.sent, stats.dropped_total) == (sink.calls, sink.calls, 0)
    await until_counted(parts.dsn, produced + FIRST_CHATS)


def reports_held_back(warmer: Warmer) -> bool:
    """Whether the warmer's replica is ready and its outbox has failed to publish at least once."""
    return warmer.ready() and publish_retries(warmer) >= 1


async def serve_through_outage(
    client: httpx.AsyncClient, parts: Fleet, sink: CountingSink, frozen_at: float
) -> list[float]:
    """Chat through the gateway until the outage has lasted `OUTAGE_S` since `frozen_at` (monotonic) and
    `MIN_OUTAGE_CHATS` were answered; each chat's seconds. The emitter's bound holds after every chat."""
    latencies: list[float] = []
    while time.monotonic() - frozen_at < OUTAGE_S or len(latencies) < MIN_OUTAGE_CHATS:
        latencies.append(await chat(client, parts))
        assert sink.emitter.stats.buffered <= BUFFER
    await wait_for(
        lambda: sink.observed == FIRST_CHATS + len(latencies),
        timeout_s=WAIT_S,
        what="every chat's events handed to the emitter",
    )
    return latencies


async def during_the_outage(
    parts: Fleet, sink: CountingSink, at_freeze: tuple[int, int], gateway: Gateway, warmer: Warmer
) -> EmitterStats:
    """What holds at the end of the outage, before the thaw, given the events sent and the `emit()` calls
    when it began; the emitter's stats now."""
    stats, calls = sink.emitter.stats, sink.calls
    sent_before, calls_before = at_freeze
    # Nothing acknowledged, nothing given up on: the buffer is full at its bound and the rest refused.
    assert stats.sent == sent_before and stats.lost == 0
    assert stats.buffered == BUFFER
    assert stats.rejected == calls - calls_before - BUFFER > 0
    assert stats.emitted + stats.rejected == calls
    async with httpx.AsyncClient(timeout=TIMEOUT) as http:
        metrics = (await http.get(f"{gateway.metrics_url}/metrics")).text
    assert metric_sample(metrics, "warmplane_gateway_events_dropped_total") == stats.rejected
    # The replica is ready, but its reports wait in the warmer's outbox: the planner knows only the start
    # it planned.
    [driver] = warmer.drivers.values()
    assert await planner_view(parts.dsn, driver.replica) == (["issued"], ["starting"])
    return stats


async def after_the_outage(parts: Fleet, sink: CountingSink, during: EmitterStats, produced: int) -> None:
    """Once the broker is back: the buffer drains with nothing lost, and the planner counts exactly the
    `request.observed` events the emitter sent."""
    emitter = sink.emitter
    await wait_for(lambda: emitter.stats.buffered == 0, timeout_s=WAIT_S, what="the emitter's buffer sent")
    stats = emitter.stats
    assert stats.lost == 0 and stats.rejected == during.rejected
    assert stats.sent == stats.emitted == sink.accepted.total()
    await until_counted(parts.dsn, produced + sink.accepted[RequestObserved])


async def replanned(parts: Fleet, warmer: Warmer) -> None:
    """Every group resumed: an epoch bump reaches the planner, whose new plan reaches the warmer's plans
    consumer and is carried out and reported."""
    [driver] = warmer.drivers.values()
    await produce(parts.planner.kafka, [epoch_bumped("acme", parts.engine.model_name, 1)])
    await wait_for(lambda: plans_accepted(warmer) == 2, timeout_s=WAIT_S, what="the new plan received")
    view = (["verified", "verified"], ["ready"])
    await until_planner_sees(parts.dsn, driver.replica, view, "the new plan's outcome recorded")


async def on_the_topics(parts: Fleet, replica: str) -> None:
    """Each of the warmer's lifecycle and result events reached its topic (a retried publish may repeat
    one; consumers de-duplicate by event id)."""
    kafka = parts.planner.kafka
    topics = Topics(kafka.topic_prefix)
    lifecycle = {e.event_id: e for e in await events_on(kafka, topics.lifecycle, ReplicaEvent)}
    mine = [type(e).STATE for e in lifecycle.values() if e.replica == replica]
    assert mine == ["starting", "loading", "warming", "ready"]
    finished = {e.event_id: e for e in await events_on(kafka, topics.warm_results, WarmFinished)}
    assert len(finished) == 2
    assert all(e.replica == replica and e.verified_hits and not e.failures for e in finished.values())


async def test_a_frozen_broker_holds_up_no_chat_loses_nothing_sent_and_the_warmers_reports_wait_for_it(
    tmp_path: Path, migrated_database: str, own_engine: EmbeddedVllm
) -> None:
    with EmbeddedKafka(tmp_path / "kafka") as broker, thawed_at_exit(broker, own_engine):
        parts = fleet(broker, own_engine, migrated_database)
        kafka = parts.planner.kafka
        traffic, _ = conversation_traffic(parts.rng, 4, repeats=3)
        await produce(kafka, traffic)
        emitter = Emitter(kafka, parts.gateway.emitter, Topics(kafka.topic_prefix))  # as `Gateway` builds it
        sink = CountingSink(emitter)
        async with (
            running_planner(parts.planner),
            emitter,
            Gateway(parts.gateway, sink=sink) as gateway,
            httpx.AsyncClient(base_url=gateway.url, timeout=TIMEOUT) as client,
        ):
            await before_the_outage(client, parts, sink, len(traffic))
            own_engine.freeze()
            async with Warmer(parts.warmer) as warmer:
                [driver] = warmer.drivers.values()
                await wait_for(
                    lambda: plans_accepted(warmer) == 1, timeout_s=WAIT_S, what="the plan received"
                )
                assert driver.tracker.phase is Phase.STARTING  # planned, not warmed: the engine is frozen
                at_freeze = emitter.stats.sent, sink.calls
                broker.freeze()
                frozen_at = time.monotonic()
                own_engine.thaw()
                await wait_for(
                    lambda: reports_held_back(warmer), timeout_s=WAIT_S, what="the replica ready, unreported"
                )
                latencies = await serve_through_outage(client, parts, sink, frozen_at)
                assert max(latencies) < MAX_CHAT_S, latencies
                during = await during_the_outage(parts, sink, at_freeze, gateway, warmer)
                broker.thaw()
                await after_the_outage(parts, sink, during, len(traffic))
                await until_planner_sees(
                    parts.dsn, driver.replica, (["verified"], ["ready"]), "the warm reported"
                )
                await replanned(parts, warmer)
            assert await requests_counted(parts.dsn) == len(traffic) + sink.accepted[RequestObserved]
        await on_the_topics(parts, driver.replica)
