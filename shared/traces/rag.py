"""A retrieval-augmented (RAG) trace shape Warmplane generates itself, in the Mooncake format.

Shape: a few system prompts, a large corpus of passages each retrieved rarely, and user questions. Each
request is one system prompt (whole 512-token blocks; a few prompts carry most of the traffic, by a Zipf
law over them), then `passages_per_request` passages retrieved from the corpus (a block each; popularity
by a flat Zipf law over a large corpus, so most passages are retrieved once or never), then the user's
question (one partial block, never shared). A share of sessions asks a follow-up a little later: the same
prompt and passages, the first answer and a new question, so passages see a little recent reuse as in a
chat over documents. Arrivals are Poisson.

What a warm-up can buy here: the system prompts' chains are reused all the time; a passage's block is
shared only by requests with the same system prompt and the same passage first, which is rare; the rest
is reused, if at all, by a follow-up within minutes. A policy that warms what it has seen without asking
whether it is reused spends most of its budget on passages seen once.

Hash ids are numbered in order of first appearance, from 0, as in the published traces; an id stands for
its block and every block before it. Everything is drawn from `random.Random(seed)`: the same shape and
seed give the same file, byte for byte. Regenerate the shipped file with

    python -m warmplane.shared.traces.rag --output shared/traces/rag_trace.jsonl
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

from warmplane.shared.mooncake_trace import TRACE_BLOCK_TOKENS, TraceRequest


@dataclass(frozen=True, slots=True)
class RagShape:
    """The generated trace's shape. Times in seconds, lengths in 512-token blocks unless named tokens."""

    seed: int = 18
    duration_s: float = 1800.0
    requests_per_s: float = 4.0
    system_prompt_blocks: tuple[int, ...] = (2, 3, 4, 6, 8, 12)
    system_prompt_zipf: float = 1.0
    corpus_passages: int = 100_000
    passage_zipf: float = 0.5
    passages_per_request: int = 4
    question_tokens: tuple[int, int] = (20, 400)
    answer_tokens: tuple[int, int] = (50, 500)
    follow_up_share: float = 0.1
    follow_up_mean_s: float = 60.0


class _Ids:
    """Hash ids in order of first appearance: one per (parent id, block content)."""

    def __init__(self) -> None:
        self._ids: dict[tuple[int, object], int] = {}

    def chain(self, contents: Sequence[object]) -> list[int]:
        chain: list[int] = []
        parent = -1
        for content in contents:
            parent = self._ids.setdefault((parent, content), len(self._ids))
            chain.append(parent)
        return chain


def _zipf_sampler(rng: random.Random, n: int, exponent: float) -> Iterator[int]:
    """Ranks 0..n-1 drawn with probability proportional to (rank + 1) ** -exponent."""
    cumulative = list(itertools.accumulate((k + 1) ** -exponent for k in range(n)))
    total = cumulative[-1]
    while True:
        yield min(bisect.bisect_left(cumulative, rng.random() * total), n - 1)


def generate(shape: RagShape = RagShape()) -> list[TraceRequest]:
    """The requests of `shape`, in arrival order (ties keep the order they were drawn in)."""
    rng = random.Random(shape.seed)
    prompts = _zipf_sampler(rng, len(shape.system_prompt_blocks), shape.system_prompt_zipf)
    passages = _zipf_sampler(rng, shape.corpus_passages, shape.passage_zipf)
    # A passage's corpus rank says how popular it is, not which it is: shuffle ranks onto ids.
    passage_ids = list(range(shape.corpus_passages))
    rng.shuffle(passage_ids)
    ids = _Ids()
    drafts: list[tuple[float, int, list[object], int]] = []  # (time, draw order, blocks, last block's tokens)
    t = 0.0
    for number in itertools.count():
        t += rng.expovariate(shape.requests_per_s)
        if t >= shape.duration_s:
            break
        prompt = next(prompts)
        blocks: list[object] = [("system", prompt, b) for b in range(shape.system_prompt_blocks[prompt])]
        chosen: list[int] = []
        while len(chosen) < shape.passages_per_request:
            passage = passage_ids[next(passages)]
            if passage not in chosen:
                chosen.append(passage)
        blocks += [("passage", p) for p in chosen]
        question = rng.randint(*shape.question_tokens)
        drafts.append((t, len(drafts), [*blocks, ("question", number)], question))
        if rng.random() < shape.follow_up_share:
            later = t + rng.expovariate(1 / shape.follow_up_mean_s)
            turn = question + rng.randint(*shape.answer_tokens) + rng.randint(*shape.question_tokens)
            tail = [("follow-up", number, k) for k in range(-(-turn // TRACE_BLOCK_TOKENS))]
            last = turn - TRACE_BLOCK_TOKENS * (len(tail) - 1)
            if later < shape.duration_s:
                drafts.append((later, len(drafts), [*blocks, *tail], last))
    drafts.sort(key=lambda draft: (draft[0], draft[1]))
    return [
        TraceRequest(
            timestamp=round(at * 1000),
            input_length=TRACE_BLOCK_TOKENS * (len(blocks) - 1) + last,
            output_length=rng.randint(*shape.answer_tokens),
            hash_ids=ids.chain(blocks),
        )
        for at, _, blocks, last in drafts
    ]


def write(path: Path, shape: RagShape = RagShape()) -> int:
    """Write `shape`'s trace to `path` as Mooncake JSONL; returns how many requests."""
    requests = generate(shape)
    encoder = msgspec.json.Encoder()
    path.write_bytes(b"".join(encoder.encode(request) + b"\n" for request in requests))
    return len(requests)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--output", type=Path, required=True, help="the JSONL file to write")
    parser.add_argument("--seed", type=int, default=RagShape().seed, help="the generator's seed")
    args = parser.parse_args(argv)
    count = write(args.output, RagShape(seed=args.seed))
    print(f"wrote {count} requests to {args.output}")


if __name__ == "__main__":
    main()
