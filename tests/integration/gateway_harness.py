"""Running the gateway against real engines and a real broker in integration tests.

Replicas are announced the way the warmer announces them: lifecycle events on the lifecycle topic,
which the gateway replays from the earliest offset when it starts.
"""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import msgspec
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from tests.integration.planner_harness import poll_until, produce
from warmplane.services.gateway.service import Gateway
from warmplane.services.gateway.settings import (
    GatewayOptions,
    GatewaySettings,
    ResultCacheSettings,
    RoutingSettings,
    StaticReplica,
)
from warmplane.shared.embedded.vllm_engine import BLOCK_SIZE, EmbeddedVllm
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import EpochBumped, ModelRef, ReplicaBecameReady, ReplicaEvent, ReplicaStarted
from warmplane.shared.settings import EmitterSettings, KafkaSettings, PostgresSettings, RedisSettings

TENANTS = ("acme", "globex")
TIMEOUT = httpx.Timeout(60.0, connect=5.0)
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def kafka_settings(bootstrap_servers: str) -> KafkaSettings:
    """Fresh topics per test; short group sessions (the embedded broker waits half of one per join)."""
    return KafkaSettings(
        bootstrap_servers=bootstrap_servers,
        topic_prefix=f"gw{uuid.uuid4().hex[:8]}",
        partitions=2,
        session_timeout_ms=2_000,
        heartbeat_interval_ms=500,
    )


def gateway_settings(kafka: KafkaSettings, run: str) -> tuple[GatewaySettings, dict[str, str]]:
    """Settings with two tenants whose keys and salt secrets are fresh; and each tenant's API key."""
    keys = {tenant: f"sk-{tenant}-key-{run}" for tenant in TENANTS}
    settings = GatewaySettings(
        kafka=kafka,
        tenant_keys={tenant: [SecretStr(key)] for tenant, key in keys.items()},
        tenant_secrets={tenant: SecretStr(f"salt-{tenant}-{run}") for tenant in TENANTS},
        gateway=GatewayOptions(
            http_host="127.0.0.1",
            http_port=0,
            metrics_port=0,
            block_size=BLOCK_SIZE,
            instance=f"test-{run}",
            catch_up_timeout_s=20,
            registry_seed=False,  # the tests that want the registry give it a database
        ),
        routing=RoutingSettings(ramp_s=0),
        emitter=EmitterSettings(linger_ms=1, close_timeout_s=5),
    )
    return settings, keys


def epoch_bumped(tenant: str, model: str, epoch: int) -> EpochBumped:
    return EpochBumped(
        event_id=new_event_id(),
        occurred_at=datetime.now(UTC),
        producer="planner/test",
        tenant=tenant,
        model=ModelRef(model, "tiny-rev"),
        epoch=epoch,
    )


def lifecycle(cls: type[ReplicaEvent], replica: str, engine: EmbeddedVllm) -> ReplicaEvent:
    return cls(
        event_id=new_event_id(),
        occurred_at=datetime.now(UTC),
        producer="warmer/test-node",
        model=ModelRef(engine.model_name, "tiny-rev"),
        replica=replica,
        node="test-node",
        endpoint=engine.base_url,
    )


async def announce(kafka: KafkaSettings, replicas: dict[str, EmbeddedVllm], *, ready: set[str]) -> None:
    """Publish each replica as started, and those in `ready` as ready, as their warmer would."""
    events: list[ReplicaEvent] = []
    for name, engine in replicas.items():
        events.append(lifecycle(ReplicaStarted, name, engine))
        if name in ready:
            events.append(lifecycle(ReplicaBecameReady, name, engine))
    await produce(kafka, events)


async def wait_ready(gateway: Gateway, model: str, count: int) -> None:
    """Until the gateway sees `count` ready replicas of `model` (lifecycle events are asynchronous)."""
    assert gateway.parts is not None
    membership = gateway.parts.router.membership

    async def enough() -> bool:
        return len(membership.ready(model, datetime.now(UTC).timestamp())) >= count

    await poll_until(enough, timeout_s=20, what=f"{count} ready replicas of {model}")


