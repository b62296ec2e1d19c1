"""The warmer's adapter to one vLLM replica: warm a prefix, probe that it stuck, ask for health.

A warm request must render to the same tokens as the real traffic that will reuse it (design brief,
section 5), under the same ``cache_salt`` (section 7):

- ``messages`` go to ``/v1/chat/completions`` with ``add_generation_prompt`` and ``continue_final_message``
  off, so the rendering ends on a complete turn and is a strict token prefix of the next real turn;
- ``prompt`` (text or token ids) goes to ``/v1/completions``; token ids are sent as they are (text gets the
  tokenizer's BOS there, as real completions traffic does).

Every request asks for one token at temperature 0, and for the prompt's token ids (``return_token_ids``:
the warmer follows those blocks in the engine's KV events), at ``priority`` 10 by default (the engine
serves lower numbers first, so real traffic overtakes queued warm-ups). vLLM reuses only whole blocks
and always recomputes the last prompt token, so a stuck warm-up shows as ``cached_tokens ==
expected_cached_tokens(prompt_tokens)`` on a repeat (:meth:`VllmEngineClient.probe`).

Contracts: every call is bounded by the constructor's timeouts; nothing is retried here (the warmer
decides); every failure, HTTP status or transport error, raises :class:`WarmFailed` with a one-line reason;
``health()`` never raises for an unreachable engine. The client owns its ``httpx.AsyncClient``:
``async with`` (or ``aclose()``) closes it.
"""

from __future__ import annotations

import functools
import re
import ssl
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Protocol, Self

import httpx

from warmplane.shared.events import PrefixPayload
from warmplane.shared.kv_blocks import cacheable_tokens

WARM_PRIORITY: Final = 10
_MAX_REASON_CHARS: Final = 300
#: The chat rendering ends on the complete last turn: a strict token prefix of the next real turn's prompt.
#: (``continue_final_message`` would drop the end-of-turn tokens and lose a block 2 times in 32.)
_LABEL: Final = re.compile(r'(\w+)="([^"]*)"')
_RENDER_AS_COMPLETE_TURN: Final = {"add_generation_prompt": False, "continue_final_message": False}


