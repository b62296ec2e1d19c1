"""What a single host hides, on hosts of the test's own (network namespaces, `network_hosts.py`): two nodes,
each a vLLM engine and its warmer, and a control host with the broker, the planner and the gateway, all
real processes (PostgreSQL on the control host too) that reach each other only by the addresses the test
gave them.

One run shows, in order: each warmer announces its replica at its node's address, not at the loopback it
reaches its engine on, and the gateway on another host serves from both; plans reach their own node (a
replica that joins after traffic is planned from it, warmed by its own warmer, verified, and its first
requests find their prefixes cached); a drained replica leaves routing with traffic flowing and no request
failed; a node lost without a word (its engine and warmer killed) is announced lost by the planner and
routed around.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import tempfile
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from pydantic import SecretStr
from pydantic_settings import BaseSettings

from tests.integration.gateway_harness import chat_body, headers
from tests.integration.network_hosts import (
    HostProcess,
    NetworkHosts,
    broker_on,
    database_on,
    print_logs,
    service,
)
from tests.integration.planner_harness import events_on, poll_until
from tests.integration.warmer_harness import conversation
from warmplane.services.gateway.settings import GatewayOptions, GatewaySettings, RoutingSettings
from warmplane.services.planner.settings import IngestSettings, PlannerSettings, PlanSettings
from warmplane.services.warmer.settings import (
    DrainSettings,
    EngineSettings,
    ReadinessSettings,
    WarmerSettings,
    WarmSettings,
)
from warmplane.shared.embedded.vllm_engine import BLOCK_SIZE, EmbeddedVllm, ensure_tiny_model
from warmplane.shared.events import (
    ReplicaBecameReady,
    ReplicaDrainingStarted,
    ReplicaLost,
    ReplicaStopped,
    WarmFinished,
    WarmPlanIssued,
)
from warmplane.shared.settings import HeartbeatSettings, KafkaSettings, PostgresSettings
from warmplane.shared.topics import Topics

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")

NODES = ("node-1", "node-2")
ENGINE_PORT, WARMER_PORT, GATEWAY_PORT = 8000, 8090, 8080
TENANT, KEY = "acme", "sk-acme-multi-host-key"
_TIMEOUT_S = 120.0
_CLIENT = httpx.Timeout(60.0)


def replica(node: str) -> str:
    return f"vllm-{node.removeprefix('node-')}"


class Fleet:
    """The hosts and what runs on them; `warmer(node)` starts (or starts again) a node's warmer."""

    def __init__(self, hosts: NetworkHosts, workdir: Path, kafka: KafkaSettings) -> None:
        self.hosts = hosts
        self.workdir = workdir
        self.kafka = kafka
        self.engines: dict[str, EmbeddedVllm] = {}
        self.warmers: dict[str, HostProcess] = {}

    def service(self, host: str, command: str, settings: BaseSettings) -> HostProcess:
        return service(self.hosts, host, command, settings, self.workdir)

    def warmer(self, node: str) -> HostProcess:
        engine = self.engines[node]
        settings = WarmerSettings(
            kafka=self.kafka,
            node=node,
            engines=[
                EngineSettings(
                    replica=replica(node),
                    url=f"http://127.0.0.1:{ENGINE_PORT}",  # the engine, private to its host
                    announce_url=engine.base_url,  # the node's address
                    served_model=engine.model_name,
                    block_size=BLOCK_SIZE,
                    kv_events_endpoint=engine.kv_events_endpoint,
                    kv_events_replay_endpoint=engine.kv_events_replay_endpoint,
                )
            ],
            tenant_secrets={TENANT: SecretStr("acme-salt-secret")},
            warm=WarmSettings(health_interval_s=0.2, progress_interval_s=0.2, request_timeout_s=30),
            readiness=ReadinessSettings(plan_wait_s=_TIMEOUT_S),
            drain=DrainSettings(settle_s=2.0, timeout_s=60.0),
            heartbeat=HeartbeatSettings(interval_s=1.0, missed=3),
            http_host="0.0.0.0",
            http_port=WARMER_PORT,
        )
        self.warmers[node] = self.service(node, "warmer", settings)
        return self.warmers[node]

    async def ready(self, node: str) -> None:
        url = f"http://{self.hosts.address(node)}:{WARMER_PORT}/ready"

        async def answers() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                async with httpx.AsyncClient(timeout=5.0) as http:
                    return (await http.get(url)).status_code == 200
            return False

        await poll_until(answers, timeout_s=_TIMEOUT_S, what=f"{node}'s warmer to answer /ready with 200")


