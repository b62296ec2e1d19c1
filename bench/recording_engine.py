"""A stub vLLM engine for `bench.epoch_bench`: answers the warmer's and the gateway's requests at once and
remembers when it first saw each `cache_salt`. Prefill is not what that bench measures.

It serves HTTP/1.1 keep-alive on 127.0.0.1 (Content-Length bodies, as httpx and the gateway send them):
`GET /health` (200), `GET /metrics` (`vllm:cache_config_info` with `BLOCK_SIZE` and `KV_BLOCKS`), and any
POST, taken as a completion: its `usage` counts a prompt of about a token per four bytes of its
`messages` or `prompt`, and a repeat of the same prompt under the same salt finds its whole blocks
cached, as a prefix cache would (so the warmer's probes verify). A chat whose last message starts with
`CHECK_PREFIX` is a bench's check through a gateway: the salt it came with is kept under that message.
"""

from __future__ import annotations

import asyncio
import hashlib
import time

import msgspec

from bench.raw_http import content_length

BLOCK_SIZE = 16
KV_BLOCKS = 100_000
CHECK_PREFIX = "epoch-check"
_METRICS = f'vllm:cache_config_info{{block_size="{BLOCK_SIZE}",num_gpu_blocks="{KV_BLOCKS}"}} 1.0\n'.encode()


class RecordingEngine:
    """`async with RecordingEngine() as engine:` serves on `engine.url` until the block ends."""

    def __init__(self) -> None:
        self.first_seen: dict[str, float] = {}
        """`time.perf_counter()` when each salt first came in a request."""
        self.checks: dict[str, str | None] = {}
        """The salt of each check (by its message) that came through a gateway."""
        self.last_request = 0.0
        """`time.perf_counter()` of the latest request."""
        self._cached: set[bytes] = set()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the engine is not serving")
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aenter__(self) -> RecordingEngine:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = content_length(head)
                body = await reader.readexactly(length) if length else b""
                answer = self._answer(head.split(b" ", 2), body)
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                    + str(len(answer)).encode()
                    + b"\r\n\r\n"
                    + answer
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()

    def _answer(self, request_line: list[bytes], body: bytes) -> bytes:
        method, path = request_line[0], request_line[1] if len(request_line) > 1 else b"/"
        if method == b"GET":
            return _METRICS if path.startswith(b"/metrics") else b"{}"
        self.last_request = now = time.perf_counter()
        request = msgspec.json.decode(body) if body else {}
        salt = request.get("cache_salt")
        if salt is not None:
            self.first_seen.setdefault(salt, now)
        prompt = msgspec.json.encode(request.get("messages") or request.get("prompt") or "")
        messages = request.get("messages") or []
        last = messages[-1].get("content") if messages and isinstance(messages[-1], dict) else None
        if isinstance(last, str) and last.startswith(CHECK_PREFIX):
            self.checks[last] = salt
        return self._completion(prompt, salt)

    def _completion(self, prompt: bytes, salt: str | None) -> bytes:
        tokens = max(2, len(prompt) // 4)
        key = hashlib.blake2b(prompt + b"\0" + (salt or "").encode(), digest_size=16).digest()
        cached = BLOCK_SIZE * ((tokens - 1) // BLOCK_SIZE) if key in self._cached else 0
        self._cached.add(key)
        usage = {
            "prompt_tokens": tokens,
            "completion_tokens": 1,
            "total_tokens": tokens + 1,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        choice = {"index": 0, "message": {"role": "assistant", "content": "ok"}, "text": "ok"}
        return msgspec.json.encode(
            {"id": "stub", "object": "chat.completion", "model": "stub", "choices": [choice], "usage": usage}
        )
