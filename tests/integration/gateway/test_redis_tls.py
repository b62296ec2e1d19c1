"""The gateway's result cache over `rediss://`: its Redis client (`result_stores.redis_client`) takes TLS
from the URL alone (`ssl_ca_certs`, `ssl_certfile`, `ssl_keyfile` in the query). The embedded Redis has no
TLS listener, so TLS ends in a terminator in front of it (`tls_terminator.py`), with a CA this test makes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import SecretStr
from redis.exceptions import ConnectionError as RedisConnectionError

from tests.integration.tls_terminator import TlsTerminator, make_certificates, server_context
from warmplane.services.gateway.result_stores import RedisAnswers, redis_client
from warmplane.shared.embedded.redis_server import EmbeddedRedis
from warmplane.shared.settings import RedisSettings


@pytest.fixture
async def tls_redis(tmp_path: Path) -> AsyncIterator[tuple[TlsTerminator, Path]]:
    make_certificates(tmp_path)
    context = server_context(str(tmp_path / "server.pem"), str(tmp_path / "server.key"))
    with EmbeddedRedis(tmp_path / "redis") as redis:
        async with TlsTerminator(("127.0.0.1", redis.port), context) as terminator:
            yield terminator, tmp_path


def answers(url: str) -> RedisAnswers:
    return RedisAnswers(redis_client(RedisSettings(url=SecretStr(url), socket_timeout_s=5)))


async def test_the_result_cache_reads_and_writes_over_rediss_and_nothing_else_gets_through(
    tls_redis: tuple[TlsTerminator, Path],
) -> None:
    terminator, folder = tls_redis
    base = f"127.0.0.1:{terminator.port}/0"
    with pytest.raises(RedisConnectionError):
        await answers(f"redis://{base}").get("k")
    with pytest.raises(RedisConnectionError, match="certificate verify failed"):
        await answers(f"rediss://{base}?ssl_ca_certs={folder / 'other-ca.pem'}").get("k")
    assert terminator.sessions == 0

    cache = answers(f"rediss://{base}?ssl_ca_certs={folder / 'ca.pem'}")
    await cache.put("answer:acme:1", b'{"choices": []}', ttl_s=60)
    assert await cache.get("answer:acme:1") == b'{"choices": []}'
    assert terminator.sessions >= 1
