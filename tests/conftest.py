"""Root conftest shared by every test tier (unit, integration, end-to-end; golden payloads).

It starts no process and opens no connection: unit tests must run in milliseconds without any server. It
registers the real parts (``tests/real_parts.py``), fixtures that start a part only when a test of the
integration or end-to-end tier asks for it, here once so that both tiers share one instance per session;
and it marks each test with its tier, by folder.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

pytest_plugins = ["tests.real_parts"]

_HERE = Path(__file__).parent
_TIER_MARKS = {_HERE / "integration": pytest.mark.integration, _HERE / "e2e": pytest.mark.e2e}

# The machine is shared and noisy: a property test's examples are judged by their outcome, not by how
# long one took (hypothesis's default 200 ms deadline fails healthy tests under load).
settings.register_profile("warmplane", deadline=None)
settings.load_profile("warmplane")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark tests under `integration/` ``integration`` and tests under `e2e/` ``e2e``."""
    for item in items:
        for folder, mark in _TIER_MARKS.items():
            if item.path.is_relative_to(folder):
                item.add_marker(mark)
