"""The generated RAG trace: deterministic, shipped as generated, and shaped as documented."""

from __future__ import annotations

from collections import Counter

import msgspec

from warmplane.shared.mooncake_trace import TRACE_BLOCK_TOKENS, read_trace
from warmplane.shared.traces import RAG, evaluated_traces, trace_path
from warmplane.shared.traces.rag import RagShape, generate

SMALL = RagShape(duration_s=300.0, corpus_passages=5_000)


def test_the_shipped_file_is_what_the_generator_writes() -> None:
    encoder = msgspec.json.Encoder()
    expected = b"".join(encoder.encode(request) + b"\n" for request in generate())
    assert trace_path(RAG).read_bytes() == expected
    assert trace_path(RAG) in evaluated_traces()


def test_the_same_seed_gives_the_same_trace_and_another_seed_another() -> None:
    assert generate(SMALL) == generate(SMALL)
    assert generate(SMALL) != generate(RagShape(seed=SMALL.seed + 1, duration_s=300.0, corpus_passages=5_000))


def test_requests_are_in_time_order_and_lengths_match_their_blocks() -> None:
    requests = list(read_trace(trace_path(RAG), ordered=True))
    assert len(requests) > 1_000
    for request in requests:
        blocks = len(request.hash_ids)
        assert TRACE_BLOCK_TOKENS * (blocks - 1) < request.input_length <= TRACE_BLOCK_TOKENS * blocks


def test_ids_are_prefix_chains_with_one_parent_each() -> None:
    parents: dict[int, int | None] = {}
    for request in generate(SMALL):
        for parent, block in zip([None, *request.hash_ids[:-1]], request.hash_ids, strict=True):
            assert parents.setdefault(block, parent) == parent


def test_a_few_system_prompts_carry_the_reuse_and_most_blocks_are_seen_once() -> None:
    requests = generate(SMALL)
    roots = Counter(request.hash_ids[0] for request in requests)
    assert len(roots) == len(SMALL.system_prompt_blocks)
    uses = Counter(block for request in requests for block in request.hash_ids)
    assert sum(1 for n in uses.values() if n == 1) > 0.8 * len(uses)
    follow_ups = sum(1 for request in requests if len(request.hash_ids) > max(SMALL.system_prompt_blocks) + 5)
    assert follow_ups > 0
