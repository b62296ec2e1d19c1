"""The ingestor awaits its `before_batch` hook (the planning task's `yield_to_urgent`) before it decodes a
fetched batch and before it writes one, so a pause there holds both the consumer and the writer back."""

from __future__ import annotations

import asyncio

from tests.unit.planner.ingestor_fakes import Consumer, request_record, started_ingestor
from tests.unit.planner.memory_ingest import MemoryIngest


class Gate:
    """A `before_batch` that counts its calls and holds each one while `open` is clear."""

    def __init__(self) -> None:
        self.calls = 0
        self.open = asyncio.Event()
        self.open.set()

    async def __call__(self) -> None:
        self.calls += 1
        await self.open.wait()


async def test_a_closed_gate_holds_decoding_and_writing_and_opening_it_counts_every_event_once() -> None:
    store = MemoryIngest()
    gate = Gate()
    ingestor = started_ingestor(store, before_batch=gate)
    await ingestor.submit([request_record(0, [1, 2])], Consumer())
    await asyncio.wait_for(ingestor.flush(), 5)
    assert gate.calls == 2  # once before decoding, once before writing
    assert len(store.plans.counts) == 1

    gate.open.clear()
    submitted = asyncio.create_task(ingestor.submit([request_record(1, [1, 2])], Consumer()))
    await asyncio.sleep(0.05)
    assert not submitted.done() and gate.calls == 3  # decoding waits at the gate
    gate.open.set()
    await asyncio.wait_for(submitted, 5)
    await asyncio.wait_for(ingestor.flush(), 5)
    assert gate.calls == 4 and len(store.plans.counts) == 2
    await ingestor.drain()