@contextlib.contextmanager
def engines_on(hosts: NetworkHosts, workdir: Path) -> Iterator[dict[str, EmbeddedVllm]]:
    """An engine on each node, listening on every address of its host, pinned each to a core."""
    model = ensure_tiny_model()
    engines = {
        node: EmbeddedVllm(
            workdir / node,
            model,
            host=hosts.address(node),
            listen_host="0.0.0.0",
            port=ENGINE_PORT,
            wrapper=hosts.wrapper(node),
            omp_threads_bind=core,
            kv_events=True,
        )
        for core, node in enumerate(NODES)
    }
    try:
        with ThreadPoolExecutor(len(engines)) as pool:
            list(pool.map(lambda engine: engine.start(), engines.values()))
        yield engines
    finally:
        for engine in engines.values():
            engine.kill()


async def test_two_nodes_and_a_control_host() -> None:
    rng = random.Random(uuid.uuid4().int)
    with (
        tempfile.TemporaryDirectory(prefix="warmplane-multi-host-") as folder,
        NetworkHosts(["control", *NODES]) as hosts,
        engines_on(hosts, Path(folder)) as engines,
        broker_on(hosts, "control", Path(folder)) as kafka,
    ):
        async with database_on(hosts, "control", Path(folder)) as dsn:
            fleet = Fleet(hosts, Path(folder), kafka)
            fleet.engines = engines
            try:
                await _scenario(fleet, dsn, rng)
            except BaseException:
                print_logs(Path(folder))
                raise


async def _scenario(fleet: Fleet, dsn: str, rng: random.Random) -> None:
    hosts, kafka = fleet.hosts, fleet.kafka
    model = fleet.engines[NODES[0]].model_name
    planner = PlannerSettings(
        kafka=kafka,
        postgres=PostgresSettings(url=SecretStr(dsn)),
        ingest=IngestSettings(group_id="planner-multi-host", batch_timeout_ms=50),
        # This test is about where plans go, not what is worth warming: every prefix seen is planned, from
        # counts read afresh for each start (the second node starts seconds after the first was planned).
        plans=PlanSettings(min_expected_saved_tokens=0, min_reuse_probability=0.0, statistics_max_age_s=0),
        heartbeat=HeartbeatSettings(interval_s=1.0, missed=3),
        metrics_port=0,
    )
    fleet.service("control", "planner", planner)
    gateway = GatewaySettings(
        kafka=kafka,
        tenant_keys={TENANT: [SecretStr(KEY)]},
        tenant_secrets={TENANT: SecretStr("acme-salt-secret")},
        gateway=GatewayOptions(
            http_host="0.0.0.0",
            http_port=GATEWAY_PORT,
            metrics_port=9465,
            block_size=BLOCK_SIZE,
            instance="multi-host",
            registry_seed=False,
            connect_timeout_s=10.0,
        ),
        routing=RoutingSettings(ramp_s=0),
    )
    fleet.service("control", "gateway", gateway)
    first, second = NODES
    fleet.warmer(first)
    await fleet.ready(first)
    url = f"http://{hosts.address('control')}:{GATEWAY_PORT}"
    async with httpx.AsyncClient(
        base_url=url, timeout=_CLIENT, limits=httpx.Limits(keepalive_expiry=1.0)
    ) as client:
        await _served(client, model)
        history = [{**chat_body(rng, model), "messages": conversation(rng)} for _ in range(24)]
        for body in history * 3:
            assert (await _ask(client, body))[0] == replica(first)
        await poll_until(
            lambda: _catalogued(dsn, len(history)), timeout_s=_TIMEOUT_S, what="the history counted"
        )

        fleet.warmer(second)
        await fleet.ready(second)
        await _announced_at_node_addresses(fleet)
        await _planned_on_its_own_node(kafka, second)
        await _serves_from(client, lambda: chat_body(rng, model), replica(second))  # fresh prefixes
        answers = [await _ask(client, body) for body in history]  # the first the new replica sees of them
        on_second = [cached for served, cached in answers if served == replica(second)]
        assert on_second and all(cached > 0 for cached in on_second), answers

        await _drained_with_no_request_failed(fleet, client, model, rng)

        fleet.warmer(second)  # the same engine, a new start of its replica
        await fleet.ready(second)
        await _serves_from(client, lambda: chat_body(rng, model), replica(second))
        fleet.warmers[second].kill()  # the node is lost: engine and warmer at once, without a word
        fleet.engines[second].kill()
        lifecycle = Topics(kafka.topic_prefix).lifecycle

        async def announced_lost() -> bool:
            return any(e.replica == replica(second) for e in await events_on(kafka, lifecycle, ReplicaLost))

        await poll_until(announced_lost, timeout_s=_TIMEOUT_S, what="the lost node's replica announced lost")
        after = [await _ask(client, body) for body in history[:8]]
        assert {served for served, _ in after} == {replica(first)}


