"""`warmplane evaluate-traffic`'s window: absolute times with an offset, or durations back from now."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from warmplane.services.cli.evaluate_traffic import parse_time
from warmplane.services.cli.main import main

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def test_durations_count_back_from_now_and_times_need_an_offset() -> None:
    assert parse_time("90s", NOW) == NOW - timedelta(seconds=90)
    assert parse_time("30m", NOW) == NOW - timedelta(minutes=30)
    assert parse_time("1.5h", NOW) == NOW - timedelta(minutes=90)
    assert parse_time("7d", NOW) == NOW - timedelta(days=7)
    assert parse_time("2025-05-31T08:00:00+02:00", NOW) == datetime(2025, 5, 31, 6, 0, tzinfo=UTC)
    with pytest.raises(ValueError, match="no UTC offset"):
        parse_time("2025-05-31T08:00:00", NOW)
    with pytest.raises(ValueError):
        parse_time("yesterday", NOW)


@pytest.mark.parametrize("bad", [["--since", "3 weeks"], ["--block-tokens", "0"], ["--join-at", "1.5"]])
def test_a_bad_argument_exits_2_before_any_broker_is_asked(
    bad: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["evaluate-traffic", "--tenant", "a", "--model", "m", *bad]) == 2
    assert capsys.readouterr().err.startswith("warmplane evaluate-traffic: ")
