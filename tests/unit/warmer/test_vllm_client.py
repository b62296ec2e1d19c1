"""The vLLM client's request shapes and failure mapping, over an in-memory transport (no sockets)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from warmplane.services.warmer.vllm_client import VllmEngineClient, WarmFailed, requests_in_flight
from warmplane.shared.events import PrefixPayload

Handler = Callable[[httpx.Request], httpx.Response]
CHAT = PrefixPayload(prefix_id=1, messages=[{"role": "system", "content": "Be brief."}])
_USAGE = {"usage": {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 64}}}


def _client(handler: Handler) -> VllmEngineClient:
    return VllmEngineClient(
        "http://engine:8000/",
        "m",
        connect_timeout_s=1.0,
        request_timeout_s=1.0,
        block_size=32,
        transport=httpx.MockTransport(handler),
    )


@pytest.mark.parametrize(
    ("prompt_tokens", "expected"), [(0, 0), (1, 0), (32, 0), (33, 32), (64, 32), (65, 64), (2000, 1984)]
)
def test_expected_cached_tokens_counts_whole_blocks_before_the_last_token(
    prompt_tokens: int, expected: int
) -> None:
    client = _client(lambda _: httpx.Response(200))
    assert client.expected_cached_tokens(prompt_tokens) == expected


async def test_chat_warm_renders_a_complete_turn_at_warm_priority() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, json.loads(request.content)))
        return httpx.Response(200, json=_USAGE)

    async with _client(handler) as client:
        result = await client.warm(CHAT, cache_salt="salt")
        await client.warm(PrefixPayload(prefix_id=2, prompt=[5, 6, 7]), cache_salt="salt", priority=3)
    assert (result.prompt_tokens, result.cached_tokens) == (100, 64)
    (chat_path, chat), (completions_path, completions) = seen
    assert chat_path == "/v1/chat/completions"
    assert chat["add_generation_prompt"] is False
    assert chat["continue_final_message"] is False
    assert (chat["model"], chat["max_tokens"], chat["priority"], chat["cache_salt"]) == ("m", 1, 10, "salt")
    assert chat["stream"] is False
    assert completions_path == "/v1/completions"
    assert (completions["prompt"], completions["priority"]) == ([5, 6, 7], 3)


async def test_an_empty_salt_is_left_out_of_the_request() -> None:
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=_USAGE)

    async with _client(handler) as client:
        await client.warm(CHAT, cache_salt="")
    [body] = seen
    assert "cache_salt" not in body


async def test_missing_cached_tokens_count_as_zero() -> None:
    async with _client(lambda _: httpx.Response(200, json={"usage": {"prompt_tokens": 9}})) as client:
        assert await client.probe(CHAT, cache_salt="s") == 0


@pytest.mark.parametrize(
    ("response", "fragment", "retryable"),
    [
        (
            httpx.Response(400, json={"error": {"message": "bad\nsalt", "code": 400}}),
            "HTTP 400: bad salt",
            False,
        ),
        (
            httpx.Response(503, json={"object": "error", "message": "overloaded"}),
            "HTTP 503: overloaded",
            True,
        ),
        (httpx.Response(500, text="Internal Server Error"), "HTTP 500: Internal Server Error", True),
        (httpx.Response(200, text="not json"), "not JSON", False),
        (httpx.Response(200, json={"choices": []}), "without usage.prompt_tokens", False),
    ],
)
async def test_bad_answers_raise_warm_failed_retryable_only_for_a_server_error(
    response: httpx.Response, fragment: str, retryable: bool
) -> None:
    async with _client(lambda _: response) as client:
        with pytest.raises(WarmFailed, match=fragment) as failure:
            await client.warm(CHAT, cache_salt="s")
    assert failure.value.retryable is retryable


@pytest.mark.parametrize(
    ("error", "fragment"),
    [
        (httpx.ConnectTimeout("slow"), "timed out \\(ConnectTimeout\\)"),
        (httpx.ReadTimeout("slow"), "timed out \\(ReadTimeout\\)"),
        (httpx.ConnectError("refused"), "ConnectError at http://engine:8000: refused"),
        (httpx.RemoteProtocolError("eof"), "RemoteProtocolError"),
    ],
)
async def test_transport_errors_raise_a_retryable_warm_failed_and_health_is_false(
    error: httpx.HTTPError, fragment: str
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise error

    async with _client(handler) as client:
        assert await client.health() is False
        with pytest.raises(WarmFailed, match=fragment) as failure:
            await client.warm(CHAT, cache_salt="s")
    assert failure.value.retryable


async def test_token_ids_tokenize_without_a_request() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError("no request expected")

    async with _client(handler) as client:
        assert await client.tokenize(PrefixPayload(prefix_id=1, prompt=[1, 2])) == [1, 2]


@pytest.mark.parametrize(
    ("metrics", "capacity"),
    [
        (
            '# HELP vllm:cache_config_info x\nvllm:cache_config_info{block_size="32",cache_dtype="auto",'
            'num_gpu_blocks="2048",enable_prefix_caching="True"} 1.0\n',
            2047 * 32,  # vLLM keeps one block back
        ),
        ("vllm:num_requests_running 0.0\n", None),  # an engine whose metrics do not say
    ],
)
async def test_kv_capacity_is_read_from_the_cache_config_gauge(metrics: str, capacity: int | None) -> None:
    client = _client(lambda request: httpx.Response(200, text=metrics))
    assert await client.kv_capacity_tokens() == capacity


async def test_an_unreachable_engine_has_no_known_kv_capacity() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    assert await _client(refuse).kv_capacity_tokens() is None


def test_requests_in_flight_are_the_running_and_waiting_gauges_of_every_engine() -> None:
    metrics = "\n".join(
        [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            'vllm:num_requests_running{engine="0",model_name="m"} 2.0',
            'vllm:num_requests_running{engine="1",model_name="m"} 1.0',
            'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0',
            'vllm:num_requests_running_total{model_name="m"} 99.0',  # another metric sharing the prefix
        ]
    )
    assert requests_in_flight(metrics) == 6
    assert requests_in_flight('vllm:num_requests_waiting{engine="0"} 0.0') == 0
    assert requests_in_flight("vllm:kv_cache_usage_perc 0.5") is None


async def test_requests_in_flight_is_unknown_when_the_engine_does_not_answer() -> None:
    async with _client(lambda request: httpx.Response(503)) as client:
        assert await client.requests_in_flight() is None
