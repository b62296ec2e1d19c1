"""A one-line progress display for long operations; plain lines when the output is not a terminal."""

from __future__ import annotations

import time
from typing import TextIO


class Progress:
    """Shows `done / total`, a second count (say, events confirmed) and its rate; at most 10 times a
    second on a terminal, every 2 s otherwise."""

    def __init__(self, out: TextIO, *, total: int, label: str, width: int = 30) -> None:
        self._out = out
        self._total = max(total, 1)
        self._label = label
        self._width = width
        self._began = time.monotonic()
        self._last = 0.0
        self._tty = out.isatty()

    def show(self, done: int, confirmed: int, *, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self._last < (0.1 if self._tty else 2.0):
            return
        self._last = now
        filled = self._width * min(done, self._total) // self._total
        rate = confirmed / max(now - self._began, 1e-9)
        line = (
            f"[{'#' * filled}{'.' * (self._width - filled)}] {self._label}: {done:,} / {confirmed:,}"
            f" of {self._total:,} ({rate:,.0f}/s)"
        )
        if self._tty:
            self._out.write("\r" + line + ("\n" if final else ""))
        else:
            self._out.write(line + "\n")
        self._out.flush()
