"""A stub vLLM for `bench.gateway_profile`: an HTTP/1.1 keep-alive server answering every request with a
canned completion (`ANSWER`), at once or after a delay standing in for the engine's prefill, run as its
own process (`python -m bench.gateway_stub PORT [DELAY_S]`), and a raw-socket keep-alive client that
costs the measurement next to nothing.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec

from bench.gateway_bench import KEY, PROMPT
from bench.raw_http import content_length
from warmplane.shared.embedded.processes import free_port, start_process, stop_process_group, wait_for_port

MODEL = "tiny"
USAGE = {"prompt_tokens": 161, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 160}}
ANSWER = msgspec.json.encode(
    {"id": "cmpl-1", "object": "text_completion", "model": MODEL, "choices": [{"text": "x"}], "usage": USAGE}
)
BODY = msgspec.json.encode({"model": MODEL, "prompt": PROMPT, "max_tokens": 1, "temperature": 0})


async def serve_stub_replica(port: int, delay_s: float = 0.0) -> None:
    """An HTTP/1.1 keep-alive server answering every request with `ANSWER` (no body parsing beyond
    Content-Length), `delay_s` after it arrived."""
    response = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
        + str(len(ANSWER)).encode()
        + b"\r\n\r\n"
        + ANSWER
    )

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = content_length(head)
                if length:
                    await reader.readexactly(length)
                if delay_s:
                    await asyncio.sleep(delay_s)
                writer.write(response)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


class RawClient:
    """One keep-alive connection; `post` returns once the whole (Content-Length) answer is read."""

    def __init__(self, port: int) -> None:
        self._sock = socket.create_connection(("127.0.0.1", port))
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._request = (
            b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            + f"authorization: Bearer {KEY}\r\ncontent-length: {len(BODY)}\r\n\r\n".encode()
            + BODY
        )

    def post(self) -> float:
        started = time.perf_counter()
        self._sock.sendall(self._request)
        data = b""
        while b"\r\n\r\n" not in data:
            data += self._recv()
        head, _, rest = data.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"unexpected answer: {head[:200]!r}")
        length = content_length(head)
        while len(rest) < length:
            rest += self._recv()
        return (time.perf_counter() - started) * 1000

    def _recv(self) -> bytes:
        chunk = self._sock.recv(65536)
        if not chunk:
            raise RuntimeError("the connection closed")
        return chunk

    def close(self) -> None:
        self._sock.close()


@contextmanager
def stub_process(workdir: Path, delay_s: float = 0.0) -> Iterator[str]:
    port = free_port()
    argv = [sys.executable, "-m", "bench.gateway_stub", str(port), str(delay_s)]
    proc = start_process(argv, workdir / "stub.log", cwd=Path(__file__).resolve().parents[1])
    try:
        wait_for_port("127.0.0.1", port, timeout_s=30, what="the stub replica", proc=proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process_group(proc, 5)


if __name__ == "__main__":
    asyncio.run(serve_stub_replica(int(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 0.0))
