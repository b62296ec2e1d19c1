"""What a long-running service's own process holds, on its metrics registry: resident memory, open file
descriptors and CPU (Prometheus' standard `process_*` series), and `warmplane_<service>_event_loop_tasks`,
the asyncio tasks alive on its event loop. A leak shows as one of these growing while the load stays flat
(`bench/soak.py` watches them)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class LoopTasks(Collector):
    """`warmplane_<service>_event_loop_tasks`: the unfinished tasks of the loop given to `watch` (where
    several services share one process and loop, as under `warmplane up`, each counts the loop's all).
    No sample until a loop is watched, or once it is closed. Safe to collect from another thread (the
    planner serves its metrics from one): `asyncio.all_tasks(loop)` reads a weak set and retries if it
    changes meanwhile."""

    def __init__(self, service: str) -> None:
        self.name = f"warmplane_{service}_event_loop_tasks"
        self._loop: asyncio.AbstractEventLoop | None = None

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def collect(self) -> Iterator[Metric]:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        yield GaugeMetricFamily(
            self.name,
            "Unfinished asyncio tasks on the service's event loop",
            value=len(asyncio.all_tasks(loop)),
        )


def register_process_metrics(registry: CollectorRegistry, service: str) -> LoopTasks:
    """The `process_*` series and the loop's task count on `registry`; call `watch` on the result with the
    service's running loop once it starts."""
    ProcessCollector(registry=registry)
    tasks = LoopTasks(service)
    registry.register(tasks)
    return tasks
