"""Embedded defaults: the real Kafka (Tansu), PostgreSQL 18 and Redis, started as child processes.

The main job and the test harness use these instead of external services. Each part is a context
manager that owns its process group; nothing registers ``atexit`` hooks, the owner stops what it starts.
"""

from .kafka_broker import EmbeddedKafka
from .part import EmbeddedPart
from .postgres_server import EmbeddedPostgres
from .processes import StartupError
from .redis_server import EmbeddedRedis
from .stack import EmbeddedStack

__all__ = [
    "EmbeddedKafka",
    "EmbeddedPart",
    "EmbeddedPostgres",
    "EmbeddedRedis",
    "EmbeddedStack",
    "StartupError",
]
