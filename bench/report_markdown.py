"""`bench/RESULTS.md` from a `Results` document: a header (how it was made, the runs: command, date,
machine, commit, load), one headline line per figure, then a section per bench in the registry's order.
Pure: the same document renders to the same text, so a section re-run alone changes nothing else but the
header's runs and its own lines.

A bench the document has no section for is `pending`; a failed one says so in the headline table and its
section quotes its log's tail: no figure is ever left out silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from bench.report_document import Machine, Results, Run, Section
from bench.summary import Figure, Summary, markdown_table

LOG_LINES = 40
"""Lines of a failed bench's log quoted in its section."""

INTRO = """\
Written by `python -m bench.report` (`make bench`); `python -m bench.report --only NAME[,NAME]` runs
some benches again and replaces only their sections. Generated: edit the benches, not this file (its
data is kept beside it, in `RESULTS.json`).

Each figure is a median over the bench's runs, beside a baseline measured in the same run on the same
machine; the ratio is the bench's own (its section says how it is formed when it is not median /
baseline). The machine is shared with other work: compare figures within a run, not across runs."""


def render(results: Results, registry: Sequence[tuple[str, str]]) -> str:
    """The whole file; `registry` is every bench's (name, title), in the order the report runs them."""
    sections = {section.bench: section for section in results.sections}
    runs = {run.id: run for run in results.runs}
    pending = [name for name, _ in registry if name not in sections]
    parts = ["# Benchmark results", INTRO, "## Runs", _runs_table(results.runs)]
    if pending:
        parts.append(f"Pending a full run (`python -m bench.report`), no figures yet: {', '.join(pending)}.")
    parts += ["## Headline figures", _headline(registry, sections)]
    for name, title in registry:
        section = sections.get(name)
        if section is None:
            parts.append(_pending(name, title))
        else:
            parts.append(_section(section, title, runs.get(section.run)))
    return "\n\n".join(parts) + "\n"


def _runs_table(runs: Sequence[Run]) -> str:
    rows = [
        [
            _when(run.started),
            _when(run.finished),
            f"`{run.command}`",
            run.commit,
            _machine(run.machine),
            f"{_load(run.load_before)} → {_load(run.load_after)}",
        ]
        for run in runs
    ]
    columns = ["started (UTC)", "finished", "command", "commit", "machine", "load average before → after"]
    return markdown_table(columns, rows, left=range(len(columns)))


def _machine(machine: Machine) -> str:
    return (
        f"{machine.cpu}, {machine.cores} cores, {machine.memory_gib:.1f} GiB, {machine.system},"
        f" Python {machine.python}"
    )


def _headline(registry: Sequence[tuple[str, str]], sections: dict[str, Section]) -> str:
    rows: list[list[str]] = []
    for name, _ in registry:
        section = sections.get(name)
        link = f"[{name}](#{anchor(name)})"
        if section is None:
            rows.append([link, "pending: not run yet", "", "", ""])
        elif section.summary is None:
            rows.append([link, f"**{section.status}**: {_one_line(section.problem)}", "", "", ""])
        else:
            rows += [[link, *_figure_cells(figure)] for figure in section.summary.figures]
    return markdown_table(["bench", "figure", "median", "baseline (same run)", "ratio"], rows, left=(0, 1, 3))


def _figure_cells(figure: Figure) -> list[str]:
    median = f"{number(figure.median)} {figure.unit}"
    if figure.baseline_name is None or figure.baseline_median is None or figure.ratio is None:
        return [figure.name, median, "none", ""]
    baseline = f"{figure.baseline_name}: {number(figure.baseline_median)} {figure.unit}"
    return [figure.name, median, baseline, ratio(figure.ratio)]


def _pending(name: str, title: str) -> str:
    return (
        f"{_heading(name, title)}\n\nPending: not run yet. `python -m bench.report --only {name}` runs it"
        " and fills this section."
    )


def _section(section: Section, title: str, run: Run | None) -> str:
    summary = section.summary
    heading = _heading(section.bench, summary.title if summary is not None else title)
    origin = f"Run of {section.run}" + (f" (commit {run.commit})" if run is not None else "")
    took = (
        f"{origin}; {section.seconds:,.0f} s, load average {_load(section.load_before)} before,"
        f" {_load(section.load_after)} after."
    )
    if summary is None:
        return "\n\n".join([heading, _failure(section), took, "Command:", _code(section.command)])
    runs = "One run." if summary.runs == 1 else f"Medians of {summary.runs} runs."
    parts = [heading, f"{took} {runs}", "Command:"]
    parts += [_code(summary.command), f"Parameters: {_parameters(summary)}."]
    parts.append(
        markdown_table(
            ["figure", "median", "baseline (same run)", "ratio"],
            [_figure_cells(figure) for figure in summary.figures],
            left=(0, 2),
        )
    )
    if summary.notes:
        parts.append("\n".join(f"- {note}" for note in summary.notes))
    for table in summary.tables:
        parts += [table.caption, table.markdown]
    return "\n\n".join(parts)


def _failure(section: Section) -> str:
    tail = "\n".join(section.log_tail.splitlines()[-LOG_LINES:]).replace("```", "'''")
    return f"**Failed**: {section.problem}. The last lines of its log:\n\n```text\n{tail}\n```"


def _heading(name: str, title: str) -> str:
    return f'<a id="{anchor(name)}"></a>\n## {name}: {title}'


def anchor(name: str) -> str:
    return f"bench-{name.replace('_', '-')}"


def _code(command: str) -> str:
    return f"    {command}"


def _parameters(summary: Summary) -> str:
    if not summary.parameters:
        return "none"
    return ", ".join(f"{name}={value}" for name, value in summary.parameters.items())


def _when(at: datetime) -> str:
    return at.strftime("%Y-%m-%d %H:%M")


def _load(averages: Sequence[float]) -> str:
    return " ".join(f"{value:.2f}" for value in averages)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def number(value: float) -> str:
    """A figure for a table: thousands grouped from 1,000 up, three significant digits below."""
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def ratio(value: float) -> str:
    return f"{value:.2f}" if abs(value) >= 0.1 else f"{value:.3g}"
