"""The scale-up scenario's traffic and figures (`bench/scaleup`): pure logic, no engine."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.scaleup.figures import RunRecord, percentile, run_figures
from bench.scaleup.run import Calibration
from warmplane.services.devstack.chat_load import Sample, replica_of
from warmplane.services.devstack.chat_traffic import (
    Slice,
    TraceError,
    chat_messages,
    read_ordered_trace,
    replay_requests,
    vocabulary_words,
)
from warmplane.shared.traces import trace_path

WORDS = [f"w{i:03d}" for i in range(300)]


def _trace(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_trace_out_of_time_order_is_refused_naming_its_line(tmp_path: Path) -> None:
    path = _trace(
        tmp_path,
        [
            '{"timestamp": 10, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}',
            '{"timestamp": 5, "input_length": 600, "output_length": 5, "hash_ids": [1, 3]}',
        ],
    )
    with pytest.raises(TraceError, match=r"trace.jsonl:2: timestamp 5 is earlier"):
        read_ordered_trace(path)


def test_a_trace_line_missing_a_field_is_refused_naming_its_line(tmp_path: Path) -> None:
    path = _trace(tmp_path, ['{"timestamp": 1, "input_length": 600, "hash_ids": [1]}'])
    with pytest.raises(TraceError, match=r"trace.jsonl:1: not a Mooncake trace line.*output_length"):
        read_ordered_trace(path)


def test_requests_sharing_k_blocks_share_exactly_k_messages() -> None:
    first = chat_messages([7, 8, 9], WORDS, 32)
    second = chat_messages([7, 8, 10, 11], WORDS, 32)

    assert first[:2] == second[:2] and first[2] != second[2]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert all(len(m["content"].split()) == 32 for m in second)


def test_a_replay_keeps_whole_conversations_and_the_traces_own_clock() -> None:
    trace = read_ordered_trace(trace_path())
    part = Slice(offset_s=600, duration_s=300, sample=0.3)
    requests = replay_requests(trace, WORDS, part)
    everything = replay_requests(trace, WORDS, Slice(offset_s=600, duration_s=300, sample=1.0))

    assert 0.2 < len(requests) / len(everything) < 0.4
    kept_keys = {r.key for r in requests}
    assert [r for r in everything if r.key in kept_keys] == requests  # every turn of a kept conversation
    assert all(0 <= r.at_s < 300 for r in requests)
    assert [r.at_s for r in requests] == sorted(r.at_s for r in requests)
    assert replay_requests(trace, WORDS, part) == requests  # the same in every run and arm


def test_whole_words_are_read_from_a_byte_level_vocabulary(tmp_path: Path) -> None:
    words = [f"{a}{b}{c}" for a in "abc" for b in "defghi" for c in "jklmnopqrstuvwxyz"]
    vocab = {"the": 1, "ĠCat": 2, "Ġa": 3, "Ġx1y": 4} | {f"Ġ{w}": 10 + i for i, w in enumerate(words)}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"model": {"vocab": vocab}}))

    assert vocabulary_words(path) == sorted(words)  # no bare, capitalised, short or non-letter entries

    path.write_text(json.dumps({"model": {"vocab": {"Ġthe": 1}}}))
    with pytest.raises(ValueError, match="only 1 whole-word entries"):
        vocabulary_words(path)


def _sample(sent: float, ttft: float | None, replica: str | None) -> Sample:
    return Sample(sent, ttft, replica, 200 if ttft is not None else 0)


def test_the_first_minute_is_counted_from_the_newcomers_first_request() -> None:
    join = 1000.0
    samples = [
        _sample(join - 30, 0.2, "r0"),
        _sample(join - 10, 0.4, "r0"),
        _sample(join + 5, 0.9, "r0"),  # established, while the newcomer warms
        Sample(join + 20, 2.0, "r1", 200, prompt_tokens=1000, cached_tokens=100),  # the newcomer's first
        Sample(join + 30, 1.0, "r1", 200, prompt_tokens=3000, cached_tokens=1900),
        _sample(join + 40, 0.3, "r0"),
        _sample(join + 50, None, None),  # failed: an error, never a percentile
        _sample(join + 85, 5.0, "r1"),  # past its first minute
    ]
    record = RunRecord("warmplane", 1, join, join + 90, "r1", samples, warm_tokens=1234)

    v = run_figures(record).values

    assert v["first_request_s"] == 20
    assert v["newcomer_p50"] == 1.5
    assert v["newcomer_share"] == pytest.approx(2 / 4)
    assert v["newcomer_cached"] == pytest.approx(2000 / 4000)  # its first minute's tokens, not its requests'
    assert v["established_before_p99"] == pytest.approx(percentile([0.2, 0.4], 99))
    assert v["established_during_p99"] == 0.9
    assert v["errors"] == 1 and v["requests"] == 8
    assert v["warm_tokens"] == 1234
    # Its last minute, [join + 30, join + 90]: the request at join + 30 is the only one with prompt tokens.
    assert v["steady_p50"] == 3.0 and v["steady_cached"] == pytest.approx(1900 / 3000)


def test_a_newcomer_that_never_served_has_no_first_minute() -> None:
    record = RunRecord("cold", 1, 0.0, 100.0, "r1", [_sample(5, 0.1, "r0")], warm_tokens=None)

    v = run_figures(record).values

    assert math.isnan(v["first_request_s"]) and math.isnan(v["newcomer_p50"]) and math.isnan(v["warm_tokens"])


def test_a_replica_is_named_by_its_first_served_name() -> None:
    assert replica_of("smol-r1", "smol-") == "r1"
    assert replica_of("smol", "smol-") is None


def test_calibration_loads_a_replica_by_mean_service_time_and_prefill_by_computed_tokens() -> None:
    # Skewed like the trace's prompts: most requests short, one long. The median (1 s) would load the replica
    # to 0.85 at 0.85 requests/s; its mean (2.5 s) says 0.34.
    timed = [
        (1.0, Sample(0.0, 0.5, "r0", 200, prompt_tokens=500, cached_tokens=0)),
        (1.0, Sample(1.0, 0.5, "r0", 200, prompt_tokens=700, cached_tokens=400)),
        (1.0, Sample(2.0, 0.5, "r0", 200, prompt_tokens=600, cached_tokens=100)),
        (7.0, Sample(3.0, 4.5, "r0", 200, prompt_tokens=5_000, cached_tokens=0)),
    ]
    calibration = Calibration.of(timed)
    assert calibration.service_s == pytest.approx(2.5)
    assert calibration.prefill_tokens_per_s == pytest.approx((500 + 300 + 500 + 5_000) / 6.0)
    assert calibration.sample(full_rate=10.0, utilization=0.85) == pytest.approx(0.85 / 2.5 / 10.0)
    assert calibration.sample(full_rate=0.1, utilization=0.85) == 1.0
    with pytest.raises(ValueError, match="at least one request"):
        Calibration.of([])
