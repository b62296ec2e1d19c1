"""The benches' summary contract (bench/summary.py): what a bench writes, `bench.report` reads back the
same, and a summary that breaks the contract is refused with the field named."""

from __future__ import annotations

import argparse
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest

from bench.summary import (
    Figure,
    Summary,
    SummaryRecorder,
    add_summary_option,
    command_line,
    decode_summary,
    encode_summary,
    markdown_table,
    parameters_of,
    read_summary,
)

STARTED = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def summary(**changes: object) -> Summary:
    fields: dict[str, object] = {
        "bench": "ingest",
        "title": "Planner ingestion against the raw loop",
        "command": "python -m bench.ingest_bench --runs 3",
        "parameters": {"runs": 3, "planners": [1, 2], "shape": "fleet", "profile": None},
        "runs": 3,
        "started": STARTED,
        "finished": STARTED + timedelta(minutes=5),
        "figures": [
            Figure(
                name="1 planner into Postgres",
                median=52_000.5,
                unit="events/s",
                baseline_name="raw loop",
                baseline_median=180_000.0,
                ratio=0.29,
            )
        ],
    }
    return Summary(**{**fields, **changes})  # type: ignore[arg-type]


def test_a_summary_round_trips_through_json() -> None:
    written = summary(notes=["a note"])
    assert decode_summary(encode_summary(written)) == written


def test_the_json_uses_the_contracts_field_names() -> None:
    data = msgspec.json.decode(encode_summary(summary()))
    assert list(data) == [
        "bench", "title", "command", "parameters", "runs", "started", "finished", "figures", "tables", "notes"
    ]  # fmt: skip
    assert list(data["figures"][0]) == ["name", "median", "unit", "baseline_name", "baseline_median", "ratio"]
    assert data["started"] == "2026-01-02T03:04:05Z"


def test_a_summary_written_by_hand_is_read_with_defaults_and_unknown_fields_ignored() -> None:
    text = b"""{"bench": "scaleup", "title": "t", "command": "python -m bench.scaleup", "parameters": {},
      "runs": 1, "started": "2026-01-02T03:04:05+00:00", "finished": "2026-01-02T03:05:05Z",
      "figures": [{"name": "n", "median": 1, "unit": "s"}], "later_field": 1}"""
    read = decode_summary(text)
    assert read.tables == [] and read.notes == []
    assert read.figures == [Figure(name="n", median=1.0, unit="s")]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ('"figures": []', "no figures"),
        ('"runs": 0', "runs"),
        ('"started": "2026-01-02T03:04:05"', "UTC offset"),
        ('"finished": "2026-01-01T00:00:00Z"', "finished before"),
        ('"figures": [{"name": "n", "median": 1, "unit": "s", "ratio": 2}]', "go together"),
        ('"figures": [{"name": "n", "median": "fast", "unit": "s"}]', "median"),
        ('"figures": [{"name": "n", "unit": "s"}]', "median"),
    ],
)
def test_a_summary_that_breaks_the_contract_is_refused_naming_why(change: str, named: str) -> None:
    fields = {
        "bench": '"x"', "title": '"t"', "command": '"c"', "parameters": "{}", "runs": "1",
        "started": '"2026-01-02T03:04:05Z"', "finished": '"2026-01-02T03:05:05Z"',
        "figures": '[{"name": "n", "median": 1, "unit": "s"}]',
    }  # fmt: skip
    key, _, value = change.partition(": ")
    fields[key.strip('"')] = value
    text = "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}"
    with pytest.raises(msgspec.ValidationError, match=named):
        decode_summary(text.encode())


def test_a_figure_must_be_finite() -> None:
    with pytest.raises(ValueError, match="finite"):
        Figure(name="n", median=math.nan, unit="s")


def test_the_command_line_leaves_out_the_summary_option_in_both_spellings() -> None:
    argv = ["--runs", "3", "--summary-json", "/tmp/x.json", "--shape", "fleet", "--summary-json=/tmp/y"]
    assert command_line("bench.ingest_bench", argv) == "python -m bench.ingest_bench --runs 3 --shape fleet"
    assert command_line("bench.x", ["--name", "a b"]) == "python -m bench.x --name 'a b'"


def test_parameters_are_the_parsed_arguments_without_the_summary_path() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--days", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--trace", type=Path, default=Path("a/b.jsonl"))
    add_summary_option(parser)
    args = parser.parse_args(["--summary-json", "/tmp/s.json"])
    assert args.summary_json == Path("/tmp/s.json")
    assert parameters_of(args) == {"days": [1, 8], "trace": "a/b.jsonl"}


def test_the_recorder_computes_a_missing_ratio_and_keeps_a_given_one(tmp_path: Path) -> None:
    recorder = SummaryRecorder(
        bench="b", title="t", module="bench.b", argv=["--runs", "2"], parameters={"runs": 2}, runs=2
    )
    recorder.figure("planner", 50.0, "events/s", ("raw", 200.0))
    recorder.figure("hit", 2.0, "ms", ("engine", 20.0), ratio=10.0)
    recorder.figure("alone", 1.5, "s")
    recorder.table("Per run.", ["run", "rate"], [[1, "50"]])
    recorder.note("n")
    recorder.write(tmp_path / "out" / "b.json")
    recorder.write(None)
    read = read_summary(tmp_path / "out" / "b.json")
    assert [(f.name, f.ratio) for f in read.figures] == [("planner", 0.25), ("hit", 10.0), ("alone", None)]
    assert read.command == "python -m bench.b --runs 2"
    assert read.tables[0].markdown == "| run | rate |\n| --- | ---: |\n| 1 | 50 |"
    assert read.started <= read.finished
    assert [path.name for path in (tmp_path / "out").iterdir()] == ["b.json"]


def test_a_baseline_of_zero_needs_its_ratio_given() -> None:
    recorder = SummaryRecorder(bench="b", title="t", module="m", argv=[], parameters={}, runs=1)
    with pytest.raises(ValueError, match="is 0"):
        recorder.figure("x", 1.0, "s", ("none", 0.0))


def test_markdown_tables_escape_pipes_and_align_figures_right() -> None:
    assert markdown_table(["a", "b|c", "d"], [["x|y", 2, "z"]], left=(0, 2)) == (
        "| a | b\\|c | d |\n| --- | ---: | --- |\n| x\\|y | 2 | z |"
    )
