"""The gateway's held writes (`shared/asgi_server.py`): a response's head leaves with its body, and
nothing is held past the event-loop step that wrote it. No sockets: a recording transport."""

from __future__ import annotations

import asyncio
from typing import cast

from warmplane.shared.asgi_server import _HeldWrites


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"extra {name}"


def held(inner: RecordingTransport) -> _HeldWrites:
    return _HeldWrites(cast(asyncio.Transport, inner), asyncio.get_running_loop())


async def test_a_head_and_a_body_written_in_one_step_go_out_as_one_write() -> None:
    inner = RecordingTransport()
    transport = held(inner)
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert inner.writes == []
    transport.write(memoryview(b"body"))
    assert inner.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
    await asyncio.sleep(0)
    assert inner.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]


async def test_a_lone_write_goes_out_at_the_end_of_the_loop_step() -> None:
    inner = RecordingTransport()
    transport = held(inner)
    transport.write(b"head")
    await asyncio.sleep(0)
    assert inner.writes == [b"head"]
    transport.write(b"chunk 1")
    transport.write(b"chunk 2")
    transport.write(b"chunk 3")
    await asyncio.sleep(0)
    assert inner.writes == [b"head", b"chunk 1chunk 2", b"chunk 3"]


async def test_close_sends_what_is_held_first_and_the_rest_is_the_transports() -> None:
    inner = RecordingTransport()
    transport = held(inner)
    transport.write(b"last words")
    transport.close()
    assert inner.writes == [b"last words"] and inner.closed
    await asyncio.sleep(0)
    assert inner.writes == [b"last words"]
    assert transport.is_closing() and transport.get_extra_info("peername") == "extra peername"


async def test_a_write_held_when_the_connection_closes_is_dropped() -> None:
    inner = RecordingTransport()
    transport = held(inner)
    transport.write(b"too late")
    inner.closed = True
    await asyncio.sleep(0)
    assert inner.writes == []
