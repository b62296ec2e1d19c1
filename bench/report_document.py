"""What `bench/RESULTS.md` is made from: the runs of `bench.report` and one section a bench, kept as JSON
beside it (`RESULTS.json`), and how a run's sections replace an earlier run's. No I/O here.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Literal

import msgspec

from bench.summary import Summary

Status = Literal["ok", "failed"]
"""`ok`: the bench ran and its summary met the contract; `failed`: it exited non-zero, timed out, wrote no
summary or a broken one."""


class Machine(msgspec.Struct, kw_only=True, frozen=True):
    cpu: str
    """The CPU's model name."""
    cores: int
    memory_gib: float
    python: str
    system: str
    """Kernel and architecture, e.g. `Linux 6.1.0 x86_64`."""


class Run(msgspec.Struct, kw_only=True, frozen=True):
    """One `python -m bench.report` command."""

    id: str
    """Its start, `YYYY-MM-DDTHH:MM:SSZ`: what its sections name it by."""
    command: str
    started: datetime
    finished: datetime
    commit: str
    """The git commit the benches ran from, with `+ uncommitted changes` if the tree differed."""
    machine: Machine
    load_before: list[float]
    """The 1-, 5- and 15-minute load averages before the first bench, and after the last."""
    load_after: list[float]


class Section(msgspec.Struct, kw_only=True, frozen=True):
    """One bench's outcome in one run."""

    bench: str
    run: str
    """The `Run.id` it came from."""
    status: Status
    command: str
    """The command the report ran it as (the summary's own, when there is one)."""
    seconds: float
    load_before: list[float]
    load_after: list[float]
    summary: Summary | None = None
    problem: str = ""
    """Why it failed (empty when ok)."""
    log_tail: str = ""
    """The end of its output, when it failed."""


class Results(msgspec.Struct, kw_only=True, frozen=True):
    runs: list[Run]
    sections: list[Section]

    @property
    def failed(self) -> list[str]:
        return [section.bench for section in self.sections if section.status == "failed"]


def merge(earlier: Results | None, later: Results) -> Results:
    """`later`'s sections in place of `earlier`'s of the same benches, the others kept as they were; runs
    kept only while a section names them, oldest first."""
    if earlier is None:
        return later
    replaced = {section.bench for section in later.sections}
    sections = [s for s in earlier.sections if s.bench not in replaced] + list(later.sections)
    named = {section.run for section in sections}
    runs = {run.id: run for run in [*earlier.runs, *later.runs] if run.id in named}
    return Results(runs=sorted(runs.values(), key=lambda run: run.started), sections=sections)


def sidecar(markdown: Path) -> Path:
    """Where the data of the Markdown file at `markdown` is kept: beside it, as `.json`."""
    return markdown.with_suffix(".json")


def encode_results(results: Results) -> bytes:
    return msgspec.json.format(msgspec.json.encode(results), indent=1) + b"\n"


def decode_results(data: bytes) -> Results:
    """Raises `msgspec.ValidationError` or `msgspec.DecodeError` if `data` is not a results document."""
    return msgspec.json.decode(data, type=Results)
