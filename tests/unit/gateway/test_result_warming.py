"""The record of asks, in memory before it reaches Redis: bounded, and named apart per namespace."""

from __future__ import annotations

import redis.asyncio as aioredis

from warmplane.services.gateway.result_keys import Namespace, namespace_id
from warmplane.services.gateway.result_warming import HotPrompts, current_namespaces


def test_asks_waiting_for_a_flush_are_bounded_in_distinct_keys() -> None:
    record = HotPrompts(aioredis.Redis(), max_pending=3)  # never flushed: no connection is made
    space = Namespace("t", "m", 0)
    for key in ("a", "b", "c", "d", "a"):
        record.note(space, key)
    record.note(Namespace("t", "m", 1), "e")
    assert record.waiting == {space: {"a": 2, "b": 1, "c": 1}}


def test_each_namespace_has_its_own_name_however_its_fields_are_split() -> None:
    names = {namespace_id(Namespace(*fields)) for fields in (("ab", "c", 1), ("a", "bc", 1), ("a", "b", 11))}
    assert len(names) == 3


def test_the_current_epoch_is_warmed_when_recorded_else_the_newest() -> None:
    recorded = [
        Namespace("t", "m", 0),
        Namespace("t", "m", 2),
        Namespace("u", "m", 0),
        Namespace("u", "m", 3),
    ]
    chosen = current_namespaces(recorded, lambda tenant, _model: 0 if tenant == "t" else 1)
    assert chosen == [Namespace("t", "m", 0), Namespace("u", "m", 3)]
