"""Headless Chromium (Debian's; `make browser` installs it) for the tests that look at the status page."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

SCREENSHOTS = Path(__file__).parents[2] / ".warmplane" / "screenshots"
"""Where the tests leave what they saw, for people to look at."""


async def chromium(*args: str) -> bytes:
    """Run headless Chromium (Debian's, `make browser` installs it) to its end; its stdout."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    assert binary, "Chromium is not installed: run `make browser` (the README's test command does)"
    run = await asyncio.create_subprocess_exec(
        binary,
        "--headless",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--window-size=1280,900",
        "--virtual-time-budget=10000",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    output, _ = await asyncio.wait_for(run.communicate(), 120)
    assert run.returncode == 0, f"chromium exited with {run.returncode}"
    return output