def words(rng: random.Random, count: int) -> str:
    return " ".join("".join(rng.choices(_LETTERS, k=rng.randint(2, 9))) for _ in range(count)) + "."


def chat_body(rng: random.Random, model: str, **extra: Any) -> dict[str, Any]:
    """A chat whose system prompt (its chain root) is a few hundred tokens of fresh words."""
    messages = [
        {"role": "system", "content": words(rng, 120)},
        {"role": "user", "content": words(rng, 20)},
    ]
    return {"model": model, "messages": messages, "max_tokens": 4, "temperature": 0, "seed": 7, **extra}


def cached_tokens(response: httpx.Response) -> int:
    details = response.json()["usage"].get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def sse_payloads(raw: bytes) -> list[Any]:
    """The data of each event, with the per-call `id` and `created` removed; `[DONE]` kept as text."""
    events: list[Any] = []
    for event in raw.split(b"\n\n"):
        if not event:
            continue
        assert event.startswith(b"data: "), event
        data = event.removeprefix(b"data: ")
        if data == b"[DONE]":
            events.append("[DONE]")
            continue
        chunk = msgspec.json.decode(data)
        chunk.pop("id", None)
        chunk.pop("created", None)
        events.append(chunk)
    return events


async def vllm_requests(engine: EmbeddedVllm) -> float:
    """Requests the engine finished, from its own `/metrics` (`vllm:request_success_total`)."""
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        text = (await client.get(f"{engine.base_url}/metrics")).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total")
    )


def stream_summary(raw: bytes) -> dict[str, Any]:
    """What a chat stream says, independent of how the engine happened to batch tokens into chunks
    (vLLM merges deltas when its output loop falls behind): each choice's text and finish reason, the
    keys of each kind of chunk, the fields the last chunks carry, and the terminator."""
    events = sse_payloads(raw)
    chunks = [event for event in events if isinstance(event, dict)]
    text: dict[int, str] = {}
    finish: dict[int, str | None] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            text[choice["index"]] = text.get(choice["index"], "") + (choice["delta"].get("content") or "")
            finish[choice["index"]] = choice["finish_reason"]
    return {
        "text": text,
        "finish": finish,
        "keys": sorted({tuple(chunk) for chunk in chunks}),
        "last": [sorted(chunk) for chunk in chunks[-2:]],
        "model": {chunk["model"] for chunk in chunks},
        "terminator": events[-1],
    }


def headers(key: str, **extra: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}", **extra}


async def engine_served(engine: EmbeddedVllm, count: float) -> None:
    async def reached() -> bool:
        return await vllm_requests(engine) == count

    await poll_until(reached, timeout_s=10, what=f"the engine to have served {count} requests")


def metric_sample(text: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`, from Prometheus text."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def caching_gateway_settings(
    kafka_servers: str, engine: EmbeddedVllm, redis_url: str, dsn: str, **cache: Any
) -> tuple[GatewaySettings, dict[str, str]]:
    """A gateway in front of `engine` alone, with both tiers of its result cache on (Redis at `redis_url`,
    pgvector in `dsn`) and `cache`'s other settings, and its tenants' keys. The lookup and embedding
    budgets are seconds, not the production defaults' milliseconds: on a loaded CI machine an embedding
    that overran 50 ms skipped the semantic tier and turned an expected hit, or a counted error, into a
    plain miss."""
    cache = {"lookup_timeout_s": 2, "embedding_timeout_s": 2, **cache}
    settings, keys = gateway_settings(kafka_settings(kafka_servers), uuid.uuid4().hex[:8])
    model = engine.model_name
    settings = settings.model_copy(
        update={
            "static_replicas": [StaticReplica(replica="r0", url=engine.base_url, model=model)],
            "redis": RedisSettings(url=SecretStr(redis_url)),
            "postgres": PostgresSettings(url=SecretStr(dsn)),
            "result_cache": ResultCacheSettings(enabled=True, semantic=True, **cache),
        }
    )
    return settings, keys
