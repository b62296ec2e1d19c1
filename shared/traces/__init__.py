"""The recorded request traces Warmplane ships (Mooncake format; provenance and licence in this package's
README.md): the main job replays one, the benchmarks and the tests evaluate on them.

They are package data, found through `importlib.resources`, so a clone and an installed wheel find them
alike and nothing is read from outside the package.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

CONVERSATION = "conversation_trace.jsonl"
"""One hour of production chat traffic, 12,031 requests: the main job's default."""
SYNTHETIC = "synthetic_trace.jsonl"
"""3,993 requests over long shared documents."""
SHIPPED = (CONVERSATION, SYNTHETIC)
"""The recorded traces, as published."""
RAG = "rag_trace.jsonl"
"""A retrieval-augmented shape Warmplane generates itself (`rag.py`): a few system prompts, passages
retrieved rarely, questions."""
GENERATED = (RAG,)


def trace_path(name: str = CONVERSATION) -> Path:
    """The file of the shipped trace `name`; raises `ValueError` for a name this package does not ship.

    Setuptools installs package data as plain files (wheel and editable installs alike), so the path is a
    real file that can be opened, streamed and handed to a subprocess."""
    if name not in SHIPPED + GENERATED:
        raise ValueError(f"no shipped trace named {name!r}; shipped: {', '.join(SHIPPED + GENERATED)}")
    return Path(str(resources.files(__name__).joinpath(name)))


def shipped_traces() -> list[Path]:
    """Every recorded trace's file, the conversation trace first."""
    return [trace_path(name) for name in SHIPPED]


def evaluated_traces() -> list[Path]:
    """The traces the policy is measured on: the recorded ones, then the generated ones."""
    return [trace_path(name) for name in SHIPPED + GENERATED]
