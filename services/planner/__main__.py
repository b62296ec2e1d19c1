"""`python -m warmplane.services.planner`: run the planner from `WARMPLANE_*` settings."""

from __future__ import annotations

import asyncio
import logging

from warmplane.services.planner.app import build_planner
from warmplane.services.planner.gc_tuning import tune_for_batches
from warmplane.services.planner.settings import PlannerSettings
from warmplane.shared.settings import load_settings


def main() -> None:
    settings = load_settings(PlannerSettings)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tune_for_batches()
    asyncio.run(build_planner(settings).app.run())


if __name__ == "__main__":
    main()
