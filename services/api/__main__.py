"""`python -m warmplane.services.api`: run the API from `WARMPLANE_*` settings."""

from __future__ import annotations

import asyncio
import logging

from warmplane.services.api.service import serve
from warmplane.services.api.settings import ApiSettings
from warmplane.shared.settings import load_settings


def main() -> None:
    settings = load_settings(ApiSettings)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
