"""The golden payloads of `tests/golden/v1` (one JSON file per event type, named after its `type`), and
seeded random mutations of them for fuzzing consumers.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from warmplane.shared.codec import DecodeFailure, EventCodec

GOLDEN_DIR = Path(__file__).parent / "golden" / "v1"


def golden_payloads() -> dict[str, bytes]:
    """Every golden payload's bytes, by the event type its file is named after, sorted by type."""
    return {path.stem: path.read_bytes() for path in sorted(GOLDEN_DIR.glob("*.json"))}


def random_json(rng: random.Random, depth: int = 0) -> Any:
    """A random JSON value: scalars picked to cross type and range limits, containers nested 3 deep."""
    scalars: list[Callable[[], Any]] = [
        lambda: None,
        lambda: rng.random() < 0.5,
        lambda: rng.choice([0, -1, 1, 2**31, 2**63, -(2**70), rng.randrange(-1000, 1000)]),
        lambda: rng.choice([0.5, -1e300, 1e300, rng.uniform(-10, 10)]),
        lambda: "".join(rng.choice("aZ09 -_.:/\u00e9\u2603") for _ in range(rng.randrange(0, 12))),
    ]
    containers: list[Callable[[], Any]] = [
        lambda: [random_json(rng, depth + 1) for _ in range(rng.randrange(0, 4))],
        lambda: {str(random_json(rng, 3)): random_json(rng, depth + 1) for _ in range(rng.randrange(0, 4))},
    ]
    return rng.choice(scalars + containers if depth < 3 else scalars)()


def json_paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path (keys and indexes) of `value` itself and of everything nested in it, depth first."""
    yield prefix
    children = (
        value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    )
    for key, child in children:
        yield from json_paths(child, (*prefix, key))


def mutate(document: Any, rng: random.Random) -> Any:
    """`document` with one random field deleted or one random value (or the whole) replaced."""
    path = rng.choice(list(json_paths(document)))
    if not path:
        return random_json(rng)
    parent = document
    for step in path[:-1]:
        parent = parent[step]
    if rng.random() < 0.5:
        del parent[path[-1]]
    else:
        parent[path[-1]] = random_json(rng)
    return document


def fuzzed_goldens(codec: EventCodec, rng: random.Random, count: int) -> list[tuple[bytes, DecodeFailure]]:
    """`count` mutations of golden payloads that the codec refuses, with its reasons."""
    goldens = [json.loads(data) for data in golden_payloads().values()]
    found: list[tuple[bytes, DecodeFailure]] = []
    while len(found) < count:
        document = copy.deepcopy(rng.choice(goldens))
        for _ in range(rng.randrange(1, 4)):
            document = mutate(document, rng)
        data = json.dumps(document).encode()
        result = codec.decode(data)
        if isinstance(result, DecodeFailure):
            found.append((data, result))
    return found