class WarmFailed(Exception):
    """A warm, probe or tokenize request did not succeed; ``reason`` is one line, e.g. ``HTTP 400: ...``.

    ``retryable`` is true for what may pass on a second try (a timeout, a transport error, an HTTP 5xx),
    false for a rejection of the request itself (HTTP 4xx, a malformed answer).
    """

    def __init__(self, reason: str, *, retryable: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retryable = retryable


@dataclass(frozen=True, slots=True)
class WarmResult:
    """What the engine reported for one warm request: token counts, wall time in seconds, and the
    prompt's token ids (None from an engine that does not return them)."""

    prompt_tokens: int
    cached_tokens: int
    elapsed_s: float
    prompt_token_ids: list[int] | None = None


class EngineClient(Protocol):
    """What the warmer's parts need of an engine; `VllmEngineClient` is the real one."""

    @property
    def block_size(self) -> int: ...
    def expected_cached_tokens(self, prompt_tokens: int) -> int: ...
    async def health(self) -> bool: ...
    async def kv_capacity_tokens(self) -> int | None: ...
    async def requests_in_flight(self) -> int | None: ...
    async def warm(
        self, payload: PrefixPayload, *, cache_salt: str, priority: int = WARM_PRIORITY
    ) -> WarmResult: ...


class VllmEngineClient:
    """One vLLM OpenAI-compatible server at ``base_url`` serving ``model``.

    ``connect_timeout_s`` bounds opening a connection, ``request_timeout_s`` each read, write and pool wait
    of a warm, probe or tokenize request, and ``health_timeout_s`` the whole ``/health`` call. ``block_size``
    is the engine's KV block size in tokens. ``transport`` replaces the network (tests).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        connect_timeout_s: float,
        request_timeout_s: float,
        health_timeout_s: float = 2.0,
        block_size: int,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.block_size = block_size
        self._health_timeout = httpx.Timeout(health_timeout_s)
        timeout = httpx.Timeout(request_timeout_s, connect=connect_timeout_s)
        self._http = httpx.AsyncClient(
            base_url=self.base_url, timeout=timeout, transport=transport, verify=_tls_context()
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool; the client is unusable afterwards."""
        await self._http.aclose()

    def expected_cached_tokens(self, prompt_tokens: int) -> int:
        """Cached tokens a repeat of a ``prompt_tokens``-long prompt finds: whole blocks before its last."""
        return cacheable_tokens(prompt_tokens, prompt_tokens, self.block_size)

    async def kv_capacity_tokens(self) -> int | None:
        """Tokens the engine's prefix cache can hold: usable KV blocks (``num_gpu_blocks`` of
        ``vllm:cache_config_info`` in ``/metrics``, less the one vLLM keeps back) times the block size;
        None when the engine does not say (an unreachable engine, or metrics without that gauge)."""
        metrics = await self._metrics()
        for line in (metrics or "").splitlines():
            if line.startswith("vllm:cache_config_info{"):
                labels = dict(_LABEL.findall(line))
                blocks, size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
                if blocks.isdigit() and size.isdigit() and int(blocks) > 1:
                    return (int(blocks) - 1) * int(size)
        return None

    async def requests_in_flight(self) -> int | None:
        """Requests the engine is running or has queued (``vllm:num_requests_running`` and
        ``vllm:num_requests_waiting`` in ``/metrics``); None when it does not say (unreachable, no gauges)."""
        metrics = await self._metrics()
        return None if metrics is None else requests_in_flight(metrics)

    async def _metrics(self) -> str | None:
        """The engine's ``/metrics`` text within the health timeout; None if it does not answer 200."""
        try:
            response = await self._http.get("/metrics", timeout=self._health_timeout)
        except httpx.HTTPError:
            return None
        return response.text if response.status_code == 200 else None

    async def health(self) -> bool:
        """True iff ``GET /health`` answers 200 within the health timeout; False on any transport error."""
        try:
            response = await self._http.get("/health", timeout=self._health_timeout)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def warm(
        self, payload: PrefixPayload, *, cache_salt: str, priority: int = WARM_PRIORITY
    ) -> WarmResult:
        """Pre-fill ``payload`` under ``cache_salt``; the engine's counts. Raises :class:`WarmFailed`."""
        path, body = self._request(payload, cache_salt=cache_salt, priority=priority)
        started = time.perf_counter()
        answer = await self._post_json(path, body)
        elapsed = time.perf_counter() - started
        prompt_tokens, cached_tokens = _usage(answer)
        ids = answer.get("prompt_token_ids")
        if ids is None:  # completions answer them per choice
            choices = answer.get("choices")
            first = choices[0] if isinstance(choices, list) and choices else None
            ids = first.get("prompt_token_ids") if isinstance(first, dict) else None
        token_ids = ids if isinstance(ids, list) and all(isinstance(i, int) for i in ids) else None
        return WarmResult(prompt_tokens, cached_tokens, elapsed, token_ids)

    async def probe(self, payload: PrefixPayload, *, cache_salt: str, priority: int = WARM_PRIORITY) -> int:
        """Send the warm request again; its ``cached_tokens``. Raises :class:`WarmFailed`.

        The warm-up stuck iff the result equals ``expected_cached_tokens(prompt_tokens)``.
        """
        return (await self.warm(payload, cache_salt=cache_salt, priority=priority)).cached_tokens

    async def tokenize(self, payload: PrefixPayload) -> list[int]:
        """The token ids the engine renders ``payload`` to, as :meth:`warm` sends it.

        Feeding these ids to a completions warm-up fills the same blocks as the chat warm-up. Token ids come
        back as they are, without a request. Raises :class:`WarmFailed`.
        """
        body: dict[str, Any] = {"model": self.model}
        if payload.messages is not None:
            body |= {"messages": payload.messages, **_RENDER_AS_COMPLETE_TURN}
        elif isinstance(payload.prompt, str):
            body["prompt"] = payload.prompt
        else:
            return list(payload.prompt or [])
        answer = await self._post_json("/tokenize", body)
        tokens = answer.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(token, int) for token in tokens):
            raise WarmFailed(f"POST /tokenize: malformed answer (no token list): {_clip(str(answer))}")
        return tokens

    def _request(
        self, payload: PrefixPayload, *, cache_salt: str, priority: int
    ) -> tuple[str, dict[str, Any]]:
        common: dict[str, Any] = {
            "model": self.model,
            "max_tokens": 1,
            "temperature": 0.0,
            "stream": False,
            "priority": priority,
            "return_token_ids": True,
        }
        if cache_salt:  # "" warms where unsalted traffic reads (vLLM refuses an empty salt)
            common["cache_salt"] = cache_salt
        if payload.messages is not None:
            chat = {"messages": payload.messages, **_RENDER_AS_COMPLETE_TURN}
            return "/v1/chat/completions", common | chat
        prompt = payload.prompt if isinstance(payload.prompt, str) else list(payload.prompt or [])
        return "/v1/completions", common | {"prompt": prompt}

    async def _post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = await self._http.post(path, json=body)
        except httpx.TimeoutException as error:
            reason = f"POST {path}: timed out ({type(error).__name__}) at {self.base_url}"
            raise WarmFailed(reason, retryable=True) from error
        except httpx.HTTPError as error:
            detail = _clip(str(error)) or type(error).__name__
            reason = f"POST {path}: {type(error).__name__} at {self.base_url}: {detail}"
            raise WarmFailed(reason, retryable=True) from error
        if response.status_code != 200:
            reason = f"POST {path}: HTTP {response.status_code}: {_error_message(response)}"
            raise WarmFailed(reason, retryable=response.status_code >= 500)
        try:
            answer = response.json()
        except ValueError as error:
            raise WarmFailed(f"POST {path}: HTTP 200 with a body that is not JSON") from error
        if not isinstance(answer, dict):
            raise WarmFailed(f"POST {path}: HTTP 200 with a JSON body that is not an object")
        return answer


