"""The warmer's KV event feed against a publisher speaking vLLM's wire protocol over real ZeroMQ sockets
(PUB frames topic / 8-byte sequence / msgpack batch; a ROUTER answering replays from its buffer, ending
with an empty topic and sequence 2^64 - 1), so that lost messages can be made to happen on purpose. The
feed against a real engine is in test_warm_residency."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections import deque
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from tests.integration.warmer_harness import wait_for
from warmplane.services.warmer.core.kv_index import block_chain
from warmplane.services.warmer.kv_events import END_OF_REPLAY, KvEventFeed

_TIMEOUT_S = 10.0


def stored(first_token: int) -> dict[str, Any]:
    """A one-block `BlockStored` (block size 2) whose hash is its first token."""
    return {
        "type": "BlockStored",
        "block_hashes": [first_token],
        "parent_block_hash": None,
        "token_ids": [first_token, first_token + 1],
        "block_size": 2,
        "medium": "GPU",
        "extra_keys": [None],
        "group_idx": 0,
    }


def held(feed: KvEventFeed, first_token: int) -> bool:
    return feed.index.holds(block_chain([first_token, first_token + 1, 0], 2, None))


class Publisher:
    """An engine's KV event publisher: every batch goes to the buffer; `send` may skip the PUB socket."""

    def __init__(self, context: zmq.asyncio.Context, folder: Path, buffer: int) -> None:
        self.endpoint = f"ipc://{folder}/kv"
        self.replay_endpoint = f"ipc://{folder}/kv-replay"
        self._pub = context.socket(zmq.PUB)
        self._pub.bind(self.endpoint)
        self._router = context.socket(zmq.ROUTER)
        self._router.bind(self.replay_endpoint)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer)
        self.seq = 0

    async def send(self, *events: dict[str, Any], deliver: bool = True) -> None:
        payload = msgspec.msgpack.encode([0.0, list(events), None])
        self._buffer.append((self.seq, payload))
        if deliver:
            await self._pub.send_multipart([b"", self.seq.to_bytes(8, "big"), payload])
        self.seq += 1

    async def raw(self, frames: list[bytes]) -> None:
        await self._pub.send_multipart(frames)

    async def serve_replays(self) -> None:
        while True:
            client, _, start = await self._router.recv_multipart()
            for seq, payload in list(self._buffer):
                if seq >= int.from_bytes(start, "big"):
                    await self._router.send_multipart([client, b"", b"", seq.to_bytes(8, "big"), payload])
            await self._router.send_multipart([client, b"", b"", END_OF_REPLAY.to_bytes(8, "big"), b""])

    def close(self) -> None:
        self._pub.close(linger=0)
        self._router.close(linger=0)


@contextlib.asynccontextmanager
async def running(
    *, buffer: int = 100, replay: bool = True, before: Callable[[Publisher], Any] | None = None
) -> AsyncIterator[tuple[Publisher, KvEventFeed]]:
    """A publisher and a feed subscribed to it (after `before(publisher)` ran), both stopped after."""
    context = zmq.asyncio.Context()
    with tempfile.TemporaryDirectory(prefix="warmplane-kv-") as folder:
        publisher = Publisher(context, Path(folder), buffer)
        server = asyncio.create_task(publisher.serve_replays())
        if before is not None:
            await before(publisher)
        feed = KvEventFeed(
            publisher.endpoint,
            replay_endpoint=publisher.replay_endpoint if replay else None,
            replay_timeout_s=2.0,
            context=context,
        )
        task = asyncio.create_task(feed.run())
        try:
            yield publisher, feed
        finally:
            for running_task in (task, server):
                running_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await running_task
            publisher.close()
            context.term()


async def joined(publisher: Publisher, feed: KvEventFeed) -> None:
    """Until the feed's subscription carries messages (a SUB socket joins some time after connecting)."""
    marker = 10_000

    async def arrived() -> bool:
        await publisher.send(stored(marker))
        await asyncio.sleep(0.05)
        return held(feed, marker)

    for _ in range(100):
        if await arrived():
            return
    raise AssertionError("the feed never received a live message")


async def test_what_was_published_before_the_feed_joined_is_replayed_from_the_start() -> None:
    async def early(publisher: Publisher) -> None:
        for token in (0, 2, 4):
            await publisher.send(stored(token), deliver=False)

    async with running(before=early) as (publisher, feed):
        await joined(publisher, feed)
        assert all(held(feed, token) for token in (0, 2, 4))
        assert feed.index.complete and feed.index.gaps == 0


async def test_a_dropped_batch_is_replayed_and_one_past_the_buffer_leaves_the_index_incomplete() -> None:
    async with running(buffer=3) as (publisher, feed):
        await joined(publisher, feed)
        await publisher.send(stored(20), deliver=False)
        await publisher.send({"type": "BlockRemoved", "block_hashes": [10_000], "medium": "GPU"})
        await wait_for(lambda: held(feed, 20) and not held(feed, 10_000), timeout_s=_TIMEOUT_S, what="replay")
        assert feed.index.complete

        for token in (30, 32, 34, 36):  # four dropped; the buffer of three keeps 34, 36 and 40
            await publisher.send(stored(token), deliver=False)
        await publisher.send(stored(40))
        await wait_for(lambda: held(feed, 40), timeout_s=_TIMEOUT_S, what="the batch after the gap")
        assert (feed.index.complete, feed.index.gaps) == (False, 1)
        assert [held(feed, token) for token in (30, 32, 34, 36)] == [False, False, True, True]

        await publisher.send({"type": "AllBlocksCleared"})
        await wait_for(lambda: feed.index.complete, timeout_s=_TIMEOUT_S, what="a clear")
        assert len(feed.index) == 0


async def test_without_replays_a_gap_is_lost_and_a_malformed_message_does_not_stop_the_feed() -> None:
    async with running(replay=False) as (publisher, feed):
        await joined(publisher, feed)
        await publisher.send(stored(50), deliver=False)
        await publisher.send(stored(52))
        await wait_for(lambda: held(feed, 52), timeout_s=_TIMEOUT_S, what="the batch after the gap")
        assert not held(feed, 50) and not feed.index.complete

        await publisher.raw([b"", b"short", b"\xc1"])
        publisher.seq += 1  # what the garbled message stood for
        await publisher.send(stored(54))
        await wait_for(lambda: held(feed, 54), timeout_s=_TIMEOUT_S, what="the batch after the garbage")
        assert feed.malformed == 1


async def test_sequence_zero_again_is_an_engine_restart_with_an_empty_cache() -> None:
    async with running(replay=False) as (publisher, feed):
        await joined(publisher, feed)
        publisher.seq = 0
        await publisher.send(stored(60))
        await wait_for(lambda: held(feed, 60), timeout_s=_TIMEOUT_S, what="the restarted engine's batch")
        assert not held(feed, 10_000) and feed.restarts == 1 and feed.index.complete


async def test_a_sequence_far_behind_the_last_is_a_restart_whose_first_batches_were_missed() -> None:
    async with running(replay=False) as (publisher, feed):
        await joined(publisher, feed)
        publisher.seq = 20_000  # a long-running engine (the batches between are lost: no replay here)
        await publisher.send(stored(70))
        await wait_for(lambda: held(feed, 70), timeout_s=_TIMEOUT_S, what="the long-running engine's batch")
        publisher.seq = 3  # restarted, and its batches 0 to 2 were missed
        await publisher.send(stored(72))
        await wait_for(lambda: held(feed, 72), timeout_s=_TIMEOUT_S, what="the restarted engine's batch")
        assert not held(feed, 70) and feed.restarts == 1
