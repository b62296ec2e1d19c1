"""What an `Ingestor` talks to, faked for unit tests of its own logic: broker records, a consumer that owns
every partition, a dead-letter sink that takes everything."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from warmplane.services.planner.ingestor import Offsets, Partition
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
