"""The contract's test vectors (`shared/contract.py` writes them under `docs/contract/`): prefix ids as
`prefix_chain` computes them, and the routing ring's owners as `hash_ring` picks them, for implementations in
other languages to check themselves against."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import count, islice
from typing import Any, Final

from warmplane.shared.hash_ring import HashRing, key_point
from warmplane.shared.prefix_chain import (
    DEFAULT_CHUNK_CHARS,
    DEFAULT_CHUNK_TOKENS,
    Namespace,
    PrefixChain,
    chat_chain,
    text_chain,
    token_chain,
)
from warmplane.shared.ring_layout import layout


def prefix_vectors() -> dict[str, Any]:
    """Prompts and the prefix ids (and cumulative token estimates) `prefix_chain` gives them: a producer in
    another language that reproduces these produces the same ids."""
    acme = Namespace("acme", "llama-3-8b")
    revised = Namespace("acme", "llama-3-8b", "support-bot@2")
    long_text = "".join(chr(0x61 + i % 26) for i in range(DEFAULT_CHUNK_CHARS + 100))
    system = {"role": "system", "content": "You are a careful assistant."}
    cases: list[dict[str, Any]] = []

    def add(name: str, namespace: Namespace, kind: str, prompt: Any, chain: PrefixChain) -> None:
        cases.append(
            {
                "name": name,
                "namespace": {
                    "tenant": namespace.tenant,
                    "model": namespace.model,
                    "prompt_rev": namespace.prompt_rev,
                },
                "root_parent": namespace.root_parent(),
                kind: prompt,
                "ids": list(chain.ids),
                "tokens": list(chain.tokens),
            }
        )

    chats: Sequence[tuple[str, Namespace, list[dict[str, Any]]]] = (
        ("chat: one message", acme, [system]),
        (
            "chat: a conversation, each message a segment",
            acme,
            [system, {"role": "user", "content": "Où est la gare ?"}],
        ),
        (
            "chat: the same under another prompt revision",
            revised,
            [system, {"role": "user", "content": "Où est la gare ?"}],
        ),
        (
            "chat: a message longer than a chunk is cut",
            acme,
            [system, {"role": "user", "content": long_text}],
        ),
        (
            "chat: content parts (not a string) are one segment",
            acme,
            [{"role": "user", "content": [{"type": "text", "text": "Describe this."}]}],
        ),
        (
            "chat: a message's other fields belong to its first segment",
            acme,
            [{"role": "user", "name": "ana", "content": "Hi"}],
        ),
    )
    for name, namespace, messages in chats:
        add(name, namespace, "messages", messages, chat_chain(namespace, messages))
    for name, text in (
        ("text: one chunk", "Translate to German: "),
        ("text: cut every 2,048 characters", long_text),
    ):
        add(name, acme, "prompt", text, text_chain(acme, text))
    tokens = list(range(1, DEFAULT_CHUNK_TOKENS + 11))
    add("token ids: cut every 512 tokens", acme, "prompt_token_ids", tokens, token_chain(acme, tokens))
    add(
        "token ids: negative and large ids",
        Namespace("globex", "m"),
        "prompt_token_ids",
        [0, -1, 2**40],
        token_chain(Namespace("globex", "m"), [0, -1, 2**40]),
    )
    return {
        "description": "Prefix ids as `warmplane.shared.prefix_chain` computes them (README.md says how).",
        "chunk_chars": DEFAULT_CHUNK_CHARS,
        "chunk_tokens": DEFAULT_CHUNK_TOKENS,
        "cases": cases,
    }


_RING_FLEETS: Final = (
    ("one replica", 128, {"qwen-0": 1.0}),
    ("three replicas", 128, {"qwen-0": 1.0, "qwen-1": 1.0, "qwen-2": 1.0}),
    (
        "eight replicas, the newest ramping in at weight 0.25 (32 of its 128 points)",
        128,
        {**{f"vllm-decode-{n}": 1.0 for n in range(7)}, "vllm-decode-7": 0.25},
    ),
    (
        "ten points each: 10 x 0.25 = 2.5 rounds to 2 points (halves to even), 10 x 0.05 = 0.5 to 0, so 1 "
        "(at least one); a name beyond ASCII",
        10,
        {"engine-a": 1.0, "engine-b": 0.25, "engine-ü": 0.05},
    ),
)
"""The fleets of the ring vectors: what each shows, its points per member (vnodes), its members' weights."""
_SHOWN_PREFERENCE: Final = 4
"""Members of a key's preference order the ring vectors list, at most."""


def ring_vectors() -> dict[str, Any]:
    """Fleets, and keys with the owner and preference order `HashRing` gives them: a router in another
    language that reproduces these sends each key where Warmplane's ring does, bounded load aside.

    A fleet's keys are every id of `prefix_vectors`, 0, 1, -1 and the extremes, then keys found at the
    ring's edges (`_edge_keys`)."""
    fixed = {0, 1, -1, 2**63 - 1, -(2**63)}
    fixed.update(prefix_id for case in prefix_vectors()["cases"] for prefix_id in case["ids"])
    fleets = []
    for name, vnodes, weights in _RING_FLEETS:
        ring = HashRing(weights, vnodes=vnodes)
        keys = [*sorted(fixed), *(key for key in dict.fromkeys(_edge_keys(ring)) if key not in fixed)]
        fleets.append(
            {
                "name": name,
                "vnodes": vnodes,
                "members": weights,
                "cases": [_ring_case(ring, key) for key in keys],
            }
        )
    return {
        "description": "Which member of a ring a routing key goes to, as `warmplane.shared.hash_ring` says "
        "(README.md says how): `point` is the key's point on the circle, `preference` the first members of "
        "its preference order (the owner first).",
        "fleets": fleets,
    }


def _ring_case(ring: HashRing, key: int) -> dict[str, Any]:
    preference = list(islice(ring.preference(key), _SHOWN_PREFERENCE))
    return {"key": key, "point": key_point(key), "owner": preference[0], "preference": preference}


def _edge_keys(ring: HashRing) -> Iterator[int]:
    """The smallest non-negative keys whose points lie past `ring`'s last point (they wrap to its first),
    just before each member's first point, and just before each member's first point that its weight
    leaves out to another member (where rounding its points shows)."""
    full = layout(tuple(sorted(ring.weights)), ring.vnodes)
    position = {place: at for at, place in enumerate(zip(full.owners, full.indexes, strict=True))}

    def before(member: str, index: int) -> int:
        at = position[member, index]
        return _key_in(full.points[at - 1] if at else -1, full.points[at])

    yield _key_in(full.points[-1], (1 << 64) - 1)
    for member, weight in ring.weights.items():
        yield before(member, 0)
        if weight < 1:
            keys = (before(member, index) for index in range(ring.vnodes))
            yield from islice((key for key in keys if ring.owner(key) != member), 1)


def _key_in(after: int, upto: int) -> int:
    """The smallest non-negative key whose point is in (`after`, `upto`]; the arc must not be empty."""
    return next(key for key in count() if after < key_point(key) <= upto)
