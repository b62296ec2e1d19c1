"""Root conftest shared by every test tier (unit, golden, integration).

Kept deliberately empty of fixtures that start processes or open connections: unit tests must run
in milliseconds without any server. The real parts live in ``tests/integration/conftest.py``.
"""

from __future__ import annotations

from hypothesis import settings

# The machine is shared and noisy: a property test's examples are judged by their outcome, not by how
# long one took (hypothesis's default 200 ms deadline fails healthy tests under load).
settings.register_profile("warmplane", deadline=None)
settings.load_profile("warmplane")
