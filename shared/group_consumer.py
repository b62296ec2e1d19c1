"""The consumer a service reads a control topic with (plans, lifecycle): one home for how it joins its group,
how long a fetch waits and how patient it is, so every service treats the broker alike; and how a reader of
one is stopped."""

from __future__ import annotations

import asyncio
import contextlib

from aiokafka import AIOKafkaConsumer

from warmplane.shared.kafka_clients import client_security
from warmplane.shared.settings import KafkaSettings


def group_consumer(kafka: KafkaSettings, *topics: str, name: str, group_id: str) -> AIOKafkaConsumer:
    """A consumer of `topics` (not started) in group `group_id`, its client id ending in `name`. It commits
    by hand, and a new group starts from the earliest record. A request may take longer than the session
    timeout: a group join is answered only once the group settles, up to that long, and must not be cut
    off before."""
    return AIOKafkaConsumer(
        *topics,
        bootstrap_servers=kafka.bootstrap_servers,
        **client_security(kafka.security),
        client_id=f"{kafka.client_id}-{name}",
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=kafka.session_timeout_ms,
        heartbeat_interval_ms=kafka.heartbeat_interval_ms,
        request_timeout_ms=max(kafka.request_timeout_ms, kafka.session_timeout_ms + 1),
        fetch_max_wait_ms=kafka.fetch_max_wait_ms,
    )


async def stop_reader(task: asyncio.Task[None] | None, consumer: AIOKafkaConsumer | None) -> None:
    """Stop a background reader: cancel `task` (its reading loop) and wait for it to end, then stop
    `consumer`, so no fetch is left in flight on a stopped client. Either may be None (never started)."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    if consumer is not None:
        await consumer.stop()
