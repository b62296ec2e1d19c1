"""Prometheus metrics of an emitter, read from its counters at scrape time (nothing on the hot path)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from warmplane.shared.emitter_ledger import EmitterStats

EMITTED: Final = "warmplane_emitter_events_emitted"
SENT: Final = "warmplane_emitter_events_sent"
DROPPED: Final = "warmplane_emitter_events_dropped"
STRIPPED: Final = "warmplane_emitter_payloads_stripped"
BUFFERED: Final = "warmplane_emitter_buffered_events"
CONNECTED: Final = "warmplane_emitter_connected"


class EmitterCollector:
    """A prometheus_client collector over `stats()`; counters gain the `_total` suffix when exposed."""

    def __init__(self, stats: Callable[[], EmitterStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterable[Metric]:
        stats = self._stats()
        yield CounterMetricFamily(EMITTED, "Events accepted by emit().", value=stats.emitted)
        yield CounterMetricFamily(SENT, "Events acknowledged by the broker.", value=stats.sent)
        dropped = CounterMetricFamily(DROPPED, "Events dropped, by reason.", labels=["reason"])
        for reason, count in stats.dropped.items():
            dropped.add_metric([reason.value], count)
        yield dropped
        yield CounterMetricFamily(
            STRIPPED, "Events sent without their oversized payload.", value=stats.payloads_stripped
        )
        yield GaugeMetricFamily(
            BUFFERED, "Events queued, in flight or awaiting a retry.", value=stats.buffered
        )
        yield GaugeMetricFamily(
            CONNECTED, "1 once the producer has connected, 0 before and after.", value=int(stats.connected)
        )
