"""`python -m warmplane.services.warmer`: run one node's warmer from `WARMPLANE_*` settings.

SIGTERM and SIGINT stop it: running warm-ups are cancelled, queued lifecycle events are published
(bounded by `WARMPLANE_WARM__PUBLISH_TIMEOUT_S`), connections closed.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from warmplane.services.warmer.service import Warmer
from warmplane.services.warmer.settings import WarmerSettings
from warmplane.shared.settings import load_settings

log = logging.getLogger("warmplane.services.warmer")


async def _run(settings: WarmerSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with Warmer(settings) as warmer:
        log.info(
            "warmer of node %s: %d engines, /ready on port %d",
            warmer.node,
            len(warmer.drivers),
            warmer.http_port,
        )
        await stop.wait()


def main() -> None:
    settings = load_settings(WarmerSettings)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(_run(settings))


if __name__ == "__main__":
    main()
