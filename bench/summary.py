"""What a benchmark hands `bench.report`: a typed summary, written as JSON when it is given
`--summary-json PATH`. The bench's own printing is unchanged; the summary captures the same figures.

The contract (JSON object; `read_summary` checks it on the way in):

- `bench`: the bench's name in `bench.report`'s registry (`ingest`, `epoch`, `scaleup`, ...).
- `title`: one line saying what is measured against what.
- `command`: the command that reproduces the figures, `python -m bench.<module> <args>`, run from the
  project root (the `--summary-json` option left out).
- `parameters`: every parameter the figures depend on, defaults included: name -> string, number, bool,
  null or a list of those.
- `runs`: how many runs the medians are over (1 for a deterministic simulation).
- `started`, `finished`: when the bench began and ended, RFC 3339 with a UTC offset.
- `figures`: the headline figures, at least one. Each: `name`; `median` (a number, in `unit`); `unit`
  (`events/s`, `ms`, `us`, `s`, `nodes`, ...); `baseline_name` and `baseline_median` (same unit), the
  baseline measured in the same run; `ratio`, as the bench prints it: normally median / baseline_median,
  but it may be the median of per-run ratios or the baseline over the median (a speed-up), which the
  bench's `notes` then say. The three baseline fields are all null for a figure without a baseline.
- `tables`: extra Markdown tables, each a `caption` (one sentence) and its `markdown` (the table).
- `notes`: sentences a reader needs to judge the figures (what a ratio means, what is left out).

Numbers must be finite. Unknown fields are ignored on reading, so the contract may grow additively.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from pathlib import Path

import msgspec

Scalar = str | int | float | bool | None
Parameter = Scalar | list[Scalar]
SUMMARY_OPTION = "--summary-json"


class Figure(msgspec.Struct, kw_only=True, frozen=True):
    """One headline figure and, if it has one, the baseline measured in the same run."""

    name: str
    median: float
    unit: str
    baseline_name: str | None = None
    baseline_median: float | None = None
    ratio: float | None = None

    def __post_init__(self) -> None:
        if not self.name or not self.unit:
            raise ValueError("a figure needs a name and a unit")
        baseline = (self.baseline_name, self.baseline_median, self.ratio)
        if any(value is None for value in baseline) and any(value is not None for value in baseline):
            raise ValueError(f"figure {self.name!r}: baseline_name, baseline_median and ratio go together")
        for value in (self.median, self.baseline_median, self.ratio):
            if value is not None and not math.isfinite(value):
                raise ValueError(f"figure {self.name!r}: {value} is not a finite number")


class Table(msgspec.Struct, kw_only=True, frozen=True):
    """An extra Markdown table and the sentence that says what it shows."""

    caption: str
    markdown: str


class Summary(msgspec.Struct, kw_only=True, frozen=True):
    """One bench's run, as `bench.report` renders it (module docstring: the contract)."""

    bench: str
    title: str
    command: str
    parameters: dict[str, Parameter]
    runs: int
    started: datetime
    finished: datetime
    figures: list[Figure]
    tables: list[Table] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.figures:
            raise ValueError(f"summary of {self.bench!r}: no figures")
        if self.runs < 1:
            raise ValueError(f"summary of {self.bench!r}: runs must be at least 1")
        if self.started.tzinfo is None or self.finished.tzinfo is None:
            raise ValueError(f"summary of {self.bench!r}: started and finished need a UTC offset")
        if self.finished < self.started:
            raise ValueError(f"summary of {self.bench!r}: finished before it started")


def encode_summary(summary: Summary) -> bytes:
    return msgspec.json.format(msgspec.json.encode(summary), indent=2)


def decode_summary(data: bytes) -> Summary:
    """The summary in `data`; raises `msgspec.ValidationError` or `msgspec.DecodeError` naming the
    first field that breaks the contract."""
    return msgspec.json.decode(data, type=Summary)


def read_summary(path: Path) -> Summary:
    """`decode_summary` of the file at `path` (raises OSError if it cannot be read)."""
    return decode_summary(path.read_bytes())


