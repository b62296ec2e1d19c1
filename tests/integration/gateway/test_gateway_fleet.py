"""The gateway on real parts: two vLLM engines (one core each), the embedded broker, lifecycle events.

The engines are shared by the tests of this module; each test uses fresh topics, tenants' secrets and
prompts (random words from a generator seeded afresh), so no test finds another's cached blocks. The
test that kills an engine runs last.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import tempfile
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
from pydantic import SecretStr

from tests.integration.gateway_harness import (
    TIMEOUT,
    announce,
    cached_tokens,
    chat_body,
    epoch_bumped,
    gateway_settings,
    headers,
    kafka_settings,
    sse_payloads,
    stream_summary,
    vllm_requests,
    wait_ready,
)
from tests.integration.planner_harness import events_on, poll_until, produce
from tests.integration.warmer_harness import status_code, warmer_settings
from warmplane.services.gateway.openai_request import chain_of, decode
from warmplane.services.gateway.service import Gateway
from warmplane.services.warmer.service import Warmer
from warmplane.services.warmer.settings import DrainSettings, ReadinessSettings, WarmSettings
from warmplane.services.warmer.vllm_client import requests_in_flight
from warmplane.shared.cache_salt import derive_cache_salt
from warmplane.shared.embedded import EmbeddedKafka
from warmplane.shared.embedded.vllm_engine import EmbeddedVllm, ensure_tiny_model
from warmplane.shared.events import Event, PrefixMissed, ReplicaEvent, RequestObserved
from warmplane.shared.hash_ring import HashRing
from warmplane.shared.prefix_chain import Namespace
from warmplane.shared.topics import Topics


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, EmbeddedVllm]]:
    """Replicas r0 and r1: two engines started side by side, each pinned to its own core."""
    model_dir = ensure_tiny_model()
    with tempfile.TemporaryDirectory(prefix="warmplane-test-gateway-") as folder:
        fleet = {
            f"r{core}": EmbeddedVllm(Path(folder) / f"r{core}", model_dir, omp_threads_bind=core)
            for core in (0, 1)
        }
        try:
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(lambda engine: engine.start(), fleet.values()))
            yield fleet
        finally:
            for engine in fleet.values():
                engine.stop()


@pytest.fixture
def rng() -> random.Random:
    return random.Random(uuid.uuid4().int)


async def test_a_replica_that_is_not_ready_receives_nothing_and_a_prefix_keeps_its_replica(
    embedded_kafka: EmbeddedKafka, engines: dict[str, EmbeddedVllm], rng: random.Random
) -> None:
    kafka = kafka_settings(embedded_kafka.bootstrap_servers)
    run = uuid.uuid4().hex[:8]
    settings, keys = gateway_settings(kafka, run)
    model = engines["r0"].model_name
    await announce(kafka, engines, ready={"r0"})
    before = await vllm_requests(engines["r1"])
    # Prompts the shared ring gives to each replica, so the test cannot pass by chance.
    ring = HashRing(["r0", "r1"], vnodes=settings.routing.vnodes, load_factor=settings.routing.load_factor)
    bodies: list[dict[str, Any]] = []
    owners: list[str] = []
    while len(bodies) < 8 or len(set(owners)) < 2:
        body = chat_body(rng, model)
        root = chain_of(decode(json.dumps(body).encode(), "chat"), Namespace("acme", model)).ids[0]
        bodies.append(body)
        owners.append(ring.owner(root))
    async with (
        Gateway(settings) as gateway,
        httpx.AsyncClient(base_url=gateway.url, timeout=TIMEOUT) as client,
    ):
        for body in bodies:
            response = await client.post("/v1/chat/completions", json=body, headers=headers(keys["acme"]))
            assert (response.status_code, response.headers["x-warmplane-replica"]) == (200, "r0")
        assert await vllm_requests(engines["r1"]) == before

        await announce(kafka, {"r1": engines["r1"]}, ready={"r1"})
        await wait_ready(gateway, model, 2)
        served: dict[int, list[str]] = {}
        for i, body in enumerate(bodies * 3):
            response = await client.post("/v1/chat/completions", json=body, headers=headers(keys["acme"]))
            assert response.status_code == 200
            served.setdefault(i % len(bodies), []).append(response.headers["x-warmplane-replica"])
    assert all(len(set(replicas)) == 1 for replicas in served.values()), served
    assert [served[i][0] for i in range(len(bodies))] == owners  # each on its ring owner: r0 and r1


async def test_tenants_get_different_salts_and_never_read_each_others_cache(
    embedded_kafka: EmbeddedKafka, engines: dict[str, EmbeddedVllm], rng: random.Random
) -> None:
    kafka = kafka_settings(embedded_kafka.bootstrap_servers)
    run = uuid.uuid4().hex[:8]
    settings, keys = gateway_settings(kafka, run)
    engine = engines["r0"]
    await announce(kafka, {"r0": engine}, ready={"r0"})
    body = chat_body(rng, engine.model_name)
    async with (
        Gateway(settings) as gateway,
        httpx.AsyncClient(base_url=gateway.url, timeout=TIMEOUT) as client,
    ):
        cold = await client.post("/v1/chat/completions", json=body, headers=headers(keys["acme"]))
        warm = await client.post("/v1/chat/completions", json=body, headers=headers(keys["acme"]))
        other = await client.post("/v1/chat/completions", json=body, headers=headers(keys["globex"]))
        # An epoch bump on the lifecycle topic moves acme to a fresh namespace: its blocks are not found.
        await produce(kafka, [epoch_bumped("acme", engine.model_name, 1)])
        assert gateway.parts is not None
        epochs = gateway.parts.epochs

        async def bumped() -> bool:
            return epochs.epoch("acme", engine.model_name) == 1

        await poll_until(bumped, timeout_s=20, what="the gateway to see acme's epoch 1")
        moved = await client.post("/v1/chat/completions", json=body, headers=headers(keys["acme"]))
    assert cached_tokens(moved) == 0
    assert [cached_tokens(r) for r in (cold, warm)] == [0, cached_tokens(warm)] and cached_tokens(warm) > 0
    assert cached_tokens(other) == 0
    # The gateway salted acme's requests with exactly the warmer's salt: the engine, called directly under
    # it, finds acme's blocks.
    salt = derive_cache_salt(SecretStr(f"salt-acme-{run}"), "acme", engine.model_name, 0)
    async with httpx.AsyncClient(timeout=TIMEOUT) as direct:
        again = await direct.post(f"{engine.base_url}/v1/chat/completions", json={**body, "cache_salt": salt})
    assert cached_tokens(again) == cached_tokens(warm)

    topics = Topics(kafka.topic_prefix)
    observed = await events_on(kafka, topics.requests, Event)
    assert all(isinstance(event, RequestObserved) for event in observed)
    by_tenant = sorted((e.tenant, e.cached_tokens) for e in observed if isinstance(e, RequestObserved))
    assert by_tenant == sorted([("acme", 0), ("acme", cached_tokens(warm)), ("acme", 0), ("globex", 0)])
    assert sorted(e.epoch or 0 for e in observed if isinstance(e, RequestObserved)) == [0, 0, 0, 1]
    misses = await events_on(kafka, topics.misses, Event)
    assert sorted(e.tenant for e in misses if isinstance(e, PrefixMissed)) == ["acme", "acme", "globex"]


@pytest.mark.parametrize("include_usage", [False, True])
async def test_a_stream_through_the_gateway_is_what_the_engine_streams_directly(
    embedded_kafka: EmbeddedKafka, engines: dict[str, EmbeddedVllm], rng: random.Random, include_usage: bool
) -> None:
    kafka = kafka_settings(embedded_kafka.bootstrap_servers)
    run = uuid.uuid4().hex[:8]
    settings, keys = gateway_settings(kafka, run)
    await announce(kafka, engines, ready=set(engines))
    body = chat_body(rng, engines["r0"].model_name, stream=True, max_tokens=24)
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    async with (
        Gateway(settings) as gateway,
        httpx.AsyncClient(base_url=gateway.url, timeout=TIMEOUT) as client,
    ):
        await wait_ready(gateway, body["model"], 2)
        # The first stream from a replica shows the gateway its fingerprint; the second is relayed with it.
        streams = [
            await client.post("/v1/chat/completions", json=body, headers=headers(keys["acme"]))
            for _ in range(2)
        ]
    assert streams[0].headers["x-warmplane-replica"] == streams[1].headers["x-warmplane-replica"]
    engine = engines[streams[0].headers["x-warmplane-replica"]]
    salt = derive_cache_salt(SecretStr(f"salt-acme-{run}"), "acme", engine.model_name, 0)
    async with httpx.AsyncClient(timeout=TIMEOUT) as direct:
        straight = await direct.post(
            f"{engine.base_url}/v1/chat/completions", json={**body, "cache_salt": salt}
        )
    theirs = stream_summary(straight.content)
    for through in streams:
        assert through.headers["content-type"] == straight.headers["content-type"]
        ours = stream_summary(through.content)
        assert ours == theirs
        # All 24 tokens were generated ("length"); the tiny random model's tokens may decode to no text at all
        # (a clean-clone CI run saw it), which the comparison with the engine's own stream above covers.
        assert ours["finish"] == {0: "length"} and ours["terminator"] == "[DONE]"
        assert any("usage" in keys for keys in ours["last"]) == include_usage
        assert fingerprints(through.content) == fingerprints(straight.content) != []


def fingerprints(raw: bytes) -> list[object]:
    """The `system_fingerprint` of each chunk that has one, in order."""
    chunks = [event for event in sse_payloads(raw) if isinstance(event, dict)]
    return [chunk["system_fingerprint"] for chunk in chunks if "system_fingerprint" in chunk]


async def test_a_drained_replica_leaves_routing_with_no_request_failed(
    embedded_kafka: EmbeddedKafka, engines: dict[str, EmbeddedVllm], rng: random.Random
) -> None:
    """Two warmers, one replica each, traffic flowing through the gateway; one warmer drains (as on
    SIGTERM when its pod goes). Its replica is announced draining, then stopped only after the long
    stream it was serving ended; no request fails; afterwards nothing reaches its engine."""
    # Routers see the drain within 0.1 s of its event, well inside the leaver's settling time (3 s: processes
    # here can stall for seconds while engines run: up to 5.6 s seen for an idle asyncio loop beside them).
    kafka = kafka_settings(embedded_kafka.bootstrap_servers).model_copy(update={"fetch_max_wait_ms": 100})
    settings, keys = gateway_settings(kafka, uuid.uuid4().hex[:8])
    # On a loaded 2-core machine this process (gateway, warmers, clients) can be starved past the gateway's
    # 2 s connect timeout, which ejects the one replica left: not what this test is about.
    settings.gateway = settings.gateway.model_copy(update={"connect_timeout_s": 15.0})
    model = engines["r0"].model_name
    secrets = {tenant: secret.get_secret_value() for tenant, secret in settings.tenant_secrets.items()}
    cold = ReadinessSettings(warm=False)  # ready once the engine answers: this test is about leaving
    # A loaded machine may answer /health slowly: that must not pass for a crash here (a crash takes the
    # replica out until it answers again, and the gateway would answer 503 meanwhile).
    patient = WarmSettings(health_interval_s=0.2, health_timeout_s=10, crash_after_failures=50)
    staying = warmer_settings(
        kafka, [engines["r0"]], node="staying", secrets=secrets, warm=patient, readiness=cold
    )
    leaving = warmer_settings(
        kafka, [engines["r1"]], node="leaving", secrets=secrets, warm=patient, readiness=cold
    ).model_copy(update={"drain": DrainSettings(settle_s=3.0, timeout_s=60.0)})
    gone = leaving.engines[0].replica
    ring = HashRing(
        sorted([gone, staying.engines[0].replica]),
        vnodes=settings.routing.vnodes,
        load_factor=settings.routing.load_factor,
    )
    long_body = body_owned_by(ring, gone, rng, model)
    long_body.update(stream=True, max_tokens=3000, ignore_eos=True)  # with the prompt, within 4,096
    outcomes: list[Outcome] = []

    async def send(
        client: httpx.AsyncClient, body: dict[str, Any], begun: asyncio.Event | None = None
    ) -> Outcome:
        async with client.stream(
            "POST", "/v1/chat/completions", json=body, headers=headers(keys["acme"])
        ) as response:
            chunks = []
            async for chunk in response.aiter_raw():
                chunks.append(chunk)
                if begun is not None:
                    begun.set()
                await asyncio.sleep(0)  # a fast stream must not starve the gateway and warmers beside it
        ended_at = datetime.now(UTC)  # before the parse, which takes a while for a long stream
        try:
            finish = stream_summary(b"".join(chunks))["finish"] if response.status_code == 200 else {}
        except (KeyError, TypeError):  # an error event in place of chunks
            finish = {}
        replica = response.headers.get("x-warmplane-replica", "")
        return Outcome(response.status_code, replica, finish, ended_at)

    async def traffic(client: httpx.AsyncClient, stop: asyncio.Event) -> None:
        # Paced, not closed-loop: back-to-back requests keep both engines' threads spinning on the machine's
        # two cores and starve this process (gateway, warmers and clients) for seconds, which fails requests
        # for reasons that are not the drain's (a CI run saw the client's own connect time out).
        while not stop.is_set():
            outcomes.append(await send(client, {**chat_body(rng, model), "stream": True, "max_tokens": 16}))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), _SEND_INTERVAL_S)

    async with (
        Gateway(settings) as gateway,
        Warmer(staying),
        Warmer(leaving) as leaver,
        # Idle connections dropped well before the gateway's server closes them (5 s): reusing one just as
        # it closes fails the request, a keep-alive race that is not the drain's.
        httpx.AsyncClient(base_url=gateway.url, timeout=_PATIENT, limits=_EAGER_EXPIRY) as client,
    ):
        await wait_ready(gateway, model, 2)
        begun = asyncio.Event()
        long_stream = asyncio.create_task(send(client, long_body, begun))
        async with asyncio.timeout(20):
            await begun.wait()  # the engine is generating it
        stop = asyncio.Event()
        senders = [asyncio.create_task(traffic(client, stop)) for _ in range(2)]
        await leaver.drain("the test drains it")
        left_running = await engine_in_flight(engines["r1"])  # the engine's word, whatever the load here
        stop.set()
        await asyncio.gather(*senders)
        long_outcome = long_stream.result()
        served_before = await vllm_requests(engines["r1"])
        short = {"stream": True, "max_tokens": 4}
        after = [await send(client, {**chat_body(rng, model), **short}) for _ in range(6)]
        assert await status_code(leaver.http_port, "/ready") == 503
        assert await status_code(leaver.http_port, "/drained") == 200

    assert (long_outcome.status, long_outcome.replica, long_outcome.finish) == (200, gone, {0: "length"})
    failed = [o for o in outcomes + after if o.status != 200 or not o.finish or None in o.finish.values()]
    assert failed == [], failed
    assert len(outcomes) > 0
    assert {outcome.replica for outcome in after} == {staying.engines[0].replica}
    assert await vllm_requests(engines["r1"]) == served_before  # nothing reached it once stopped
    lifecycle = await events_on(kafka, Topics(kafka.topic_prefix).lifecycle, ReplicaEvent)
    events = [event for event in lifecycle if event.replica == gone]
    assert [event.STATE for event in events][-2:] == ["draining", "gone"], events
    draining, stopped = events[-2:]
    assert stopped.reason == "drained: no request in flight"
    # Stopped only once the engine had nothing in flight (its own word), the long stream included, which
    # began before the drain and outlived its announcement. No bound on when the client read its last bytes:
    # on this machine a running engine can stall every other process for seconds.
    assert left_running == 0
    assert draining.occurred_at < long_outcome.ended_at


_EAGER_EXPIRY = httpx.Limits(keepalive_expiry=1.0)
# The client is this test's instrument, in the gateway's own process: a connect to a local listener completes
# in the kernel, so only this process being descheduled can time it out, and that is not a failed request.
_PATIENT = httpx.Timeout(60.0)
_SEND_INTERVAL_S = 0.1


class Outcome(NamedTuple):
    status: int
    replica: str
    finish: dict[int, str | None]
    """Each choice's finish reason; {} for a stream that broke."""
    ended_at: datetime