def requests_in_flight(metrics: str) -> int | None:
    """The running and waiting requests a vLLM ``/metrics`` text reports, over all its engines; None
    when it has neither gauge."""
    total, seen = 0.0, False
    for line in metrics.splitlines():
        name, _, rest = line.partition("{") if "{" in line else line.partition(" ")
        if name not in _IN_FLIGHT_GAUGES:
            continue
        fields = (rest.rpartition("}")[2] if "{" in line else rest).split()
        try:
            total += float(fields[0])
        except (IndexError, ValueError):
            continue
        seen = True
    return round(total) if seen else None


_IN_FLIGHT_GAUGES = frozenset({"vllm:num_requests_running", "vllm:num_requests_waiting"})


def _usage(answer: dict[str, Any]) -> tuple[int, int]:
    """(prompt_tokens, cached_tokens) of a completion; cached is 0 when the engine does not report it."""
    usage = answer.get("usage")
    if not isinstance(usage, dict) or not isinstance(usage.get("prompt_tokens"), int):
        raise WarmFailed(f"answer without usage.prompt_tokens: {_clip(str(answer))}")
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return int(usage["prompt_tokens"]), int(cached) if isinstance(cached, int) else 0


def _error_message(response: httpx.Response) -> str:
    """vLLM's error message (``{"error": {"message"}}`` or ``{"message"}``), else the body, on one line."""
    try:
        body = response.json()
    except ValueError:
        return _clip(response.text) or response.reason_phrase
    if isinstance(body, dict):
        error = body.get("error")
        message = error.get("message") if isinstance(error, dict) else body.get("message", error)
        if message:
            return _clip(str(message))
    return _clip(str(body))


def _clip(text: str) -> str:
    one_line = " ".join(text.split())
    if len(one_line) <= _MAX_REASON_CHARS:
        return one_line
    return one_line[: _MAX_REASON_CHARS - 3] + "..."


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One TLS context for every engine client, the one httpx would build (certifi's roots, or
    SSL_CERT_FILE / SSL_CERT_DIR): httpx builds one per client otherwise, loading the CA bundle each
    time (about 33 ms), for each engine a warmer drives, https or not."""
    return httpx.create_ssl_context()
