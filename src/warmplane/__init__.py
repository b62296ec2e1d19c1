"""Warmplane: an event-driven warm-up control plane for vLLM fleets.

The code lives in the top-level folders the design brief lays out (`shared/`, `services/`, `migrations/`);
this package links them under one import root, `warmplane.*`.
"""

__version__ = "0.1.0"
