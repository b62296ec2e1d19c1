"""Build a tiny Llama-architecture model folder that vLLM serves: random weights, a real tokenizer.

Run it with the vLLM virtualenv's interpreter, which has torch, transformers and tokenizers::

    .venv-vllm/bin/python shared/embedded/tiny_model.py OUT_DIR

Contracts:
- Standalone: only the standard library and the sibling ``model_folder.py`` at import time; torch,
  transformers and tokenizers are imported inside the functions that need them (through ``importlib``), so
  the module also imports, and type-checks, in the main virtualenv where they are absent.
- Deterministic: the tokenizer is trained on the interpreter's own standard-library sources in sorted order,
  the weights come from a fixed seed; the same interpreter and library versions give the same files.
- Cached: ``OUT_DIR`` is reused when its stamp holds :data:`BUILD_ID`; otherwise it is built in a sibling
  temporary folder and renamed into place (``model_folder.py``), so a failed build leaves no half-built one.
- Output: ``config.json``, ``model.safetensors`` (bfloat16, about 7 MB), ``tokenizer.json`` and
  ``tokenizer_config.json`` carrying the jinja chat template and the BOS/EOS tokens.
"""

from __future__ import annotations

import importlib
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:
    from warmplane.shared.embedded import model_folder
else:  # run as a script by the vLLM venv's python, where Warmplane is not installed: the sibling file
    import model_folder

#: Bump whenever anything below changes what is written; a stale cached folder is then rebuilt.
BUILD_ID = "tiny-llama-v1"
SEED = 0
VOCAB_SIZE = 8192
#: Cap on the training text, so the build stays a few seconds whatever the stdlib's size.
CORPUS_LIMIT_BYTES = 8_000_000
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
TURN_START, TURN_END = "<|im_start|>", "<|im_end|>"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA_CONFIG: dict[str, Any] = {
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
}


def is_built(out_dir: Path) -> bool:
    """True when ``out_dir`` holds a complete model written by this version of the builder."""
    return model_folder.is_built(out_dir, BUILD_ID)


def build(out_dir: Path) -> Path:
    """Build the model into ``out_dir`` unless already built there; return ``out_dir`` (absolute).

    Raises ``ModuleNotFoundError`` when torch, transformers or tokenizers are missing (wrong interpreter).
    """
    return model_folder.build_atomically(out_dir, BUILD_ID, _write_model)


def _write_model(folder: Path) -> None:
    bos_id, eos_id = _write_tokenizer(folder)
    _write_weights(folder, bos_id, eos_id)


def _corpus() -> Iterator[str]:
    """The standard library's top-level ``.py`` sources, sorted, up to :data:`CORPUS_LIMIT_BYTES`."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        total += len(text)
        if total > CORPUS_LIMIT_BYTES:
            return
        yield text


def _write_tokenizer(folder: Path) -> tuple[int, int]:
    """Train the byte-level BPE tokenizer and save it with its chat template; return (BOS id, EOS id)."""
    tk = importlib.import_module("tokenizers")
    transformers = importlib.import_module("transformers")
    tokenizer = tk.Tokenizer(tk.models.BPE())
    tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[BOS, EOS, TURN_START, TURN_END],
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    bos_id, eos_id = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
    # BOS comes from the post-processor, so add_special_tokens=True (the completions default) prepends it.
    tokenizer.post_processor = tk.processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=EOS,
        additional_special_tokens=[TURN_START, TURN_END],
        model_max_length=LLAMA_CONFIG["max_position_embeddings"],
    )
    fast.save_pretrained(str(folder))
    model_folder.put_chat_template_in_config(folder, CHAT_TEMPLATE)
    return int(bos_id), int(eos_id)


def _write_weights(folder: Path, bos_id: int, eos_id: int) -> None:
    """Save a randomly initialised (seeded) Llama model as bfloat16 safetensors."""
    torch = importlib.import_module("torch")
    transformers = importlib.import_module("transformers")
    torch.manual_seed(SEED)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB_SIZE, bos_token_id=bos_id, eos_token_id=eos_id, **LLAMA_CONFIG
    )
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(folder), safe_serialization=True)


if __name__ == "__main__":
    sys.exit(model_folder.main(sys.argv, build))
