"""The warmer's subscription to one engine's KV cache events (ZeroMQ), folded into its `KvIndex`.

vLLM publishes each engine step's events as three frames: the topic, an 8-byte big-endian sequence
number, and msgpack `[timestamp, [events], dp_rank]`. A SUB socket drops what arrives before it has joined
and what overflows the publisher's high-water mark, so the feed checks every sequence number:

- a gap is asked for again at the engine's replay endpoint (a DEALER request with the first missing
  number; the engine answers each buffered batch from there, then an empty topic and sequence 2^64 - 1);
  what the replay does not cover, or all of it without a replay endpoint, is lost (`KvIndex.lose`);
- on start, with a replay endpoint, everything the engine still buffers is replayed from 0, so a warmer
  that restarts beside a running engine learns what it holds;
- sequence 0 after a later number, or a number further behind than any replay reaches (vLLM buffers
  10,000 batches), is an engine that restarted: its index starts over. (A restart whose first batches
  were missed and which is not that far behind looks like replayed duplicates until the driver sees
  the engine start again, which also starts the index over.)

Contracts: `run()` runs until cancelled and closes its sockets; a malformed message counts as a lost
batch, never stops the feed; `changed()` is called after every batch that was applied or lost.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any, Final

import msgspec
import zmq
import zmq.asyncio

from warmplane.services.warmer.core.kv_index import KvIndex

log = logging.getLogger(__name__)
END_OF_REPLAY: Final = 2**64 - 1
_REPLAY_REACH: Final = 10_000
"""Batches a vLLM engine buffers for replay by default: a live batch further behind is no duplicate."""
_decoder = msgspec.msgpack.Decoder()


class KvEventFeed:
    """Keeps `index` in step with the engine publishing at `endpoint`."""

    def __init__(
        self,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        replay_timeout_s: float = 2.0,
        changed: Callable[[], None] = lambda: None,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self._topic = topic.encode()
        self._replay_timeout_ms = int(replay_timeout_s * 1000)
        self._changed = changed
        self._context = context or zmq.asyncio.Context.instance()
        self.index = KvIndex()
        self.restarts = 0
        """Engine restarts seen (sequence 0 again): each began a new index."""
        self.malformed = 0

    def reset(self) -> None:
        """Forget the index: the engine starts anew (its next batch is sequence 0)."""
        self.index = KvIndex()

    async def run(self) -> None:
        """Subscribe and fold events in until cancelled."""
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, self._topic)
        sub.setsockopt(zmq.LINGER, 0)
        sub.connect(self.endpoint)
        try:
            if self.replay_endpoint is not None:
                await self._replay(self.index.expects(), before=None)
                self._changed()
            while True:
                frames = await sub.recv_multipart()
                await self._take(frames)
                self._changed()
        finally:
            sub.close(linger=0)

    async def _take(self, frames: list[bytes]) -> None:
        batch = _batch(frames)
        if batch is None:
            self.malformed += 1
            log.warning("KV events from %s: a malformed message; its batch counts as lost", self.endpoint)
            self.index.lose(self.index.expects() + 1)
            return
        seq, events = batch
        index = self.index
        if index.last_seq is not None and (seq == 0 or index.expects() - seq > _REPLAY_REACH):
            log.info(
                "KV events from %s: sequence %d after %d, the engine restarted",
                self.endpoint,
                seq,
                index.last_seq,
            )
            self.restarts += 1
            self.index = index = KvIndex()
        if seq < index.expects():
            return  # a batch a replay already applied
        if seq > index.expects():
            await self._replay(index.expects(), before=seq)
        if seq > index.expects():
            log.warning(
                "KV events from %s: batches %d to %d lost; residency is unsure until probed or cleared",
                self.endpoint,
                index.expects(),
                seq - 1,
            )
            index.lose(seq)
        if seq == index.expects():
            index.apply(seq, events)

    async def _replay(self, start: int, *, before: int | None) -> None:
        """Apply the engine's buffered batches from `start` (until `before`, if given) that follow on."""
        if self.replay_endpoint is None:
            return
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay_endpoint)
        try:
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            while await dealer.poll(self._replay_timeout_ms):
                frames = await dealer.recv_multipart()
                batch = _batch(frames[1:])  # [delimiter, topic, seq, payload]
                if batch is None or batch[0] == END_OF_REPLAY:
                    return
                seq, events = batch
                if before is not None and seq >= before:
                    continue  # the live message in hand applies it
                if seq > self.index.expects():
                    self.index.lose(seq)
                if seq == self.index.expects():
                    self.index.apply(seq, events)
            log.info("KV events: no replay from %s within the timeout", self.replay_endpoint)
        finally:
            with contextlib.suppress(zmq.ZMQError):
                dealer.close(linger=0)


def _batch(frames: list[bytes]) -> tuple[int, list[Any]] | None:
    """(sequence number, events) of a message's frames (topic, sequence, payload); None if malformed."""
    if len(frames) != 3 or len(frames[1]) != 8:
        return None
    seq = int.from_bytes(frames[1], "big")
    if seq == END_OF_REPLAY:
        return seq, []
    try:
        decoded = _decoder.decode(frames[2])
    except msgspec.DecodeError:
        return None
    if not isinstance(decoded, list) or len(decoded) < 2 or not isinstance(decoded[1], list):
        return None
    return seq, [event for event in decoded[1] if isinstance(event, dict)]
