"""Chat traffic as a client sends it: an open loop that sends each request at its time, streamed, and
records what a client sees: time to the first chunk, which replica answered, and the engine's usage figures.
The main job's live traffic and the scale-up scenario (`bench.scaleup`) both send with it.

Open loop: a request is sent at its time whether or not earlier ones have been answered, as users do, so a
slow replica builds a queue instead of slowing the offered load. Which replica served a request is the
gateway's `x-warmplane-replica` header when there is one; else it is read from the chunks' `model` field:
each engine is started with its own name first (`smol-r1`) and the shared name second, and vLLM answers
with its first served name (`vllm/entrypoints/openai/models/serving.py`, `model_name()`), whichever name
the client asked for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import httpx
import msgspec

from warmplane.services.devstack.chat_traffic import ChatRequest

REQUEST_TIMEOUT_S = 300.0
REPLICA_HEADER = "x-warmplane-replica"
"""The gateway's answer names the replica that served it (`warmplane.services.gateway.proxy`)."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One request as the client saw it; times in seconds on the run's clock (`time.monotonic`)."""

    sent: float
    ttft: float | None
    """From sending to the first streamed chunk; None when no chunk came."""
    replica: str | None
    status: int
    prompt_tokens: int = 0
    cached_tokens: int = 0
    error: str = ""


class _Chunk(msgspec.Struct):
    model: str = ""
    usage: dict[str, object] | None = None


_decode = msgspec.json.Decoder(_Chunk).decode


def replica_of(model: str, prefix: str) -> str | None:
    """The replica an answer's `model` names (`smol-r1` with prefix `smol-` is `r1`)."""
    return model[len(prefix) :] if model.startswith(prefix) else None


async def _send(
    client: httpx.AsyncClient, path: str, body: dict[str, object], headers: dict[str, str], prefix: str
) -> Sample:
    sent = time.monotonic()
    ttft: float | None = None
    replica: str | None = None
    usage: dict[str, object] | None = None
    try:
        async with client.stream("POST", path, json=body, headers=headers) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")[:300]
                return Sample(sent, None, None, response.status_code, error=text)
            replica = response.headers.get(REPLICA_HEADER)
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                if ttft is None:
                    ttft = time.monotonic() - sent
                chunk = _decode(line[6:])
                replica = replica or replica_of(chunk.model, prefix)
                usage = chunk.usage or usage
    except httpx.HTTPError as exc:
        return Sample(sent, ttft, replica, 0, error=f"{type(exc).__name__}: {exc}"[:300])
    details = usage.get("prompt_tokens_details") if usage else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    prompt = usage.get("prompt_tokens") if usage else None
    return Sample(
        sent,
        ttft,
        replica,
        200,
        prompt_tokens=prompt if isinstance(prompt, int) else 0,
        cached_tokens=cached if isinstance(cached, int) else 0,
    )


def _body(request: ChatRequest, model: str, extra: Mapping[str, object]) -> dict[str, object]:
    return {
        **extra,
        "model": model,
        "messages": request.messages,
        "max_tokens": request.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "temperature": 0,
    }


async def closed_loop(
    base_url: str, requests: Sequence[ChatRequest], *, model: str, extra_body: Mapping[str, object]
) -> list[Sample]:
    """Send `requests` one after another to `base_url`'s chat completions, streamed, with `extra_body`'s
    fields added: what each costs with nothing else in flight."""
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=10.0)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout) as client:
        return [
            await _send(client, "/v1/chat/completions", _body(request, model, extra_body), {}, "")
            for request in requests
        ]


async def within(
    base_url: str,
    requests: Sequence[ChatRequest],
    *,
    model: str,
    headers: dict[str, str],
    concurrency: int,
    budget_s: float,
) -> list[Sample]:
    """Send `requests` in order, `concurrency` at a time, until all were sent or `budget_s` has passed
    (those not yet sent then are not); the samples of those sent, in the order they were sent. Sized to
    the time, not to the count: a slow machine sends fewer, none waits in a queue it cannot drain."""
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=10.0)
    deadline = time.monotonic() + budget_s
    pending = iter(enumerate(requests))
    samples: dict[int, Sample] = {}

    async def worker(client: httpx.AsyncClient) -> None:
        for index, request in pending:
            if time.monotonic() > deadline:
                return
            body = _body(request, model, {})
            samples[index] = await _send(client, "/v1/chat/completions", body, headers, "")

    async with httpx.AsyncClient(base_url=base_url, timeout=timeout) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return [samples[index] for index in sorted(samples)]


async def service_times(
    base_url: str, requests: Sequence[ChatRequest], *, model: str
) -> list[tuple[float, Sample]]:
    """Send `requests` one after another (closed loop) and time each to its last chunk: what one request
    costs the engine alone, in seconds, beside its sample (its time to first token and its prompt tokens
    found cached). Raises `RuntimeError` for a request that fails."""
    timed = []
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=10.0)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout) as client:
        for request in requests:
            began = time.monotonic()
            sample = await _send(client, "/v1/chat/completions", _body(request, model, {}), {}, "")
            if sample.status != 200:
                raise RuntimeError(f"a calibration request failed: {sample.status} {sample.error}")
            timed.append((time.monotonic() - began, sample))
    return timed


async def replay(
    base_url: str,
    requests: Sequence[ChatRequest],
    *,
    model: str,
    replica_prefix: str,
    headers: dict[str, str],
    start: float,
    extra_body: Mapping[str, object] | None = None,
) -> list[Sample]:
    """Send every request at `start + at_s` (monotonic clock) to `base_url`'s chat completions, with
    `extra_body`'s fields added (an engine's `cache_salt`); the samples in the order the requests were
    sent. Returns once every request has been answered or has failed."""
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=10.0)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout) as client:
        tasks = []
        for request in requests:
            delay = start + request.at_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # the open loop's schedule, not a wait for a condition
            body = _body(request, model, extra_body or {})
            tasks.append(
                asyncio.create_task(_send(client, "/v1/chat/completions", body, headers, replica_prefix))
            )
        return list(await asyncio.gather(*tasks))