async def _ask(client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[str, int]:
    """Which replica answered `body` through the gateway, and its cached prompt tokens (200 required)."""
    response = await client.post("/v1/chat/completions", json=body, headers=headers(KEY))
    assert response.status_code == 200, response.text
    details = response.json()["usage"].get("prompt_tokens_details") or {}
    return response.headers["x-warmplane-replica"], int(details.get("cached_tokens") or 0)


async def _served(client: httpx.AsyncClient, model: str) -> None:
    async def answers() -> bool:
        with contextlib.suppress(httpx.HTTPError):
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
            return (
                await client.post("/v1/chat/completions", json=body, headers=headers(KEY))
            ).status_code == 200
        return False

    await poll_until(answers, timeout_s=_TIMEOUT_S, what="the gateway to serve through the first node")


async def _serves_from(client: httpx.AsyncClient, body: Callable[[], dict[str, Any]], wanted: str) -> None:
    """Until the gateway routes a request of `body()` to `wanted` (it follows the lifecycle topic)."""

    async def routed() -> bool:
        return (await _ask(client, body()))[0] == wanted

    await poll_until(routed, timeout_s=_TIMEOUT_S, what=f"the gateway to route to {wanted}")


async def _catalogued(dsn: str, count: int) -> bool:
    db = await asyncpg.connect(dsn)
    try:
        return int(await db.fetchval("SELECT count(*) FROM prefix_catalog")) >= count
    finally:
        await db.close()


async def _announced_at_node_addresses(fleet: Fleet) -> None:
    lifecycle = Topics(fleet.kafka.topic_prefix).lifecycle
    ready = await events_on(fleet.kafka, lifecycle, ReplicaBecameReady)
    endpoints = {event.replica: event.endpoint for event in ready}
    expected = {replica(n): f"http://{fleet.hosts.address(n)}:{ENGINE_PORT}" for n in NODES}
    assert endpoints == expected


async def _planned_on_its_own_node(kafka: KafkaSettings, node: str) -> None:
    topics = Topics(kafka.topic_prefix)
    plans = [p for p in await events_on(kafka, topics.plans, WarmPlanIssued) if p.replica == replica(node)]
    assert plans and all(plan.node == node for plan in plans), plans
    [plan] = [p for p in plans if p.items]
    finished = await events_on(kafka, topics.warm_results, WarmFinished)
    [outcome] = [f for f in finished if f.plan_id == plan.plan_id]
    assert outcome.producer == f"warmer/{node}"
    assert outcome.verified_hits > 0 and not outcome.partial and not outcome.failures, outcome
    assert not any("unknown replica" in str(f.failures) for f in finished), finished


async def _drained_with_no_request_failed(
    fleet: Fleet, client: httpx.AsyncClient, model: str, rng: random.Random
) -> None:
    """SIGTERM the second node's warmer (its pod deleted) while traffic flows: draining, then stopped."""
    leaving = NODES[1]
    outcomes: list[tuple[int, str]] = []
    stop = asyncio.Event()

    async def traffic() -> None:
        while not stop.is_set():  # paced: both engines spinning back to back would starve every host here
            body = {**chat_body(rng, model), "max_tokens": 8}
            response = await client.post("/v1/chat/completions", json=body, headers=headers(KEY))
            outcomes.append((response.status_code, response.headers.get("x-warmplane-replica", "")))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)

    senders = [asyncio.create_task(traffic()) for _ in range(2)]

    async def serving() -> bool:
        return replica(leaving) in {served for _, served in outcomes}

    await poll_until(serving, timeout_s=_TIMEOUT_S, what=f"{replica(leaving)} serving the traffic")
    exit_code = await asyncio.to_thread(fleet.warmers[leaving].terminate)
    stop.set()
    await asyncio.gather(*senders)
    assert exit_code == 0
    assert all(status == 200 for status, _ in outcomes), outcomes
    lifecycle = Topics(fleet.kafka.topic_prefix).lifecycle
    draining = await events_on(fleet.kafka, lifecycle, ReplicaDrainingStarted)
    stopped = [
        e for e in await events_on(fleet.kafka, lifecycle, ReplicaStopped) if type(e) is ReplicaStopped
    ]
    assert [e.replica for e in draining] == [replica(leaving)]
    assert [(e.replica, e.reason) for e in stopped] == [(replica(leaving), "drained: no request in flight")]
    after = [(await _ask(client, {**chat_body(rng, model), "max_tokens": 2}))[0] for _ in range(6)]
    assert set(after) == {replica(NODES[0])}
