"""Which requests the result cache may answer, and the keys it files their answers under. Pure.

An answer is reusable only when the engine would give the same one again: a non-streamed request with
`temperature` 0 and a single choice (`n` absent or 1). Anything else is served by a replica and never
cached; the reason is counted (`Bypass`). A client's `Cache-Control: no-store` keeps its request out
of the cache both ways; `no-cache` skips the lookup but lets the fresh answer be kept. A request that
sends `x-warmplane-cache: allow-sampled` opts in to answers of its exact sampled form (`temperature` above
0, same seed and settings): the caller accepts one draw replayed. Streaming is never answered from the
cache (a kept answer is not a stream).

Keys never hold a client's text. The exact key is the SHA-256 of the request in a canonical form
(sorted keys, minus the fields that do not change the answer: `stream`, `stream_options`, `user`,
`cache_salt`, `priority`, `request_id`). For the semantic tier the request splits into its query
(the last user message's text of a chat; a completion's text prompt) and its context (everything
else, hashed, with the query's numbers and negation, `query_literals`): answers are reused across queries
alike in meaning only under the same context, so a different system prompt, history, sampling setting,
number or negation never borrows an answer. With an end user given
(`end_user`, when the settings scope answers by user), the user is part of both keys, so no user's
answer reaches another. Tenant, model and epoch are the caller's part of every key (`Namespace`,
`result_cache.py`): an epoch bump moves a tenant's model to a fresh namespace.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from warmplane.services.gateway.openai_request import ClientRequest
from warmplane.shared.redis_keys import RESULT_ANSWERS

Bypass = Literal["streaming", "sampling", "choices", "no_store", "no_user"]
CACHE_HEADER = "x-warmplane-cache"
"""Request: `allow-sampled` opts in to cached sampled answers. Response: where the answer came from."""
ALLOW_SAMPLED = "allow-sampled"
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_WORD = re.compile(r"[a-z]+")
_NEGATING = frozenset({"not", "no", "never", "cannot", "without", "nothing", "none", "neither", "nor"})
_IGNORED = frozenset({"stream", "stream_options", "user", "cache_salt", "priority", "request_id"})
_canonical = msgspec.json.Encoder(order="sorted")


@dataclass(frozen=True, slots=True)
class Namespace:
    """Answers are only ever shared inside one of these."""

    tenant: str
    model: str
    epoch: int


@dataclass(frozen=True, slots=True)
class CacheQuery:
    exact: str
    """Hex SHA-256 of the canonical request."""
    context: bytes
    """SHA-256 of the canonical request without its query text."""
    text: str | None
    """The query compared by meaning; None when the request has none (token ids): exact tier only."""


@dataclass(frozen=True, slots=True)
class CacheDirective:
    """What `Cache-Control` allows: look the answer up, and keep a fresh answer."""

    lookup: bool
    keep: bool
    sampled: bool = False
    """The client accepts a cached answer to a sampled request (`x-warmplane-cache: allow-sampled`)."""


def directive(headers: Mapping[str, str]) -> CacheDirective:
    """What the client's `Cache-Control` and `x-warmplane-cache` request headers (lower-case names) ask
    of a result cache."""
    tokens = _tokens(headers.get("cache-control", ""))
    sampled = ALLOW_SAMPLED in _tokens(headers.get(CACHE_HEADER, ""))
    if "no-store" in tokens:
        return CacheDirective(lookup=False, keep=False, sampled=sampled)
    return CacheDirective(lookup="no-cache" not in tokens, keep=True, sampled=sampled)


def _tokens(header: str) -> set[str]:
    return {token.strip().split("=", 1)[0].lower() for token in header.split(",")}


def bypass_reason(request: ClientRequest, wanted: CacheDirective) -> Bypass | None:
    """Why the cache must not answer `request` (None: it may)."""
    if not wanted.keep:
        return "no_store"
    if request.stream:
        return "streaming"
    body = request.body
    if body.get("n") not in (None, 1):
        return "choices"
    temperature = body.get("temperature")
    greedy = not isinstance(temperature, bool) and temperature in (0, 0.0)
    if not greedy and not (wanted.sampled and _is_number(temperature)):
        return "sampling"
    return None


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def end_user(request: ClientRequest, headers: Mapping[str, str], header: str) -> str | None:
    """The end user a request speaks for: the `header` request header (lower-case name) when one is
    named, else the body's `user` field; None when it gives none."""
    user = headers.get(header) if header else request.body.get("user")
    return (user.strip() or None) if isinstance(user, str) else None


def cache_query(request: ClientRequest, user: str | None = None) -> CacheQuery:
    """The keys of a request `bypass_reason` let through; with `user`, keys of that user's alone."""
    body = {key: value for key, value in request.body.items() if key not in _IGNORED}
    if user is not None:
        body["user"] = user
    exact = hashlib.sha256(_canonical.encode(body)).hexdigest()
    text, context = _split_query(request.kind, body)
    literals = query_literals(text) if text is not None else ()
    digest = hashlib.sha256(_canonical.encode(context) + b"\0" + _canonical.encode(literals)).digest()
    return CacheQuery(exact, digest, text)


def query_literals(text: str) -> tuple[str, ...]:
    """What a query's answer hangs on that a sentence embedding blurs: its numbers, in order (commas in
    them dropped), and whether it is negated (an odd count of negating words). They join the semantic
    context, so "limit for 2023" never borrows the answer of "limit for 2024", "2 to the power of 10"
    that of "10 to the power of 2", nor "does it support" that of "does it not support"."""
    numbers = [number.replace(",", "") for number in _NUMBER.findall(text)]
    words = _WORD.findall(text.lower().replace("n't", " not"))
    negated = sum(word in _NEGATING for word in words) % 2 == 1
    return (*numbers, "negated") if negated else tuple(numbers)


def _split_query(kind: str, body: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """(query text, the body with the query taken out), or (None, body) when there is no text query."""
    if kind == "completions":
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return prompt, {**body, "prompt": None}
        return None, body
    messages: list[Any] = body["messages"]
    last = messages[-1]
    text = _text_of(last.get("content")) if last.get("role") == "user" else None
    if text is None:
        return None, body
    return text, {**body, "messages": [*messages[:-1], {**last, "content": None}]}


def _text_of(content: object) -> str | None:
    """A message's text: a string, or the text parts of a list (None if it has any other part)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        return None
    texts: list[str] = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            return None
        texts.append(part["text"])
    return "\n".join(texts)


def namespace_id(namespace: Namespace) -> str:
    """The namespace's name in Redis keys (a digest: tenant and model names hold anything)."""
    material = "\0".join((namespace.tenant, namespace.model, str(namespace.epoch)))
    return hashlib.sha256(material.encode()).hexdigest()[:32]


def namespace_answers(namespace: Namespace) -> str:
    """The prefix every answer key of `namespace` starts with: an epoch's answers can be found to purge."""
    return f"{RESULT_ANSWERS}{namespace_id(namespace)}:"
