"""A client's OpenAI request: validated just enough to route it, then rewritten for the replica.

The gateway checks only what it needs (a JSON object, `model`, `messages` or `prompt`, `stream`,
`stream_options`); everything else goes to vLLM untouched, which answers for it. The rewrite sets
`cache_salt` (the tenant's, overriding the client's) and `priority` (the gateway's, so no client
overtakes another tenant), and when streaming asks for the usage chunk, which carries `cached_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from warmplane.services.gateway.errors import ApiError, bad_request
from warmplane.shared.events import PrefixPayload
from warmplane.shared.prefix_chain import Namespace, PrefixChain
from warmplane.shared.request_events import first_prompt, openai_chain, openai_payload

Kind = Literal["chat", "completions"]
PATHS: dict[Kind, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects a body may have (OpenAI requests, tool schemas included, need a
handful of levels); deeper is refused before anything walks it."""
_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class ClientRequest:
    kind: Kind
    body: dict[str, Any]
    model: str
    stream: bool
    wants_usage: bool
    """The client asked for the streamed usage chunk itself (`stream_options.include_usage`)."""

    @property
    def prompt(self) -> str | list[int]:
        """The (first) completions prompt, for chains and payloads."""
        return first_prompt(self.body["prompt"])


def decode(raw: bytes, kind: Kind) -> ClientRequest:
    """Parse and check a request body. Raises `ApiError` (400) naming the first thing wrong."""
    try:
        body = _decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise bad_request(f"The request body is not valid JSON: {exc}.", code="invalid_json") from None
    except RecursionError:  # msgspec's own bound, the interpreter's recursion limit
        raise _too_deep() from None
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and _deeper_than(body, MAX_JSON_DEPTH):
        raise _too_deep()
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_json")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a non-empty string.", param="model")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean.", param="stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object.", param="stream_options")
    if kind == "chat":
        _check_messages(body.get("messages"))
    else:
        _check_prompt(body.get("prompt"))
    wants_usage = bool(stream and options and options.get("include_usage") is True)
    return ClientRequest(kind, body, model, stream, wants_usage)


def _too_deep() -> ApiError:
    return bad_request(
        f"The request body nests arrays and objects deeper than {MAX_JSON_DEPTH} levels.", code="too_deep"
    )


def _deeper_than(value: object, limit: int) -> bool:
    """Whether `value` nests lists and dicts more than `limit` deep; iterative, so any depth is safe."""
    level: list[object] = [value]
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        inner: list[object] = []
        for item in level:
            if isinstance(item, dict):
                inner.extend(v for v in item.values() if isinstance(v, dict | list))
            elif isinstance(item, list):
                inner.extend(v for v in item if isinstance(v, dict | list))
        level = inner
    return False


def _check_messages(messages: object) -> None:
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' is required and must be a non-empty array.", param="messages")
    if not all(isinstance(message, dict) for message in messages):
        raise bad_request("Each element of 'messages' must be an object.", param="messages")


def _check_prompt(prompt: object) -> None:
    if isinstance(prompt, str):
        return
    if isinstance(prompt, list) and prompt:
        if all(isinstance(token, int) and not isinstance(token, bool) for token in prompt):
            return
        if all(isinstance(item, str) for item in prompt):
            return
        if all(isinstance(item, list) and item and all(type(t) is int for t in item) for item in prompt):
            return
    raise bad_request(
        "'prompt' is required: a string, an array of token ids, or an array of either.", param="prompt"
    )


def upstream_body(request: ClientRequest, cache_salt: str, priority: int) -> bytes:
    """The body sent to the replica: the client's, with our salt and priority, and usage when streaming."""
    body = dict(request.body)
    body["cache_salt"] = cache_salt
    body["priority"] = priority
    if request.stream:
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
    return _encoder.encode(body)


def chain_of(request: ClientRequest, namespace: Namespace) -> PrefixChain:
    """The request's prefix chain (`shared/prefix_chain.py`); token counts are estimates for text."""
    return openai_chain(request.kind, request.body, namespace)


def payload_of(request: ClientRequest, prefix_id: int) -> PrefixPayload:
    """The replayable payload of the whole prompt, as the catalog keeps it for `prefix_id`."""
    return openai_payload(request.kind, request.body, prefix_id)
