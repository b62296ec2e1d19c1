"""The `warmplane` command: the main job on embedded defaults, and the services from settings."""

from __future__ import annotations

import importlib
import sys


def run() -> int:
    """The console script. The light distribution (`pip install warmplane`) installs it too, without what
    the command needs: then it says which extra to install rather than fail on an import."""
    try:
        command = importlib.import_module("warmplane.services.cli.main")
    except ModuleNotFoundError as missing:
        if (missing.name or "warmplane").startswith("warmplane"):
            raise
        print(
            f"warmplane: the command line needs the services' dependencies ({missing.name} is not installed):"
            " pip install 'warmplane[services]', and 'warmplane[services,embedded]' for `warmplane up`",
            file=sys.stderr,
        )
        return 2
    code: int = command.main()
    return code
