"""Creating the topics a service needs, with their partition counts, before it produces or consumes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from warmplane.shared.kafka_clients import client_security
from warmplane.shared.settings import KafkaSettings
from warmplane.shared.topics import topic_configs

log = logging.getLogger(__name__)


async def ensure_topics(settings: KafkaSettings, topics: Iterable[str], *, timeout_s: float = 30.0) -> None:
    """Create those of `topics` that do not exist yet. Waits at most `timeout_s` for the broker."""
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.bootstrap_servers,
        **client_security(settings.security),
        client_id=f"{settings.client_id}-admin",
        request_timeout_ms=settings.request_timeout_ms,
    )
    try:
        async with asyncio.timeout(timeout_s):
            await admin.start()
        async with asyncio.timeout(timeout_s):
            existing = set(await admin.list_topics())
        missing = [name for name in topics if name not in existing]
        if not missing:
            return
        size = (settings.partitions, settings.replication_factor)
        new = [NewTopic(name, *size, topic_configs=topic_configs(name)) for name in missing]
        try:
            async with asyncio.timeout(timeout_s):
                await admin.create_topics(new)
        except TopicAlreadyExistsError:
            log.info("topics were created concurrently: %s", missing)
        log.info("created topics %s with %d partitions", missing, settings.partitions)
    except TimeoutError as exc:
        raise TimeoutError(
            f"the Kafka broker at {settings.bootstrap_servers} did not answer within {timeout_s} s"
        ) from exc
    finally:
        await admin.close()
