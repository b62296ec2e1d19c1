"""The main job, `warmplane up`, end to end on a slice of the real trace: every part started and stopped by
itself, a second replica planned, warmed, verified and ready, and the summary a new user reads."""

from __future__ import annotations

import io
import re

from warmplane.services.cli.up import DEFAULT_TRACE, UpOptions, run_up


async def test_the_main_job_warms_a_second_replica_and_prints_the_summary() -> None:
    out = io.StringIO()
    await run_up(UpOptions(DEFAULT_TRACE, limit=2_000, workdir=None, keep_running=False), out)
    text = out.getvalue()

    assert "2,000 request events replayed and counted durably" in text
    assert "replica-0 is ready: nothing to warm" in text  # it started before any traffic was known
    summary = re.search(
        r"replica-1 ready [\d.]+ s after it was scheduled \([\d.]+ s after its engine answered\): "
        r"(\d+) prefixes planned, (\d+) verified held by a probe, ([\d,]+) tokens pre-filled, (\d+) failures",
        text,
    )
    assert summary is not None, text
    planned, verified, prefilled, failures = summary.groups()
    assert int(planned) > 0 and verified == planned and failures == "0"
    assert int(prefilled.replace(",", "")) > 0
    warmed = re.search(r"replica-1 \(warmed\): ([\d.]+)%", text)
    cold = re.search(r"replica-0 \(cold\): +([\d.]+)%", text)
    assert warmed is not None and cold is not None, text
    assert float(warmed.group(1)) > float(cold.group(1))
