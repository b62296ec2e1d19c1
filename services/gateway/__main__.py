"""`python -m warmplane.services.gateway`: run the gateway from `WARMPLANE_*` settings.

SIGTERM and SIGINT stop it: no new requests, in-flight ones get a bounded time, queued events are
flushed (bounded by `WARMPLANE_EMITTER__CLOSE_TIMEOUT_S`).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import logging
import signal
from collections.abc import Callable, Coroutine
from typing import Any

from warmplane.services.gateway.service import Gateway
from warmplane.services.gateway.settings import GatewaySettings
from warmplane.shared.settings import load_settings

log = logging.getLogger("warmplane.services.gateway")


async def _run(settings: GatewaySettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with Gateway(settings) as gateway:
        tenants = len(settings.tenant_keys)
        log.info("gateway %s on port %d: %d tenants", settings.gateway.instance, gateway.port, tenants)
        await stop.wait()


def _event_loop_runner() -> Callable[[Coroutine[Any, Any, None]], None]:
    """uvloop's runner when it is installed (a dependency of the project), else asyncio's."""
    if importlib.util.find_spec("uvloop") is None:
        return asyncio.run
    runner: Callable[[Coroutine[Any, Any, None]], None] = importlib.import_module("uvloop").run
    return runner


def main() -> None:
    settings = load_settings(GatewaySettings)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _event_loop_runner()(_run(settings))


if __name__ == "__main__":
    main()
