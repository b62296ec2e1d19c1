"""What the gateway refuses before any work (no replica reached, nothing emitted), and where its
per-tenant metrics are not: bodies too deep or not JSON by type, tenants over their rate, keys too short
to start with, `/metrics` on the clients' port."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
from pydantic import SecretStr

from tests.unit.gateway.test_proxy import KEYS, MODEL, Harness, prompt, serving
from warmplane.services.gateway.openai_request import MAX_JSON_DEPTH
from warmplane.services.gateway.settings import GatewayOptions, GatewaySettings, RoutingSettings
from warmplane.shared.rate_limit import RateLimitSettings
from warmplane.shared.settings import MIN_KEY_CHARS


def _nested(depth: int) -> bytes:
    """A chat request whose message content nests `depth` arrays."""
    inner = b"[" * depth + b"]" * depth
    return b'{"model": "' + MODEL.encode() + b'", "messages": [{"role": "user", "content": ' + inner + b"}]}"


@pytest.fixture
async def gateway() -> AsyncIterator[Harness]:
    async with serving(RoutingSettings(ramp_s=0)) as harness:
        yield harness


async def _raw(
    gateway: Harness, body: bytes, content_type: str | None = "application/json"
) -> httpx.Response:
    headers = {"authorization": f"Bearer {KEYS['acme']}"}
    if content_type is not None:
        headers["content-type"] = content_type
    return await gateway.client.post("/v1/chat/completions", content=body, headers=headers)


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 1_000, 4_000])
async def test_a_body_nested_too_deep_is_a_counted_400_that_reaches_no_replica(
    gateway: Harness, depth: int
) -> None:
    response = await _raw(gateway, _nested(depth))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "too_deep" and str(MAX_JSON_DEPTH) in error["message"]
    assert gateway.fleet.received == [] and gateway.sink.events == []
    metrics = await gateway.metrics()
    assert 'warmplane_gateway_errors_total{code="too_deep",model="-",tenant="acme"} 1.0' in metrics


async def test_a_body_nested_within_the_bound_is_served(gateway: Harness) -> None:
    response = await _raw(gateway, _nested(MAX_JSON_DEPTH - 4))
    assert response.status_code == 200


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
async def test_a_body_not_sent_as_json_is_a_415_that_reaches_no_replica(
    gateway: Harness, content_type: str | None
) -> None:
    response = await _raw(gateway, json.dumps(prompt(1)).encode(), content_type)
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "unsupported_media_type"
    assert gateway.fleet.received == []
    served = await _raw(gateway, _nested(1), "application/json; charset=utf-8")
    assert served.status_code == 200


async def test_a_tenant_over_its_rate_gets_429_with_retry_after_and_other_tenants_are_served() -> None:
    options = GatewayOptions(
        block_size=32, max_body_bytes=8192, rate_limit=RateLimitSettings(requests_per_s=0.01, burst=2)
    )
    async with serving(RoutingSettings(ramp_s=0), options) as gateway:
        assert [(await gateway.post(prompt(i))).status_code for i in range(2)] == [200, 200]
        refused = await gateway.post(prompt(3))
        assert refused.status_code == 429 and refused.headers["retry-after"] == "100"
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert (await gateway.post(prompt(3), tenant="globex")).status_code == 200
        assert len(gateway.fleet.received) == 3
        models = await gateway.client.get("/v1/models", headers={"authorization": f"Bearer {KEYS['acme']}"})
        assert models.status_code == 429


async def test_metrics_are_not_served_on_the_clients_port(gateway: Harness) -> None:
    await gateway.post(prompt(1))
    response = await gateway.client.get("/metrics")
    assert response.status_code == 404 and "acme" not in response.text
    assert 'tenant="acme"' in await gateway.metrics()


def test_a_key_shorter_than_the_minimum_is_refused_at_start_naming_the_tenant_not_the_key() -> None:
    short = "k" * (MIN_KEY_CHARS - 1)
    with pytest.raises(ValueError, match=f"tenant 'acme' has an API key under {MIN_KEY_CHARS}") as refused:
        GatewaySettings(tenant_keys={"acme": [SecretStr(short)]}, tenant_secrets={"acme": SecretStr("salt")})
    assert short not in str(refused.value)
