"""Embedded defaults: the real Kafka (Tansu), PostgreSQL 18 and Redis, started as child processes.

The main job and the test harness use these instead of external services. Each part is a context
manager that owns its process group; nothing registers ``atexit`` hooks, the owner stops what it starts.
"""

from warmplane.shared.embedded.kafka_broker import EmbeddedKafka
from warmplane.shared.embedded.part import EmbeddedPart
from warmplane.shared.embedded.postgres_server import EmbeddedPostgres
from warmplane.shared.embedded.processes import StartupError
from warmplane.shared.embedded.redis_server import EmbeddedRedis
from warmplane.shared.embedded.stack import EmbeddedStack

__all__ = [
    "EmbeddedKafka",
    "EmbeddedPart",
    "EmbeddedPostgres",
    "EmbeddedRedis",
    "EmbeddedStack",
    "StartupError",
]
