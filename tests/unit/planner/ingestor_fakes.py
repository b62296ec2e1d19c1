"""What an `Ingestor` talks to, faked for unit tests of its own logic: broker records, a consumer that owns
every partition and a dead-letter sink that takes everything (its store's twin is `MemoryIngest`)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry

from warmplane.services.planner.core.node_cache import NodeCache
from warmplane.services.planner.ingestor import Ingestor, IngestStore, Offsets, Partition
from warmplane.services.planner.metrics import PlannerMetrics
from warmplane.shared.codec import EventCodec
from warmplane.shared.dead_letters import DeadLetter
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import ModelRef, RequestObserved


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


class NoLetters:
    async def send_all(self, letters: Sequence[DeadLetter]) -> None:
        return None


class Consumer:
    group = "g"

    async def commit(self, offsets: Offsets) -> None:
        return None

    def seek(self, partition: Partition, offset: int) -> None:
        return None

    def owns(self, partition: Partition) -> bool:
        return True


def request_record(offset: int, chain: list[int]) -> Record:
    """A request event of tenant acme through `chain` (10 tokens a block), at `offset` of t.requests/0."""
    event = RequestObserved(
        event_id=new_event_id(),
        occurred_at=datetime.now(UTC),
        producer="test",
        tenant="acme",
        model=ModelRef("m"),
        replica="r",
        chain=chain,
        chain_tokens=[10 * (i + 1) for i in range(len(chain))],
        prompt_tokens=10 * len(chain) + 1,
    )
    return Record("t.requests", 0, offset, None, EventCodec().encode(event))


def started_ingestor(
    store: IngestStore,
    *,
    node_cache: NodeCache | None = None,
    queue_depth: int = 2,
    db_outage_s: float = 0.0,
    on_failure: Callable[[], None] = lambda: None,
    before_batch: Callable[[], Awaitable[object]] | None = None,
    urgent_topics: Sequence[str] = (),
    clock: Callable[[], float] = time.monotonic,
    metrics: PlannerMetrics | None = None,
) -> Ingestor:
    """An `Ingestor` over `store`, its writer started, with what the rest of the tests leave alone."""
    ingestor = Ingestor(
        codec=EventCodec(),
        store=store,
        dead_letters=NoLetters(),
        metrics=metrics or PlannerMetrics(CollectorRegistry()),
        node_cache=node_cache or NodeCache(),
        max_payload_bytes=65_536,
        window_per_partition=1_000,
        queue_depth=queue_depth,
        db_outage_s=db_outage_s,
        on_failure=on_failure,
        before_batch=before_batch,
        urgent_topics=urgent_topics,
        clock=clock,
    )
    ingestor.start()
    return ingestor
