"""The result cache's pure parts: L1's bounds and expiry, the stored answer's integrity, TTL jitter."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warmplane.services.gateway.answer_lru import AnswerLru
from warmplane.services.gateway.answer_record import pack, unpack
from warmplane.services.gateway.result_keys import Namespace
from warmplane.services.gateway.ttl_jitter import jittered

ACME = Namespace("acme", "m", 1)


def test_l1_keeps_at_most_its_entries_and_drops_the_least_recently_used() -> None:
    lru = AnswerLru(max_entries=2, max_bytes=1_000)
    lru.put("a", ACME, b"A", expires_at=10)
    lru.put("b", ACME, b"B", expires_at=10)
    assert lru.get("a", now=0) == b"A"  # now "b" is the least recently used
    lru.put("c", ACME, b"C", expires_at=10)
    assert (lru.get("a", 0), lru.get("b", 0), lru.get("c", 0)) == (b"A", None, b"C")
    assert len(lru) == 2


def test_l1_keeps_at_most_its_bytes_of_answers_and_keys() -> None:
    lru = AnswerLru(max_entries=100, max_bytes=25)
    lru.put("k1", ACME, b"x" * 10, expires_at=10)
    lru.put("k2", ACME, b"y" * 10, expires_at=10)
    assert lru.held_bytes == 24
    lru.put("k3", ACME, b"z" * 3, expires_at=10)  # 29 bytes: "k1" goes
    assert (lru.get("k1", 0), lru.held_bytes) == (None, 17)
    lru.put("big", ACME, b"w" * 30, expires_at=10)  # larger than the whole layer: not held
    assert (lru.get("big", 0), len(lru)) == (None, 2)
    lru.put("k2", ACME, b"v", expires_at=10)  # replacing an entry counts its new size only
    assert lru.held_bytes == 8


def test_an_l1_entry_is_not_served_past_its_expiry_and_is_dropped_when_met() -> None:
    lru = AnswerLru(max_entries=10, max_bytes=1_000)
    lru.put("a", ACME, b"A", expires_at=5.0)
    assert lru.get("a", now=4.999) == b"A"
    assert lru.get("a", now=5.0) is None
    assert (len(lru), lru.held_bytes) == (0, 0)


def test_an_epoch_bump_drops_the_older_epochs_of_that_tenant_and_model_only() -> None:
    lru = AnswerLru(max_entries=10, max_bytes=1_000)
    entries = {
        "old": Namespace("acme", "m", 1),
        "current": Namespace("acme", "m", 2),
        "other model": Namespace("acme", "n", 1),
        "other tenant": Namespace("globex", "m", 1),
    }
    for key, namespace in entries.items():
        lru.put(key, namespace, b"A", expires_at=10)
    assert lru.drop_older("acme", "m", 2) == 1
    assert [key for key in entries if lru.get(key, 0) is not None] == [
        "current",
        "other model",
        "other tenant",
    ]


def test_an_l1_of_no_entries_holds_nothing() -> None:
    lru = AnswerLru(max_entries=0, max_bytes=1_000)
    lru.put("a", ACME, b"A", expires_at=10)
    assert (lru.get("a", 0), len(lru)) == (None, 0)


@given(st.binary(max_size=300))
def test_a_stored_answer_unpacks_to_itself(answer: bytes) -> None:
    assert unpack(pack(answer)) == answer


def test_a_stored_answer_that_is_not_intact_unpacks_to_nothing() -> None:
    stored = pack(b'{"choices": []}')
    flipped = stored[:-1] + bytes([stored[-1] ^ 1])
    for damaged in (stored[:-1], flipped, b'{"choices": []}', b"", stored[:10], b"wpa2" + stored[4:]):
        assert unpack(damaged) is None, damaged


def test_jitter_stays_within_its_spread_and_uses_all_of_it() -> None:
    rng = random.Random(7)
    ttls = [jittered(100.0, 0.1, rng.uniform) for _ in range(2_000)]
    assert all(90.0 <= ttl <= 110.0 for ttl in ttls)
    assert min(ttls) < 91.0 and max(ttls) > 109.0, "entries filled together spread over the whole range"
    assert jittered(100.0, 0.0, rng.uniform) == 100.0


@pytest.mark.parametrize("spread", [0.01, 0.25, 0.5])
def test_jitter_at_the_ends_of_the_draw(spread: float) -> None:
    assert jittered(60.0, spread, lambda low, high: low) == pytest.approx(60.0 * (1 - spread))
    assert jittered(60.0, spread, lambda low, high: high) == pytest.approx(60.0 * (1 + spread))
