"""Model folders the vLLM engine serves, built once, atomically, and stamped with the build that wrote them.

The builders (``tiny_model.py``, ``smollm2_model.py``) run as scripts with the vLLM virtualenv's interpreter,
where Warmplane is not installed; they import this module as their sibling file. So it needs only the
standard library.

Contracts:
- A folder is built when its stamp file (:data:`STAMP_NAME`) holds the builder's build id; a builder bumps
  its id whenever what it writes changes, and a stale folder is then rebuilt.
- :func:`build_atomically` writes into a temporary sibling and renames it into place, so a failed or killed
  build never leaves a half-written folder at the target, and an existing complete one is left untouched.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

STAMP_NAME = ".warmplane-build"


def is_built(out_dir: Path, build_id: str) -> bool:
    """True when ``out_dir`` holds a complete folder written by the builder whose id is ``build_id``."""
    stamp = out_dir / STAMP_NAME
    return stamp.is_file() and stamp.read_text().strip() == build_id


def build_atomically(out_dir: Path, build_id: str, write: Callable[[Path], None]) -> Path:
    """Have ``write`` fill a fresh folder and rename it to ``out_dir``, unless already built; return it.

    ``write`` gets an empty folder beside ``out_dir`` (same filesystem, so the rename is atomic). A stale
    folder at ``out_dir`` is replaced. What ``write`` raises propagates, the temporary folder removed.
    """
    out_dir = out_dir.absolute()
    if is_built(out_dir, build_id):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the served folder should read like any other
    try:
        write(staging)
        (staging / STAMP_NAME).write_text(build_id + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def put_chat_template_in_config(folder: Path, template: str) -> None:
    """Store ``template`` inside ``tokenizer_config.json``, as the models' own repositories do.

    Newer transformers save it to ``chat_template.jinja`` instead; that file is removed, so the folder holds
    one template only.
    """
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = template
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (folder / "chat_template.jinja").unlink(missing_ok=True)


def main(argv: list[str], build: Callable[[Path], Path]) -> int:
    """A builder's command line, ``SCRIPT OUT_DIR``: builds, prints the folder; exit 2 on a usage error."""
    if len(argv) != 2:
        print(f"usage: {argv[0]} OUT_DIR", file=sys.stderr)
        return 2
    print(build(Path(argv[1])))
    return 0