async def engine_in_flight(engine: EmbeddedVllm) -> int | None:
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        return requests_in_flight((await client.get(f"{engine.base_url}/metrics")).text)


def body_owned_by(ring: HashRing, replica: str, rng: random.Random, model: str) -> dict[str, Any]:
    """A chat body whose leading prefix the gateway's ring gives to `replica`."""
    while True:
        body = chat_body(rng, model)
        root = chain_of(decode(json.dumps(body).encode(), "chat"), Namespace("acme", model)).ids[0]
        if ring.owner(root) == replica:
            return body


async def test_a_replica_killed_mid_stream_ends_the_stream_cleanly_and_is_routed_around(
    embedded_kafka: EmbeddedKafka, engines: dict[str, EmbeddedVllm], rng: random.Random
) -> None:
    kafka = kafka_settings(embedded_kafka.bootstrap_servers)
    settings, keys = gateway_settings(kafka, uuid.uuid4().hex[:8])
    model = engines["r0"].model_name
    await announce(kafka, engines, ready=set(engines))
    async with (
        Gateway(settings) as gateway,
        httpx.AsyncClient(base_url=gateway.url, timeout=TIMEOUT) as client,
    ):
        await wait_ready(gateway, model, 2)
        bodies = [chat_body(rng, model) for _ in range(12)]
        owners = {}
        for i, body in enumerate(bodies):
            response = await client.post("/v1/chat/completions", json=body, headers=headers(keys["acme"]))
            owners[i] = response.headers["x-warmplane-replica"]
        victim = owners[0]
        long_stream = {**bodies[0], "stream": True, "max_tokens": 3000, "ignore_eos": True}
        async with client.stream(
            "POST", "/v1/chat/completions", json=long_stream, headers=headers(keys["acme"])
        ) as stream:
            assert stream.headers["x-warmplane-replica"] == victim
            received = b""
            async for chunk in stream.aiter_raw():
                if not received:
                    await asyncio.to_thread(engines[victim].kill)
                received += chunk
        last = sse_payloads(received)[-1]
        assert last["error"]["code"] == "upstream_error", last
        for i, body in enumerate(bodies):
            response = await client.post("/v1/chat/completions", json=body, headers=headers(keys["acme"]))
            assert response.status_code == 200
            assert response.headers["x-warmplane-replica"] != victim
            if owners[i] != victim:
                assert response.headers["x-warmplane-replica"] == owners[i]  # the others did not move
