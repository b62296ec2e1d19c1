"""`python -m warmplane.services.api`: run the API from `WARMPLANE_*` settings; SIGTERM and SIGINT stop it
in order, and it exits 0."""

from __future__ import annotations

import asyncio
import logging
import signal

from warmplane.services.api.service import serve
from warmplane.services.api.settings import ApiSettings
from warmplane.shared.settings import load_settings


async def _run(settings: ApiSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await serve(settings, stop)


def main() -> None:
    settings = load_settings(ApiSettings)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(_run(settings))


if __name__ == "__main__":
    main()
