"""How a long-running command stops on SIGINT (Ctrl-C) and SIGTERM: once, in order, whatever comes next.

The first signal cancels the command's coroutine, whose `finally` blocks and context managers then stop
what it started (each part's stop is bounded). Later signals are reported and otherwise ignored: under
asyncio's default handling a second Ctrl-C raises `KeyboardInterrupt` wherever the code happens to be,
which can abandon that stop half way and leave child processes running; and SIGTERM's default action
ends the process at once, stopping nothing (the embedded parts run in sessions of their own, so nothing
else reaches them).

The handlers are the event loop's (`loop.add_signal_handler`): they run between callbacks, never inside
the synchronous stop of a child process. A first signal that comes while the job is already stopping by
itself (after an error, or at its end) still cancels the await it is in; the job's stops of processes
must therefore not hang on finishing an await: `warmplane up` stops them synchronously, or in threads
that `asyncio.run` waits for before it returns.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any, TextIO

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def exit_code(received: signal.Signals) -> int:
    """The shell's convention for a command ended by a signal: 128 + its number (130 for SIGINT, 143
    for SIGTERM)."""
    return 128 + received.value


async def run_until_signalled(job: Coroutine[Any, Any, None], out: TextIO) -> signal.Signals | None:
    """Run `job`; the first SIGINT or SIGTERM cancels it. Return the signal that stopped it, or None if
    it ended by itself. Raises what `job` raised, also while it was stopping after a signal (a part that
    failed to stop is worth a traceback)."""
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(job)
    received: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:
        if received:
            out.write(f"{sig.name} again: still stopping (each part's stop is bounded)\n")
        else:
            received.append(sig)
            out.write(f"\n{sig.name}: stopping everything\n")
            task.cancel()
        out.flush()

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await task
    except asyncio.CancelledError:
        if not received:
            raise
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
    return received[0] if received else None
