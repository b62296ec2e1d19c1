"""Prefix identity (design brief, section 5): a prompt as a chain of segments, each with a chained id.

A chat prompt is cut at message boundaries, and long messages into fixed-size chunks; a completions
prompt into fixed-size chunks (of characters for text, of tokens for token ids). Each segment's id is
a 64-bit BLAKE2b hash over its parent's id and its own canonical bytes; the root's parent is a
namespace hash of (tenant, model, prompt revision), so equal text under another tenant, model or
prompt revision never shares an id. Ids are signed 64-bit integers, as Postgres `bigint` stores them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec

DEFAULT_CHUNK_CHARS: Final = 2048
DEFAULT_CHUNK_TOKENS: Final = 512
_ID_BYTES: Final = 8
_canonical = msgspec.json.Encoder(order="sorted")
# A segment's kind leads its bytes, so a chat message, raw text and token ids never share an id.
_CHAT, _TEXT, _TOKENS = b"m\x00", b"t\x00", b"k\x00"


@dataclass(frozen=True, slots=True)
class Namespace:
    """What a prefix id is scoped to: a tenant's prompts for one model and prompt revision."""

    tenant: str
    model: str
    prompt_rev: str = ""

    def root_parent(self) -> int:
        """The parent id of every chain's first segment in this namespace."""
        # JSON, not a joined string: no choice of names can make two namespaces encode alike.
        return _hash_id(b"warmplane/v1", _canonical.encode((self.tenant, self.model, self.prompt_rev)))


@dataclass(frozen=True, slots=True)
class PrefixChain:
    """`ids[i]` identifies the prompt up to segment i; `tokens[i]` counts its tokens (cumulative)."""

    ids: tuple[int, ...]
    tokens: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.tokens):
            raise ValueError("ids and tokens must have the same length")

    @property
    def root(self) -> int:
        return self.ids[0]


def estimate_tokens(text: str) -> int:
    """A tokenizer-free estimate (about four characters a token) for producers without a tokenizer."""
    return max(1, (len(text) + 3) // 4)


def chain_from_segments(
    namespace: Namespace, segments: Sequence[bytes], segment_tokens: Sequence[int]
) -> PrefixChain:
    """Chain ids over already-cut `segments`, with each segment's own (not cumulative) token count."""
    if len(segments) != len(segment_tokens):
        raise ValueError("segments and segment_tokens must have the same length")
    if not segments:
        raise ValueError("a prompt needs at least one segment")
    parent = namespace.root_parent()
    ids: list[int] = []
    cumulative: list[int] = []
    total = 0
    for segment, tokens in zip(segments, segment_tokens, strict=True):
        parent = _hash_id(parent.to_bytes(_ID_BYTES, "big", signed=True), segment)
        total += tokens
        ids.append(parent)
        cumulative.append(total)
    return PrefixChain(tuple(ids), tuple(cumulative))


def chat_chain(
    namespace: Namespace,
    messages: Sequence[Mapping[str, Any]],
    *,
    chunk_chars: int = DEFAULT_CHUNK_CHARS,
    count_tokens: Callable[[str], int] = estimate_tokens,
) -> PrefixChain:
    """The chain of a chat prompt: one segment per message, long text contents cut every `chunk_chars`.

    A message's fields other than its text content (role, name, tool calls) belong to its first
    segment, so two messages that differ only in role never share an id.
    """
    if chunk_chars <= 0:
        raise ValueError("chunk_chars must be positive")
    segments: list[bytes] = []
    tokens: list[int] = []
    for message in messages:
        content = message.get("content")
        head = {
            key: value for key, value in message.items() if key != "content" or not isinstance(value, str)
        }
        if not isinstance(content, str) or len(content) <= chunk_chars:
            segments.append(_CHAT + _canonical.encode(message))
            tokens.append(
                count_tokens(content if isinstance(content, str) else _canonical.encode(message).decode())
            )
            continue
        for start in range(0, len(content), chunk_chars):
            piece = content[start : start + chunk_chars]
            segments.append(_CHAT + (_canonical.encode(head) if start == 0 else b"") + piece.encode())
            tokens.append(count_tokens(piece))
    return chain_from_segments(namespace, segments, tokens)


def text_chain(
    namespace: Namespace,
    prompt: str,
    *,
    chunk_chars: int = DEFAULT_CHUNK_CHARS,
    count_tokens: Callable[[str], int] = estimate_tokens,
) -> PrefixChain:
    """The chain of a completions prompt given as text: fixed chunks of `chunk_chars` characters."""
    if chunk_chars <= 0:
        raise ValueError("chunk_chars must be positive")
    pieces = [prompt[start : start + chunk_chars] for start in range(0, max(len(prompt), 1), chunk_chars)]
    return chain_from_segments(
        namespace, [_TEXT + p.encode() for p in pieces], [count_tokens(p) for p in pieces]
    )


def token_chain(
    namespace: Namespace, token_ids: Sequence[int], *, chunk_tokens: int = DEFAULT_CHUNK_TOKENS
) -> PrefixChain:
    """The chain of a prompt given as token ids: chunks of `chunk_tokens`, exact token counts."""
    if chunk_tokens <= 0:
        raise ValueError("chunk_tokens must be positive")
    if not token_ids:
        raise ValueError("a prompt needs at least one token")
    pieces = [token_ids[start : start + chunk_tokens] for start in range(0, len(token_ids), chunk_tokens)]
    return chain_from_segments(
        namespace,
        [_TOKENS + b"".join(t.to_bytes(8, "big", signed=True) for t in piece) for piece in pieces],
        [len(piece) for piece in pieces],
    )


def _hash_id(parent: bytes, segment: bytes) -> int:
    digest = hashlib.blake2b(segment, digest_size=_ID_BYTES, key=parent[:64]).digest()
    return int.from_bytes(digest, "big", signed=True)
