"""The scale path's arithmetic (`bench/scale_path.py`): pure, on given costs."""

from __future__ import annotations

import pytest

from bench.scale_path import FIGURES, Costs, Fleet, costs_from_summary, one_node_limit, size

COSTS = Costs(
    planner_us=25.0, postgres_us=20.0, wal_bytes=800.0, rows_written=2.0, stored_bytes=500.0, source="test"
)


def test_a_fleet_is_sized_from_its_event_rate_and_each_cost_an_event() -> None:
    fleet = Fleet(replicas=1_000, requests_per_replica=100.0, events_per_request=1.0)
    sized = size(fleet, COSTS, utilization=0.5, retention_days=31, window_hours=2)
    assert fleet.events_per_s == 100_000
    assert sized.planners == 5  # 100,000 x 25 us = 2.5 cores of work, each core half busy
    assert sized.postgres_cores == pytest.approx(4.0)
    assert sized.wal_mb_s == pytest.approx(80.0)
    assert sized.rows_per_s == pytest.approx(200_000)
    assert sized.stored_gb_day == pytest.approx(100_000 * 500 * 86_400 / 1e9)
    assert sized.kept_today_tb == pytest.approx(sized.stored_gb_day * 31 / 1_000)
    assert sized.kept_window_gb == pytest.approx(sized.stored_gb_day / 12)
    assert size(Fleet(1, 0.01, 1.0), COSTS, utilization=1, retention_days=1, window_hours=1).planners == 1
    with pytest.raises(ValueError, match="utilization"):
        size(fleet, COSTS, utilization=0, retention_days=31, window_hours=2)


def test_one_node_is_bound_by_whichever_of_its_cores_and_its_wal_runs_out_first() -> None:
    # 100 events/s a replica: 16 cores at 50% take 8e6 / 20 / 100 = 4,000; 40 MB/s takes 500.
    limit, binding = one_node_limit(
        COSTS, requests_per_replica=100, events_per_request=1, cores=16, wal_mb_s=40, utilization=0.5
    )
    assert (limit, "WAL" in binding) == (500, True)
    limit, binding = one_node_limit(
        COSTS, requests_per_replica=100, events_per_request=1, cores=2, wal_mb_s=400, utilization=0.5
    )
    assert (limit, "cores" in binding) == (500, True)


def test_costs_come_from_a_summary_and_a_missing_figure_is_named() -> None:
    summary = {"figures": [{"name": name, "median": 2.0} for name in FIGURES.values()]}
    assert costs_from_summary(summary, "s").wal_bytes == 2.0
    summary["figures"] = summary["figures"][1:]
    with pytest.raises(ValueError, match="lacks 1 planner: its CPU an event"):
        costs_from_summary(summary, "s")
