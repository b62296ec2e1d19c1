"""Root conftest shared by every test tier (unit, golden, integration).

Kept deliberately empty of fixtures that start processes or open connections: unit tests must run
in milliseconds without any server. The real parts live in ``tests/integration/conftest.py``.
"""
