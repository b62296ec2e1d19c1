"""A planner cut off from the network, broker and Postgres alike, for longer than its group session (issue
21's fault suite), on hosts of the test's own (`network_hosts.py`): the other planner of its group takes its
partitions over and counts on; when the cut-off one comes back, what it had read before the cut is refused
by the positions stored past it (fenced), and every event of the stream is counted exactly once."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

import asyncpg
import pytest
from pydantic import SecretStr

from tests.integration.network_hosts import NetworkHosts, broker_on, database_on, print_logs, service
from tests.integration.planner.ingest_stream import (
    COUNTED,
    Stream,
    assert_counted_once,
    drained,
    retried_stream,
)
from tests.integration.planner_harness import poll_until, produce
from warmplane.services.planner.settings import IngestSettings, PlannerSettings
from warmplane.shared.settings import PostgresSettings

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs as root)")

EVENTS = 60_000
FENCED = "are stored past this batch"
_TIMEOUT_S = 120.0


async def test_a_planner_partitioned_away_is_fenced_and_nothing_is_counted_twice() -> None:
    with (
        tempfile.TemporaryDirectory(prefix="warmplane-partition-") as folder,
        NetworkHosts(["control", "planner-a", "planner-b"]) as hosts,
        broker_on(hosts, "control", Path(folder)) as kafka,
    ):
        async with database_on(hosts, "control", Path(folder)) as dsn:
            settings = PlannerSettings(
                kafka=kafka.model_copy(update={"partitions": 4}),
                postgres=PostgresSettings(url=SecretStr(dsn)),
                # Small batches: each planner has several read and queued when the cut comes.
                ingest=IngestSettings(group_id="planners", batch_max_records=1_000, batch_timeout_ms=50),
                metrics_port=0,
            )
            stream = retried_stream(seed=23, count=EVENTS)
            await produce(settings.kafka, stream.events)
            try:
                await _partition(hosts, settings, stream, Path(folder), dsn)
            except BaseException:
                print_logs(Path(folder))
                raise


async def _partition(
    hosts: NetworkHosts, settings: PlannerSettings, stream: Stream, workdir: Path, dsn: str
) -> None:
    db = await asyncpg.connect(dsn)
    try:

        async def counted(share: float) -> bool:
            return bool(await db.fetchval(COUNTED) >= stream.total * share)

        cut_off = service(hosts, "planner-a", "planner", settings, workdir)
        await poll_until(lambda: counted(0.1), timeout_s=_TIMEOUT_S, what="planner a counting")
        service(hosts, "planner-b", "planner", settings, workdir)
        await poll_until(lambda: counted(0.3), timeout_s=_TIMEOUT_S, what="both planners counting")
        hosts.cut("planner-a")  # mid-stream: batches read, queued, maybe half written
        await poll_until(
            lambda: drained(db, settings, stream),
            timeout_s=_TIMEOUT_S,
            what="planner b to count the rest alone",
        )
        assert cut_off.running, "the cut-off planner runs on, unaware"
        hosts.heal("planner-a")

        async def fenced() -> bool:
            return FENCED in await asyncio.to_thread(cut_off.log_path.read_text, errors="replace")

        await poll_until(
            fenced, timeout_s=_TIMEOUT_S, what="planner a's stale batches refused by the stored positions"
        )
        await poll_until(
            lambda: drained(db, settings, stream), timeout_s=_TIMEOUT_S, what="the group settled"
        )
        await assert_counted_once(db, stream)
        assert cut_off.running, "fenced, not stopped: it re-reads what it still owns"
    finally:
        await db.close()
