"""`python -m bench.report --only` on two fast benches (pure CPU, about 15 s): their sections hold real
figures, the rest are pending, and a second run merges rather than replaces; a bench that fails, times
out or is not written yet is reported as such."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.report import Bench, run_bench
from bench.report_document import decode_results, sidecar


def report(root: Path, output: Path, only: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "bench.report", "--only", only, "--output", str(output)]
    argv += ["--logs", str(output.parent / "logs")]
    return subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=120, check=False)


def test_only_two_benches_fill_their_sections_and_a_later_run_keeps_them(
    pytestconfig: pytest.Config, tmp_path: Path
) -> None:
    output = tmp_path / "RESULTS.md"
    first = report(pytestconfig.rootpath, output, "route_scale,evaluate_policy")
    assert first.returncode == 0, first.stdout + first.stderr
    text = output.read_text()
    assert "| [route_scale](#bench-route-scale) | route at 1,000 replicas |" in text
    assert "| [evaluate_policy](#bench-evaluate-policy) | conversation_trace.jsonl:" in text
    assert "| [ingest](#bench-ingest) | pending: not run yet |" in text
    assert "    python -m bench.route_scale_bench --replicas 4 100 1000" in text

    second = report(pytestconfig.rootpath, output, "route_scale")
    assert second.returncode == 0, second.stdout + second.stderr
    results = decode_results(sidecar(output).read_bytes())
    runs = {section.bench: section.run for section in results.sections}
    assert runs["route_scale"] != runs["evaluate_policy"]
    assert len(results.runs) == 2
    assert "| [evaluate_policy](#bench-evaluate-policy) | conversation_trace.jsonl:" in output.read_text()


def test_a_bench_that_fails_or_times_out_is_reported_with_its_log(
    pytestconfig: pytest.Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(pytestconfig.rootpath)
    broken = Bench("broken", "bench.no_such_bench", 0.1, 1, "--runs 1", "Missing")
    section = run_bench(broken, tmp_path, "run-1")
    assert (section.status, section.problem, section.summary) == ("failed", "exited with code 1", None)
    assert "No module named bench.no_such_bench" in section.log_tail

    slow = Bench("route_scale", "bench.route_scale_bench", 0.1, 0.001, "--replicas 4 --runs 50", "Slow")
    section = run_bench(slow, tmp_path, "run-1")
    assert section.status == "failed" and section.problem.startswith("timed out after 0.001 minutes")
