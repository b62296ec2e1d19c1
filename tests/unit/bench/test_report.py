"""`bench.report`'s document: JSON in, Markdown out; a run's sections replace only their own; a failed or
missing bench is said, never left out; the registry names every kept bench."""

from __future__ import annotations

import importlib.util
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bench.report import BENCHES, taken_section
from bench.report_document import Machine, Results, Run, Section, decode_results, encode_results, merge
from bench.report_markdown import LOG_LINES, number, render
from bench.summary import Figure, Summary, Table, write_summary

REGISTRY = [("ingest", "Ingestion"), ("epoch", "Epochs"), ("gateway", "Gateway"), ("scaleup", "Scale-up")]
MACHINE = Machine(cpu="Test CPU @ 2 GHz", cores=2, memory_gib=23.4, python="3.11.7", system="Linux 6 x86_64")
T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def run(at: datetime, command: str = "python -m bench.report", commit: str = "abc123") -> Run:
    return Run(
        id=at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        command=command,
        started=at,
        finished=at + timedelta(minutes=50),
        commit=commit,
        machine=MACHINE,
        load_before=[0.5, 0.4, 0.3],
        load_after=[1.9, 1.5, 1.0],
    )


def ok(bench: str, at: datetime, median: float = 52_000.0) -> Section:
    summary = Summary(
        bench=bench,
        title=f"{bench} measured",
        command=f"python -m bench.{bench}_bench --runs 3",
        parameters={"runs": 3, "shape": "fleet"},
        runs=3,
        started=at,
        finished=at + timedelta(minutes=1),
        figures=[
            Figure(
                name="1 planner",
                median=median,
                unit="events/s",
                baseline_name="raw loop",
                baseline_median=180_000.0,
                ratio=median / 180_000.0,
            ),
            Figure(name="trie build", median=0.0421, unit="s"),
        ],
        tables=[Table(caption="Each run's rates.", markdown="| run | rate |\n| --- | ---: |\n| 1 | 5 |")],
        notes=["Ratios are medians of runs."],
    )
    return Section(
        bench=bench,
        run=run(at).id,
        status="ok",
        command=summary.command,
        seconds=61.4,
        load_before=[0.5, 0.4, 0.3],
        load_after=[1.2, 0.9, 0.5],
        summary=summary,
    )


def failed(bench: str, at: datetime, log: str) -> Section:
    return Section(
        bench=bench,
        run=run(at).id,
        status="failed",
        command=f"python -m bench.{bench}_bench",
        seconds=3.0,
        load_before=[0.5, 0.4, 0.3],
        load_after=[0.6, 0.4, 0.3],
        problem="exited with code 1",
        log_tail=log,
    )


def test_the_header_says_how_where_and_when_the_figures_were_made() -> None:
    text = render(Results(runs=[run(T0)], sections=[ok("ingest", T0)]), REGISTRY)
    assert text.startswith("# Benchmark results\n")
    assert "| 2026-01-02 03:04 | 2026-01-02 03:54 | `python -m bench.report` | abc123 |" in text
    assert "Test CPU @ 2 GHz, 2 cores, 23.4 GiB, Linux 6 x86_64, Python 3.11.7" in text
    assert "0.50 0.40 0.30 → 1.90 1.50 1.00" in text
    assert "Pending a full run (`python -m bench.report`), no figures yet: epoch, gateway, scaleup." in text


def test_the_headline_has_a_line_per_figure_and_says_what_failed_or_is_missing() -> None:
    sections = [ok("ingest", T0), failed("gateway", T0, "boom")]
    text = render(Results(runs=[run(T0)], sections=sections), REGISTRY)
    headline = text.split("## Headline figures\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert headline[2:] == [
        "| [ingest](#bench-ingest) | 1 planner | 52,000 events/s | raw loop: 180,000 events/s | 0.29 |",
        "| [ingest](#bench-ingest) | trie build | 0.0421 s | none |  |",
        "| [epoch](#bench-epoch) | pending: not run yet |  |  |  |",
        "| [gateway](#bench-gateway) | **failed**: exited with code 1 |  |  |  |",
        "| [scaleup](#bench-scaleup) | pending: not run yet |  |  |  |",
    ]


def test_a_section_gives_its_command_parameters_figures_notes_and_tables() -> None:
    text = render(Results(runs=[run(T0)], sections=[ok("ingest", T0)]), REGISTRY)
    section = text.split('<a id="bench-ingest"></a>\n', 1)[1].split("<a id=", 1)[0]
    assert section.startswith(
        "## ingest: ingest measured\n\nRun of 2026-01-02T03:04:05Z (commit abc123); 61 s"
    )
    assert "Medians of 3 runs.\n\nCommand:\n\n    python -m bench.ingest_bench --runs 3\n" in section
    assert "Parameters: runs=3, shape=fleet." in section
    assert "| 1 planner | 52,000 events/s | raw loop: 180,000 events/s | 0.29 |" in section
    assert "- Ratios are medians of runs.\n\nEach run's rates.\n\n| run | rate |" in section


