"""`python -m warmplane.services.planner`: run the planner from `WARMPLANE_*` settings.

SIGTERM and SIGINT stop it gracefully; SIGUSR1 logs the stack of every asyncio task (for a planner
that seems stuck: the threads' stacks, as py-spy shows them, only say the event loop is idle).
"""

from __future__ import annotations

import asyncio
import io
import logging
import signal

from warmplane.services.planner.app import build_planner
from warmplane.services.planner.gc_tuning import tune_for_batches
from warmplane.services.planner.settings import PlannerSettings
from warmplane.shared.settings import load_settings

log = logging.getLogger("warmplane.services.planner")


def _log_tasks() -> None:
    for task in asyncio.all_tasks():
        stack = io.StringIO()
        task.print_stack(file=stack)
        log.warning("task %s:\n%s", task.get_name(), stack.getvalue())


async def _run(settings: PlannerSettings) -> None:
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, _log_tasks)
    await build_planner(settings).app.run()


def main() -> None:
    settings = load_settings(PlannerSettings)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tune_for_batches()
    asyncio.run(_run(settings))


if __name__ == "__main__":
    main()
