"""The embedded parts are real servers: they accept real client traffic and stop without leftovers."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import asyncpg  # no stubs; pyproject has no override yet
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from warmplane.shared.embedded import (
    EmbeddedKafka,
    EmbeddedPart,
    EmbeddedPostgres,
    EmbeddedRedis,
    EmbeddedStack,
    StartupError,
)
from warmplane.shared.embedded.processes import live_members, port_is_open, start_process, wait_until

_CLIENT_TIMEOUT_S = 10.0


async def test_kafka_round_trips_a_message_on_a_two_partition_topic(embedded_kafka: EmbeddedKafka) -> None:
    topic = f"embedded-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=embedded_kafka.bootstrap_servers)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name=topic, num_partitions=2, replication_factor=1)])
        described = await admin.describe_topics([topic])
    finally:
        await admin.close()
    assert len(described[0]["partitions"]) == 2

    producer = AIOKafkaProducer(bootstrap_servers=embedded_kafka.bootstrap_servers)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"warm me up", key=b"replica-1")
    finally:
        await producer.stop()

    # No group: a group join would wait session_timeout_ms / 2 on Tansu for nothing.
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=embedded_kafka.bootstrap_servers, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        record = await asyncio.wait_for(consumer.getone(), timeout=_CLIENT_TIMEOUT_S)
    finally:
        await consumer.stop()
    assert (record.key, record.value) == (b"replica-1", b"warm me up")


async def test_postgres_is_version_18_with_pgvector(embedded_postgres: EmbeddedPostgres) -> None:
    conn = await asyncpg.connect(embedded_postgres.asyncpg_dsn, timeout=_CLIENT_TIMEOUT_S)
    try:
        version = await conn.fetchval("select version()")
        await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        distance = await conn.fetchval("select '[1,2,3]'::vector <-> '[1,2,4]'::vector")
        durability = await conn.fetch(
            "select name, setting from pg_settings where name in ('fsync', 'synchronous_commit')"
        )
    finally:
        await conn.close()
    assert "PostgreSQL 18" in version
    assert distance == pytest.approx(1.0)
    assert {row["name"]: row["setting"] for row in durability} == {"fsync": "on", "synchronous_commit": "on"}


async def test_postgres_sqlalchemy_url_reaches_the_application_database(
    embedded_postgres: EmbeddedPostgres,
) -> None:
    engine = create_async_engine(embedded_postgres.sqlalchemy_url)
    try:
        async with engine.connect() as conn:
            database = (await conn.execute(text("select current_database()"))).scalar_one()
    finally:
        await engine.dispose()
    assert database == "warmplane"


async def test_redis_set_get_round_trips(embedded_redis: EmbeddedRedis) -> None:
    client = Redis.from_url(embedded_redis.url, socket_timeout=_CLIENT_TIMEOUT_S)
    try:
        await client.set("warmplane:probe", b"hot")
        value = await client.get("warmplane:probe")
    finally:
        await client.aclose()
    assert value == b"hot"


def _group_exists(pgid: int) -> bool:
    """Whether a member of `pgid` still runs. Zombies do not count: a killed part's children are
    orphans that a container's first process may never reap (`processes.live_members`)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return live_members(pgid)


@pytest.mark.parametrize("part_type", [EmbeddedKafka, EmbeddedPostgres, EmbeddedRedis])
@pytest.mark.parametrize("how", ["stop", "kill"])
def test_stopping_ends_the_whole_process_group(
    part_type: type[EmbeddedKafka | EmbeddedPostgres | EmbeddedRedis], how: str, tmp_path: Path
) -> None:
    part: EmbeddedPart = part_type(tmp_path)
    part.start()
    pid, port = part.pid, part.port
    assert pid is not None and port_is_open(part.host, port)

    part.stop() if how == "stop" else part.kill()

    assert not part.running
    assert not _group_exists(pid), f"process group {pid} still has members"
    assert not port_is_open(part.host, port)
    part.stop()  # a second stop (or a stop after kill) is a no-op
    part.kill()


def test_postgres_restarts_on_its_port_and_keeps_committed_data_after_kill(tmp_path: Path) -> None:
    async def write(dsn: str) -> None:
        conn = await asyncpg.connect(dsn, timeout=_CLIENT_TIMEOUT_S)
        try:
            await conn.execute(
                "create table survivors (id int primary key); insert into survivors values (7)"
            )
        finally:
            await conn.close()

    async def read(dsn: str) -> int:
        conn = await asyncpg.connect(dsn, timeout=_CLIENT_TIMEOUT_S)
        try:
            value: int = await conn.fetchval("select id from survivors")
            return value
        finally:
            await conn.close()

    with EmbeddedPostgres(tmp_path) as postgres:
        dsn = postgres.dsn
        asyncio.run(write(dsn))
        postgres.kill()
        postgres.start()
        assert postgres.dsn == dsn
        assert asyncio.run(read(dsn)) == 7