def test_a_failed_section_quotes_the_end_of_its_log_in_a_fence_it_cannot_close() -> None:
    log = "\n".join(f"line {i}" for i in range(100)) + "\n```\nTraceback: RuntimeError"
    text = render(Results(runs=[run(T0)], sections=[failed("gateway", T0, log)]), REGISTRY)
    section = text.split('<a id="bench-gateway"></a>\n', 1)[1]
    assert "**Failed**: exited with code 1. The last lines of its log:\n\n```text\n" in section
    quoted = section.split("```text\n", 1)[1].split("\n```", 1)[0].splitlines()
    assert len(quoted) == LOG_LINES and quoted[-2:] == ["'''", "Traceback: RuntimeError"]
    assert "line 59" not in quoted and "line 99" in quoted
    assert "    python -m bench.gateway_bench" in section


def test_merging_replaces_only_the_sections_run_again_and_leaves_the_others_as_they_were() -> None:
    later = T0 + timedelta(days=1)
    first = Results(runs=[run(T0)], sections=[ok("ingest", T0), ok("epoch", T0, median=7.0)])
    second = Results(runs=[run(later, "python -m bench.report --only epoch")], sections=[ok("epoch", later)])
    merged = merge(first, second)
    assert [(s.bench, s.run) for s in merged.sections] == [
        ("ingest", "2026-01-02T03:04:05Z"),
        ("epoch", "2026-01-03T03:04:05Z"),
    ]
    assert [r.id for r in merged.runs] == ["2026-01-02T03:04:05Z", "2026-01-03T03:04:05Z"]
    before, after = render(first, REGISTRY), render(merged, REGISTRY)
    assert _section(before, "ingest") == _section(after, "ingest")
    assert _section(before, "epoch") != _section(after, "epoch")
    assert "`python -m bench.report --only epoch`" in after


def test_a_run_no_section_names_any_more_leaves_the_header() -> None:
    later = T0 + timedelta(days=1)
    first = Results(runs=[run(T0)], sections=[ok("ingest", T0)])
    merged = merge(first, Results(runs=[run(later)], sections=[ok("ingest", later)]))
    assert [r.id for r in merged.runs] == [run(later).id]
    assert merge(None, first) == first


def test_the_document_round_trips_through_its_json() -> None:
    sections = [ok("ingest", T0), failed("gateway", T0, "x")]
    results = Results(runs=[run(T0)], sections=sections)
    assert decode_results(encode_results(results)) == results
    assert results.failed == ["gateway"]


@pytest.mark.parametrize(
    ("value", "shown"),
    [(1_234_567.8, "1,234,568"), (123.4, "123"), (12.34, "12.3"), (1.234, "1.23"), (0.01234, "0.0123")],
)
def test_figures_are_shown_to_about_three_digits(value: float, shown: str) -> None:
    assert number(value) == shown


def test_the_registry_holds_every_kept_bench_once_and_each_module_exists() -> None:
    names = [bench.name for bench in BENCHES]
    assert len(names) == len(set(names))
    kept = {"ingest", "emitter", "warm", "gateway", "result_cache", "epoch", "plan_scale", "route_scale"}
    kept |= {
        "stats_index",
        "statistics_read",
        "evaluate_policy",
        "scaleup",
        "broker_poll",
        "soak",
        "embedding",
        "plan_latency",
        "result_layers",
        "ingest_chat",
        "store_eval",
        "fold",
        "batch_write",
    }
    assert set(names) == kept
    for bench in BENCHES:
        assert importlib.util.find_spec(bench.module) is not None, bench.module
        assert bench.timeout_minutes > bench.minutes


def _section(text: str, bench: str) -> str:
    return text.split(f'<a id="bench-{bench}"></a>\n', 1)[1].split("<a id=", 1)[0]


def test_a_taken_summary_becomes_its_benchs_section_and_a_foreign_one_fails(tmp_path: Path) -> None:
    scaleup = next(bench for bench in BENCHES if bench.name == "scaleup")
    summary = ok("scaleup", T0).summary
    assert summary is not None
    path = tmp_path / "scaleup.json"
    write_summary(summary, path)

    section = taken_section(scaleup, path, "run-1")

    assert (section.status, section.summary, section.command) == ("ok", summary, summary.command)
    assert section.seconds == 60.0  # the bench's own start to finish
    write_summary(ok("ingest", T0).summary or summary, path)
    assert taken_section(scaleup, path, "run-1").problem == "its summary names bench 'ingest', not 'scaleup'"
    assert taken_section(scaleup, tmp_path / "none.json", "run-1").status == "failed"
