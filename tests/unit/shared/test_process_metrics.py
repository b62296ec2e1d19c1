"""A service's own process on its registry: the loop's task count follows the tasks alive, and the standard
`process_*` series are there."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from warmplane.shared.process_metrics import register_process_metrics


def _tasks(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("warmplane_test_event_loop_tasks")


async def test_the_task_count_follows_the_watched_loops_unfinished_tasks() -> None:
    registry = CollectorRegistry()
    tasks = register_process_metrics(registry, "test")
    assert _tasks(registry) is None  # no loop watched yet: no sample, rather than a wrong one
    tasks.watch(asyncio.get_running_loop())
    before = _tasks(registry)
    assert before is not None and before >= 1  # this test's own task at least
    release = asyncio.Event()
    waiting = [asyncio.create_task(release.wait()) for _ in range(5)]
    assert _tasks(registry) == before + 5
    release.set()
    await asyncio.gather(*waiting)
    assert _tasks(registry) == before


def test_a_closed_loop_gives_no_sample_and_the_process_series_are_registered() -> None:
    registry = CollectorRegistry()
    tasks = register_process_metrics(registry, "test")
    loop = asyncio.new_event_loop()
    tasks.watch(loop)
    assert _tasks(registry) == 0
    loop.close()
    assert _tasks(registry) is None
    resident = registry.get_sample_value("process_resident_memory_bytes")
    assert resident is not None and resident > 0
    assert (registry.get_sample_value("process_open_fds") or 0) > 0