def test_stack_starts_all_parts_and_stops_them_in_reverse(tmp_path: Path) -> None:
    with EmbeddedStack(tmp_path) as stack:
        parts: list[EmbeddedPart] = [stack.kafka, stack.postgres, stack.redis]
        pids = [part.pid for part in parts]
        assert all(part.running for part in parts)
    assert not any(part.running for part in parts)
    assert not any(_group_exists(pid) for pid in pids if pid is not None)


def _processes_working_in(folder: Path) -> list[int]:
    """Pids whose current directory lies under ``folder`` (every part runs with cwd in its workdir)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cwd = (entry / "cwd").readlink()
            except OSError:
                continue  # exited meanwhile, or not ours to inspect
            if cwd.is_relative_to(folder):
                pids.append(int(entry.name))
    return pids


@pytest.mark.skipif(not Path("/proc/self/cwd").exists(), reason="needs Linux /proc")
def test_stack_stops_started_parts_when_a_later_part_fails(tmp_path: Path) -> None:
    stack = EmbeddedStack(tmp_path, postgres_settings={"no_such_setting": "1"})
    with pytest.raises(StartupError, match="unrecognized configuration parameter"):
        stack.start()
    assert (tmp_path / "kafka" / "kafka.log").exists(), "kafka should have started before postgres failed"
    assert _processes_working_in(tmp_path.resolve()) == []
    with pytest.raises(RuntimeError, match="start"):
        _ = stack.kafka


class _Sleepers(EmbeddedPart):
    """A "server" of two processes in one group, as vLLM's API server and its engine core: a shell and
    its child. With `ready`, it is ready as soon as it runs; without, never. `_spawn` waits for
    `spawn_allowed`, so a test can stop the part before its process exists."""

    name = "sleepers"

    def __init__(self, workdir: Path, *, ready: bool) -> None:
        super().__init__(workdir, start_timeout_s=120.0, stop_timeout_s=60.0)
        self.spawn_allowed = threading.Event()
        self.spawned: subprocess.Popen[bytes] | None = None
        self._ready = ready

    def _spawn(self, deadline: float) -> subprocess.Popen[bytes]:
        assert self.spawn_allowed.wait(timeout=self._remaining(deadline))
        self.spawned = start_process(["sh", "-c", "sleep 300 & wait"], self.log_path)
        return self.spawned

    def _wait_ready(self, proc: subprocess.Popen[bytes], deadline: float) -> None:
        wait_until(lambda: self._ready, timeout_s=self._remaining(deadline), what="never", proc=proc)


def _members(pgid: int) -> list[int]:
    return [
        int(stat.parent.name)
        for stat in Path("/proc").glob("[0-9]*/stat")
        if (fields := _stat_fields(stat)) is not None and fields[2] == str(pgid) and fields[0] != "Z"
    ]


def _stat_fields(stat: Path) -> list[str] | None:
    try:
        return stat.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


@pytest.mark.parametrize("when", ["before its process exists", "while it waits for readiness"])
def test_a_stop_from_another_thread_ends_a_start_under_way(tmp_path: Path, when: str) -> None:
    part = _Sleepers(tmp_path, ready=False)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        if when == "before its process exists":
            starting = pool.submit(part.start)
            part.stop()
            part.spawn_allowed.set()
        else:
            part.spawn_allowed.set()
            starting = pool.submit(part.start)
            deadline = time.monotonic() + 30
            while part.spawned is None or len(_members(part.spawned.pid)) < 2:
                assert time.monotonic() < deadline, "the part's two processes did not start"
                time.sleep(0.01)
            part.stop()
        with pytest.raises(StartupError):
            starting.result(timeout=10)  # not the start's 120 s
    assert part.spawned is not None and not _group_exists(part.spawned.pid)


def test_stop_ends_what_a_dead_leader_left_in_its_group_at_once(tmp_path: Path) -> None:
    part = _Sleepers(tmp_path, ready=True)
    part.spawn_allowed.set()
    part.start()
    leader = part.pid
    assert leader is not None
    deadline = time.monotonic() + 30
    while len(_members(leader)) < 2:
        assert time.monotonic() < deadline, "the part's two processes did not start"
        time.sleep(0.01)
    os.kill(leader, signal.SIGKILL)  # the server dies; its child (the engine core) lives on
    while leader in _members(leader):
        assert time.monotonic() < deadline, "the leader did not die"
        time.sleep(0.01)
    assert _group_exists(leader)

    began = time.monotonic()
    part.stop()
    assert time.monotonic() - began < 10, "waited for the stop timeout (60 s) instead of signalling"
    assert not _group_exists(leader)
