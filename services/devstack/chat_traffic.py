"""The scenario's traffic: a slice of a recorded Mooncake trace as streamed chat requests. Pure: no I/O but
reading the trace and the tokenizer's vocabulary.

Each trace block (one hash id) becomes one chat message of `words_per_block` words drawn, deterministically
from the hash id, from the served model's own vocabulary (whole-word tokens, so a block costs about as many
tokens as it has words). Message 0 is the system prompt; the rest alternate user and assistant. Two requests
that share their first k hash ids therefore share their first k messages, and their rendered prompts share
the tokens of those messages and nothing after: the trace's prefix chains, on a real tokenizer and chat
template, in text that every router can read (vllm-router's `cache_aware` matches on text).

The replay keeps the trace's own clock (real time: a conversation's next turn comes as late as it did) and
scales the rate by sampling conversations: a request is kept when its routing key (its second hash id, the
conversation trace's first distinct block) falls in the sampled share. So a kept conversation keeps all its
turns, and the rate is `sample` times the trace's.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from warmplane.shared.mooncake_trace import TRACE_BLOCK_TOKENS, TraceRequest, read_trace

_WORD = re.compile(r"^Ġ[a-z]{3,9}$")
"""A byte-level BPE vocabulary entry that is one lowercase word with its leading space."""
_KEY_SPACE = 1_000_000


class TraceError(ValueError):
    """A trace the scenario cannot reproduce; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """One request of the replay: when it is sent, after the replay's start, and what it says."""

    at_s: float
    messages: list[dict[str, str]]
    max_tokens: int
    key: int
    """The conversation it belongs to (its routing key in the trace)."""


def read_ordered_trace(path: Path) -> list[TraceRequest]:
    """Every request of the trace at `path` that has hash ids; raises `TraceError` naming the line of a
    request with a missing or ill-typed field, or a timestamp earlier than the line before it."""
    try:
        requests = list(read_trace(path, ordered=True))
    except ValueError as exc:
        raise TraceError(str(exc)) from None
    if not requests:
        raise TraceError(f"{path}: no requests with hash ids")
    return requests


def vocabulary_words(tokenizer_json: Path) -> list[str]:
    """The whole-word entries of a byte-level BPE tokenizer's vocabulary (`tokenizer.json`), sorted;
    raises `ValueError` if it has too few to make varied text."""
    model = json.loads(tokenizer_json.read_text())["model"]
    vocab = model["vocab"]
    entries = vocab.keys() if isinstance(vocab, dict) else (entry[0] for entry in vocab)
    words = sorted(entry[1:] for entry in entries if _WORD.match(entry))
    if len(words) < 256:
        raise ValueError(f"{tokenizer_json}: only {len(words)} whole-word entries; need at least 256")
    return words


def routing_key(request: TraceRequest) -> int:
    """The conversation a request belongs to: its second hash id (every request of the conversation
    trace shares the first), or its only one."""
    return request.hash_ids[min(1, len(request.hash_ids) - 1)]


def kept(key: int, sample: float, seed: int) -> bool:
    """Whether the conversation `key` is in the sampled share, the same answer in every run and arm."""
    return random.Random(key * 1_000_003 + seed).randrange(_KEY_SPACE) < sample * _KEY_SPACE


def block_text(hash_id: int, words: Sequence[str], words_per_block: int) -> str:
    return " ".join(random.Random(hash_id).choices(words, k=words_per_block))


def chat_messages(
    hash_ids: Sequence[int], words: Sequence[str], words_per_block: int
) -> list[dict[str, str]]:
    """One message per block: the system prompt, then user and assistant turns in alternation."""
    messages = []
    for index, hash_id in enumerate(hash_ids):
        role = "system" if index == 0 else ("user" if index % 2 else "assistant")
        messages.append({"role": role, "content": block_text(hash_id, words, words_per_block)})
    return messages


@dataclass(frozen=True, slots=True)
class Slice:
    """Which part of the trace is replayed, how thinly, and how each request is shaped."""

    offset_s: float
    """Where in the trace the replay starts."""
    duration_s: float
    sample: float
    """The share of conversations kept (the rate's scale)."""
    seed: int = 1
    words_per_block: int = 32
    max_blocks: int = 48
    """Longer chains are cut here (the engine's context is finite)."""
    max_tokens_cap: int = 32
    """Answers are the trace's output length scaled like the blocks, at most this."""


def answer_tokens(request: TraceRequest, part: Slice) -> int:
    """The answer's length: the trace's output length scaled like the blocks, at least 1, at most the cap."""
    scale = part.words_per_block / TRACE_BLOCK_TOKENS
    return min(max(int(request.output_length * scale), 1), part.max_tokens_cap)


def replay_requests(trace: Sequence[TraceRequest], words: Sequence[str], part: Slice) -> list[ChatRequest]:
    """The requests of `part` of `trace`, in time order, as chat requests timed from the slice's start."""
    if not 0 < part.sample <= 1:
        raise ValueError(f"sample must be in (0, 1], got {part.sample}")
    start_ms = trace[0].timestamp + part.offset_s * 1000
    end_ms = start_ms + part.duration_s * 1000
    out = []
    for request in trace:
        if not start_ms <= request.timestamp < end_ms:
            continue
        key = routing_key(request)
        if not kept(key, part.sample, part.seed):
            continue
        max_tokens = answer_tokens(request, part)
        out.append(
            ChatRequest(
                at_s=(request.timestamp - start_ms) / 1000,
                messages=chat_messages(request.hash_ids[: part.max_blocks], words, part.words_per_block),
                max_tokens=max_tokens,
                key=key,
            )
        )
    return out
