"""`python -m warmplane.services.warmer`: run one node's warmer from `WARMPLANE_*` settings.

SIGTERM or SIGINT drains it (`Warmer.drain`): its replicas are announced draining, then stopped once
their engines are idle (`WARMPLANE_DRAIN__*`); then it stops. A second signal stops it at once. Stopping
cancels running warm-ups, publishes queued events (bounded by `WARMPLANE_WARM__PUBLISH_TIMEOUT_S`) and
closes connections.
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
    signals = asyncio.Queue[signal.Signals]()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, signals.put_nowait, signum)
    async with Warmer(settings) as warmer:
        log.info(
            "warmer of node %s: %d engines, /ready on port %d",
            warmer.node,
            len(warmer.drivers),
            warmer.http_port,
        )
        first = await signals.get()
        log.info("%s: draining (a second signal stops at once)", first.name)
        draining = asyncio.create_task(warmer.drain(f"the warmer received {first.name}"))
        again = asyncio.create_task(signals.get())
        await asyncio.wait({draining, again}, return_when=asyncio.FIRST_COMPLETED)
        for task in (draining, again):
            task.cancel()
        await asyncio.gather(draining, again, return_exceptions=True)


def main() -> None:
    settings = load_settings(WarmerSettings)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(_run(settings))


if __name__ == "__main__":
    main()