def write_summary(summary: Summary, path: Path) -> None:
    """Write `summary` to `path` whole or not at all (a temporary file renamed over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_bytes(encode_summary(summary))
    partial.replace(path)


def add_summary_option(parser: argparse.ArgumentParser) -> None:
    """Add `--summary-json PATH` to a bench's arguments (read back as `args.summary_json`)."""
    parser.add_argument(
        SUMMARY_OPTION,
        type=Path,
        metavar="PATH",
        help="also write the figures as JSON to PATH (bench/summary.py's contract, read by bench.report)",
    )


def command_line(module: str, argv: Sequence[str]) -> str:
    """`python -m <module> <argv>`, quoted for a shell, without the `--summary-json` option."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == SUMMARY_OPTION:
            skip = True
        elif not arg.startswith(SUMMARY_OPTION + "="):
            kept.append(arg)
    return shlex.join(["python", "-m", module, *kept])


def parameters_of(args: argparse.Namespace) -> dict[str, Parameter]:
    """The parsed arguments as summary parameters (paths as text, the summary's own path left out)."""
    return {name: _parameter(value) for name, value in sorted(vars(args).items()) if name != "summary_json"}


def _parameter(value: object) -> Parameter:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple):
        return [
            item if item is None or isinstance(item, str | int | float | bool) else str(item)
            for item in value
        ]
    return str(value)


def markdown_table(
    columns: Sequence[str], rows: Sequence[Sequence[object]], *, left: Collection[int] = (0,)
) -> str:
    """A Markdown table: the columns at the indexes in `left` left-aligned (text), the others
    right-aligned (figures)."""
    align = ["---" if i in left else "---:" for i in range(len(columns))]
    lines = [_row(columns), _row(align)]
    lines += [_row([str(cell) for cell in row]) for row in rows]
    return "\n".join(lines)


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


class SummaryRecorder:
    """Collects a bench's summary as it runs: created at the start (its `started`), filled with
    figures, tables and notes, then `write` stamps `finished` and writes it if a path was given."""

    def __init__(
        self,
        *,
        bench: str,
        title: str,
        module: str,
        argv: Sequence[str],
        parameters: dict[str, Parameter],
        runs: int,
    ) -> None:
        self.bench, self.title, self.runs = bench, title, runs
        self.command = command_line(module, argv)
        self.parameters = parameters
        self.started = datetime.now(UTC)
        self.figures: list[Figure] = []
        self.tables: list[Table] = []
        self.notes: list[str] = []

    def figure(
        self,
        name: str,
        median: float,
        unit: str,
        baseline: tuple[str, float] | None = None,
        ratio: float | None = None,
    ) -> None:
        """Add a figure; with a `baseline` (name, median) and no `ratio`, the ratio is
        median / baseline median."""
        if baseline is None:
            self.figures.append(Figure(name=name, median=median, unit=unit))
            return
        baseline_name, baseline_median = baseline
        if ratio is None:
            if not baseline_median:
                raise ValueError(f"figure {name!r}: its baseline {baseline_name!r} is 0: give the ratio")
            ratio = median / baseline_median
        self.figures.append(
            Figure(
                name=name,
                median=median,
                unit=unit,
                baseline_name=baseline_name,
                baseline_median=baseline_median,
                ratio=ratio,
            )
        )

    def table(self, caption: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
        self.tables.append(Table(caption=caption, markdown=markdown_table(columns, rows)))

    def note(self, text: str) -> None:
        self.notes.append(text)

    def summary(self) -> Summary:
        """The summary so far, finished now. Raises ValueError if it breaks the contract."""
        return Summary(
            bench=self.bench,
            title=self.title,
            command=self.command,
            parameters=self.parameters,
            runs=self.runs,
            started=self.started,
            finished=datetime.now(UTC),
            figures=list(self.figures),
            tables=list(self.tables),
            notes=list(self.notes),
        )

    def write(self, path: Path | None) -> None:
        """Write the summary to `path`, if one was given (`--summary-json`)."""
        if path is not None:
            write_summary(self.summary(), path)
