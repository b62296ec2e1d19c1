"""`docs/settings.md` is what the code reads, and the README names no variable that the code does not."""

from __future__ import annotations

import re
from pathlib import Path

from warmplane.services.settings_reference import reference
from warmplane.shared.settings import RENAMED

ROOT = Path(__file__).parents[3]


def test_the_settings_reference_is_generated_from_the_code() -> None:
    page = (ROOT / "docs" / "settings.md").read_text()
    assert page == reference(), (
        "docs/settings.md differs from the code's settings: regenerate it with "
        "`python -m warmplane.services.settings_reference > docs/settings.md`"
    )


def test_every_variable_the_readme_names_is_one_a_service_reads() -> None:
    known = set(re.findall(r"`(WARMPLANE_[A-Z0-9_]+)`", reference()))
    named = set(re.findall(r"\b(WARMPLANE_[A-Z0-9_]*[A-Z0-9])\b", (ROOT / "README.md").read_text()))
    # Variables of the parts the services do not own (the vLLM venv of the tests and `make vllm`), and the
    # old names the README says are refused.
    outside = {"WARMPLANE_VLLM_VENV", *RENAMED}
    groups = {name for name in named if any(k.startswith(f"{name}__") for k in known)}
    assert named - known - outside - groups == set()
