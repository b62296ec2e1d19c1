"""The semantic tier's embedding from any OpenAI-compatible `/v1/embeddings` endpoint: vLLM serving an
embedding model (`--runner pooling`), a team's own service, a hosted provider.

Why offer it beside the worker process: an endpoint with cores or a GPU of its own encodes several times
as many queries a second as one gateway core does (`bench.embedding_bench --endpoint`), and a team may
already run one. Queries are batched (`embedding_batches.py`) into one request's `input` list; vectors
come back by `index` and are scaled to unit length here (not every provider normalises). The space's name
is `openai:<model>`: two endpoints serving the same model share vectors, two models never do.
"""

from __future__ import annotations

import math

import httpx
import msgspec

from warmplane.services.gateway.embedding_batches import BatchQueue


class _Item(msgspec.Struct):
    index: int
    embedding: list[float]


class _Answer(msgspec.Struct):
    data: list[_Item]


class OpenAiEmbedder:
    """`Embedder` over `POST {url}/v1/embeddings` for `model`, with `api_key` as a bearer token if given."""

    def __init__(
        self,
        url: str,
        model: str,
        *,
        api_key: str | None = None,
        max_batch: int = 32,
        timeout_s: float = 5.0,
    ) -> None:
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers, timeout=timeout_s)
        self._model = model
        self._queue = BatchQueue(self._encode, max_batch)
        self._decoder = msgspec.json.Decoder(_Answer)

    @property
    def name(self) -> str:
        return f"openai:{self._model}"

    @property
    def batches(self) -> int:
        return self._queue.batches

    async def start(self) -> int:
        """One query, so that an endpoint that is down or serves no such model stops the gateway at start
        with its answer; the vectors' dimensions."""
        return len(await self.embed("warmplane start"))

    async def embed(self, text: str) -> list[float]:
        return await self._queue.embed(text)

    async def _encode(self, texts: list[str]) -> list[list[float]]:
        response = await self._client.post("/v1/embeddings", json={"model": self._model, "input": texts})
        if response.status_code != 200:
            raise RuntimeError(f"/v1/embeddings answered {response.status_code}: {response.text[:200]}")
        items = sorted(self._decoder.decode(response.content).data, key=lambda item: item.index)
        return [_unit(item.embedding) for item in items]

    async def close(self) -> None:
        self._queue.fail_waiting(RuntimeError("the embedder is closed"))
        await self._client.aclose()


def _unit(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(value * value for value in vector))
    return [value / norm for value in vector] if norm else vector
