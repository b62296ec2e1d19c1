"""The API's door on the real Postgres and broker: a token before any body is read or parsed, bodies
bounded and typed, a per-caller rate limit, and `/metrics` (per-tenant figures) only on its own port."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from tests.integration.api_harness import (
    ACME,
    ADMIN,
    GLOBEX,
    READER,
    RunningApi,
    api_settings,
    bearer,
    running_api,
)
from tests.real_parts import fresh_database, planner_settings_for
from warmplane.shared.embedded import EmbeddedKafka, EmbeddedPostgres
from warmplane.shared.rate_limit import RateLimitSettings

_JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
async def api(
    embedded_kafka: EmbeddedKafka, embedded_postgres: EmbeddedPostgres
) -> AsyncIterator[RunningApi]:
    """The API over an empty database; admin actions go to the lifecycle topic (no planner reads it)."""
    async with fresh_database(embedded_postgres) as dsn:
        settings = api_settings(planner_settings_for(embedded_kafka.bootstrap_servers, dsn))
        async with running_api(settings) as running:
            yield running


async def _post(api: RunningApi, content: bytes, headers: dict[str, str]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=api.url, timeout=10) as client:
        return await client.post("/v1/deploys", content=content, headers=headers)


async def test_a_body_without_a_token_is_a_401_before_it_is_parsed(api: RunningApi) -> None:
    malformed = await _post(api, b"{oops", _JSON)
    assert malformed.status_code == 401 and malformed.headers["www-authenticate"] == "Bearer"
    unknown = await _post(api, b"{oops", {**_JSON, **bearer("not-a-token-of-ours-at-all")})
    assert unknown.status_code == 401
    # With a token the same body is parsed, and refused for what it is.
    assert (await _post(api, b"{oops", {**_JSON, **bearer(ADMIN)})).status_code == 422


async def test_a_body_over_the_limit_is_a_413_declared_or_streamed(api: RunningApi) -> None:
    limit = api.deps.options.max_body_bytes
    big = b'{"phase": "started", "model": "m", "pad": "' + b"x" * limit + b'"}'
    declared = await _post(api, big, {**_JSON, **bearer(ADMIN)})
    assert declared.status_code == 413 and str(limit) in declared.json()["error"]

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: the limit holds while reading
        for start in range(0, len(big), 4096):
            yield big[start : start + 4096]

    async with httpx.AsyncClient(base_url=api.url, timeout=10) as client:
        streamed = await client.post("/v1/deploys", content=chunks(), headers={**_JSON, **bearer(ADMIN)})
    assert streamed.status_code == 413
    # Without a token, a big body is a 401: it is not read.
    assert (await _post(api, big, _JSON)).status_code == 401


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
async def test_a_body_not_sent_as_json_is_a_415(api: RunningApi, content_type: str | None) -> None:
    headers = bearer(ADMIN) | ({"Content-Type": content_type} if content_type else {})
    refused = await _post(api, b'{"phase": "started", "model": "m"}', headers)
    assert refused.status_code == 415 and "application/json" in refused.json()["error"]


async def test_metrics_are_served_only_on_the_metrics_port(api: RunningApi) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        await client.get(f"{api.url}/v1/replicas", headers=bearer(READER))
        for token in (None, ACME, ADMIN):
            public = await client.get(f"{api.url}/metrics", headers=bearer(token) if token else {})
            assert public.status_code == 404 and "warmplane_api" not in public.text
        internal = (await client.get(f"{api.metrics_url}/metrics")).text
    assert 'warmplane_api_requests_total{route="/v1/replicas",status="200"}' in internal


async def test_a_tenant_over_its_rate_gets_429_with_retry_after_and_others_are_served(
    embedded_kafka: EmbeddedKafka, embedded_postgres: EmbeddedPostgres
) -> None:
    async with fresh_database(embedded_postgres) as dsn:
        settings = api_settings(planner_settings_for(embedded_kafka.bootstrap_servers, dsn))
        settings.api.rate_limit = RateLimitSettings(requests_per_s=0.01, burst=2)
        async with running_api(settings) as api, httpx.AsyncClient(base_url=api.url, timeout=10) as client:
            answered = [(await client.get("/v1/epochs", headers=bearer(ACME))).status_code for _ in range(2)]
            assert answered == [200, 200]
            refused = await client.get("/v1/epochs", headers=bearer(ACME))
            assert refused.status_code == 429 and refused.headers["retry-after"] == "100"
            assert (await client.get("/v1/epochs", headers=bearer(GLOBEX))).status_code == 200
            assert (await client.get("/v1/epochs", headers=bearer(READER))).status_code == 200
            # An unknown token is refused as unknown, whatever the rate: it has no budget to spend.
            assert (await client.get("/v1/epochs", headers=bearer("x" * 20))).status_code == 401
