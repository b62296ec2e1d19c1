"""`warmplane evaluate-traffic --tenant T --model M`: should this team warm at all? Reads the recorded
request events (the request topic, from its earliest offset, no consumer group), exports one tenant's and
model's requests as a Mooncake trace (`own_trace`), runs the trace evaluator on it (the same code as
`bench.evaluate_policy`), and reports with it what the events themselves say (`traffic_figures`).

Exit codes: 0 a report was written; 1 no request matched; 2 no request topic, the read's deadline passed,
or a bad argument.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Final, TextIO

import msgspec

from warmplane.services.cli.request_topic import read_requests
from warmplane.services.cli.traffic_report import TrafficReport, render
from warmplane.services.planner.trace_eval.evaluation import evaluate
from warmplane.services.planner.trace_eval.fleet_sim import requests_from_trace
from warmplane.services.planner.trace_eval.own_trace import PartialBlocks, TrafficFilter, select, to_trace
from warmplane.services.planner.trace_eval.params import EvalParams
from warmplane.services.planner.trace_eval.traffic_figures import traffic_figures
from warmplane.shared.mooncake_trace import TraceRequest
from warmplane.shared.settings import KafkaSettings
from warmplane.shared.topics import Topics

DEFAULT_CAPACITY_TOKENS: Final = 8000 * 512
"""A replica's KV capacity when none is given: the published-trace runs' (8,000 blocks of 512 tokens)."""
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(text: str, now: datetime) -> datetime:
    """An aware time from `text`: ISO 8601 with an offset (`2025-06-01T12:00:00+00:00`), or a duration
    back from `now` (`90s`, `30m`, `2h`, `7d`). Raises `ValueError` for anything else."""
    match = _DURATION.match(text.strip())
    if match:
        return now - timedelta(seconds=float(match[1]) * _UNIT_S[match[2]])
    when = datetime.fromisoformat(text)
    if when.tzinfo is None:
        raise ValueError(f"{text!r} has no UTC offset (events are stamped in absolute time)")
    return when


@dataclass(frozen=True, slots=True)
class TrafficOptions:
    """One run: which traffic, how it is cut into blocks, how the fleet is simulated (`params`, whose
    `block_tokens` is the export's), where the report and the trace go (stdout always gets the report),
    how long the read may take (s), and the command line to quote in the report."""

    traffic: TrafficFilter
    params: EvalParams
    partial: PartialBlocks = "drop"
    output: Path | None = None
    trace_output: Path | None = None
    deadline_s: float = 300.0
    command: str = "warmplane evaluate-traffic"


async def evaluate_traffic(options: TrafficOptions, kafka: KafkaSettings, out: TextIO) -> int:
    """Read, export, evaluate and report (see the module's exit codes). Raises `LookupError` without a
    request topic and `TimeoutError` past the read's deadline."""
    topic = Topics(kafka.topic_prefix).requests
    traffic = options.traffic
    log = await read_requests(
        kafka,
        topic,
        key_prefix=f"{traffic.tenant}/{traffic.model}/".encode(),
        deadline_s=options.deadline_s,
    )
    requests = select(log.requests, traffic)
    trace = to_trace(requests, options.params.block_tokens, options.partial)
    if options.trace_output is not None:
        _write_trace(options.trace_output, trace.records)
    simulated = requests_from_trace(trace.records, options.params.block_tokens, options.params.block_tokens)
    result = evaluate(f"{traffic.tenant}/{traffic.model}", simulated, options.params) if simulated else None
    text = render(
        TrafficReport(
            options.command,
            topic,
            traffic,
            log,
            trace,
            options.partial,
            options.params,
            traffic_figures(requests),
            result,
        )
    )
    out.write(text + "\n")
    if options.output is not None:
        options.output.parent.mkdir(parents=True, exist_ok=True)
        options.output.write_text(text + "\n")
    return 0 if requests else 1


def _write_trace(path: Path, records: Sequence[TraceRequest]) -> None:
    """The records as Mooncake JSONL, one object a line, fields in the published traces' order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    encoder = msgspec.json.Encoder()
    with path.open("wb") as lines:
        for record in records:
            lines.write(encoder.encode(record) + b"\n")
