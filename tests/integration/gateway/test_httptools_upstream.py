"""`HttpToolsUpstream` against a raw HTTP/1.1 server started in the test, which misbehaves on purpose:
keep-alive and the pool, bodies and their framing, timeouts, broken answers, cancellation, flow control.

Each scenario runs on asyncio's loop and on uvloop's (the gateway serves on uvloop), a fresh loop per
run, so a scenario's leftover tasks are cancelled with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, cast

import pytest
import uvloop

from tests.integration.gateway.raw_http_server import (
    CHUNKED_HEAD,
    LAST_CHUNK,
    Exchange,
    Handler,
    chunk,
    ended,
    serving,
    until,
    whole,
)
from warmplane.services.gateway.httptools_upstream import HttpToolsUpstream
from warmplane.services.gateway.upstream import (
    UpstreamBroken,
    UpstreamClosed,
    UpstreamResponse,
    UpstreamTimeout,
    UpstreamUnreachable,
)

Run = Callable[[Coroutine[Any, Any, None]], None]
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}
BODY = b'{"model":"tiny","prompt":"hello"}'


@pytest.fixture(params=list(LOOPS))
def run(request: pytest.FixtureRequest) -> Run:
    """Runs a scenario to its end on a fresh loop of the parameter's kind, failing after 20 s."""

    def run(scenario: Coroutine[Any, Any, None]) -> None:
        async def bounded() -> None:
            async with asyncio.timeout(20):
                await scenario

        with asyncio.Runner(loop_factory=LOOPS[request.param]) as runner:
            runner.run(bounded())

    return run


@contextlib.asynccontextmanager
async def upstream(
    *,
    connect_timeout_s: float = 2.0,
    read_timeout_s: float = 5.0,
    keepalive_s: float = 30.0,
    buffer_bytes: int = 256 * 1024,
) -> AsyncIterator[HttpToolsUpstream]:
    client = HttpToolsUpstream(
        connect_timeout_s=connect_timeout_s,
        read_timeout_s=read_timeout_s,
        keepalive_s=keepalive_s,
        buffer_bytes=buffer_bytes,
    )
    try:
        yield client
    finally:
        await client.close()


async def answer_numbered(exchange: Exchange) -> None:
    exchange.writer.write(whole(b'{"answer":%d}' % exchange.connection))


async def post_and_read(client: HttpToolsUpstream, url: str) -> bytes:
    response = await client.post(url + "/v1/completions", BODY)
    try:
        assert response.status == 200
        return await response.read()
    finally:
        await response.close()


def test_requests_one_after_another_share_one_connection(run: Run) -> None:
    async def scenario() -> None:
        async with serving(answer_numbered) as server, upstream() as client:
            response = await client.post(server.url + "/v1/completions", BODY)
            assert (response.status, response.content_type) == (200, "application/json")
            assert await response.read() == b'{"answer":0}'
            await response.close()
            assert await post_and_read(client, server.url) == b'{"answer":0}'
            assert server.connections == 1
            assert client.idle_connections() == 1
            host = server.url.removeprefix("http://").encode()
            assert server.exchanges[0].head == (
                b"POST /v1/completions HTTP/1.1\r\nHost: " + host + b"\r\nContent-Type: application/json"
                b"\r\nContent-Length: %d\r\n\r\n" % len(BODY)
            )
            assert server.exchanges[0].body == BODY

    run(scenario())


def test_a_connection_idle_for_keepalive_is_not_reused(run: Run) -> None:
    async def scenario() -> None:
        async with serving(answer_numbered) as server, upstream(keepalive_s=0.0) as client:
            assert await post_and_read(client, server.url) == b'{"answer":0}'
            assert await post_and_read(client, server.url) == b'{"answer":1}'
            await ended(server, 0)

    run(scenario())


def test_idle_connections_are_closed_after_keepalive_without_another_request(run: Run) -> None:
    async def scenario() -> None:
        async with serving(answer_numbered) as server, upstream(keepalive_s=0.05) as client:
            await post_and_read(client, server.url)
            assert client.idle_connections() == 1
            await ended(server, 0)
            assert client.idle_connections() == 0

    run(scenario())


def closing_kept_connections(*, unanswered: set[int], partial: bytes = b"") -> Handler:
    """Answers each request numbered, except those numbered in `unanswered`: for those it writes
    `partial` and closes the connection, as a replica whose idle timeout crossed the request does."""

    async def handler(exchange: Exchange) -> None:
        if exchange.number in unanswered:
            exchange.writer.write(partial)
            exchange.writer.close()
        else:
            await answer_numbered(exchange)

    return handler


def test_a_kept_connection_closed_unanswered_sends_the_request_once_more_on_a_new_one(run: Run) -> None:
    async def scenario() -> None:
        async with serving(closing_kept_connections(unanswered={1})) as server, upstream() as client:
            first = await client.post(server.url + "/v1/completions", BODY)
            assert (await first.read(), first.resent) == (b'{"answer":0}', False)
            await first.close()
            second = await client.post(server.url + "/v1/completions", BODY)
            assert (await second.read(), second.resent) == (b'{"answer":1}', True)
            await second.close()
            assert [(e.number, e.connection, e.body) for e in server.exchanges] == [
                (0, 0, BODY),
                (1, 0, BODY),
                (2, 1, BODY),
            ]
            assert client.idle_connections() == 1

    run(scenario())


def test_a_request_is_sent_once_more_at_most(run: Run) -> None:
    async def scenario() -> None:
        async with serving(closing_kept_connections(unanswered={1, 2})) as server, upstream() as client:
            await post_and_read(client, server.url)
            with pytest.raises(UpstreamClosed, match="closed the connection before answering"):
                await client.post(server.url + "/v1/completions", BODY)
            assert [(e.number, e.connection) for e in server.exchanges] == [(0, 0), (1, 0), (2, 1)]
            assert client.idle_connections() == 0

    run(scenario())


def test_a_replica_that_refuses_the_resend_is_broken_not_unreachable(run: Run) -> None:
    """It may have died of the request itself (a query of death): the proxy must not hand it on."""
    listening: list[asyncio.Server] = []

    async def die_on_the_second(exchange: Exchange) -> None:
        if exchange.number == 1:
            listening[0].close()  # gone: a new connection is refused
            exchange.writer.close()
        else:
            await answer_numbered(exchange)

    async def scenario() -> None:
        async with serving(die_on_the_second) as server, upstream() as client:
            assert server.listener is not None
            listening.append(server.listener)
            await post_and_read(client, server.url)
            with pytest.raises(UpstreamBroken, match="then refused a new connection") as failure:
                await client.post(server.url + "/v1/completions", BODY)
            assert not isinstance(failure.value, UpstreamUnreachable)

    run(scenario())


@pytest.mark.parametrize(
    ("kept", "partial"),
    [(False, b""), (True, b"HTTP/1.1 200 OK\r\nContent-Le")],
    ids=["new-connection", "kept-connection-part-answered"],
)
def test_a_close_is_final_on_a_new_connection_or_after_a_byte_of_answer(
    run: Run, kept: bool, partial: bytes
) -> None:
    """A replica that closes a new connection unanswered turned the request away (resending it would
    double the load on a failing replica); one that began answering may have acted on it."""
    number = 1 if kept else 0

    async def scenario() -> None:
        handler = closing_kept_connections(unanswered={number}, partial=partial)
        async with serving(handler) as server, upstream() as client:
            if kept:
                await post_and_read(client, server.url)
            with pytest.raises(UpstreamBroken, match="closed the connection before answering") as failure:
                await client.post(server.url + "/v1/completions", BODY)
            assert isinstance(failure.value, UpstreamClosed) is not kept
            assert len(server.exchanges) == number + 1

    run(scenario())


def test_a_connection_the_replica_closed_while_idle_leaves_the_pool(run: Run) -> None:
    close_idle = asyncio.Event()

    async def answer_then_close_when_told(exchange: Exchange) -> None:
        await answer_numbered(exchange)
        if exchange.connection == 0:
            await close_idle.wait()
            exchange.writer.close()

    async def scenario() -> None:
        async with serving(answer_then_close_when_told) as server, upstream() as client:
            await post_and_read(client, server.url)
            assert client.idle_connections() == 1
            close_idle.set()
            await until(lambda: client.idle_connections() == 0, "the client to drop the closed connection")
            assert await post_and_read(client, server.url) == b'{"answer":1}'
            assert server.connections == 2

    run(scenario())


@pytest.mark.parametrize(
    ("answer", "body"),
    [
        (whole(b"0123456789"), b"0123456789"),
        (
            CHUNKED_HEAD + chunk(b"data: 1\n\n") + chunk(b"data: 2\n\n") + LAST_CHUNK,
            b"data: 1\n\ndata: 2\n\n",
        ),
        (CHUNKED_HEAD + LAST_CHUNK, b""),
        (b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" + whole(b"{}"), b"{}"),
    ],
    ids=["content-length", "chunked", "chunked-empty", "after-an-interim-answer"],
)
def test_framed_bodies_are_read_whole_and_the_connection_kept(run: Run, answer: bytes, body: bytes) -> None:
    async def send_answer(exchange: Exchange) -> None:
        exchange.writer.write(answer)

    async def scenario() -> None:
        async with serving(send_answer) as server, upstream() as client:
            assert await post_and_read(client, server.url) == body
            assert await post_and_read(client, server.url) == body
            assert server.connections == 1

    run(scenario())


@pytest.mark.parametrize(
    "answer",
    [
        whole(b"{}", headers=b"Connection: close\r\n"),
        whole(b"{}", status_line=b"HTTP/1.0 200 OK"),
        whole(b"{}", status_line=b"HTTP/1.0 200 OK", headers=b"Connection: keep-alive\r\n"),
    ],
    ids=["connection-close", "http-1.0", "http-1.0-keep-alive"],
)
def test_an_answer_that_ends_its_connection_is_not_pooled(run: Run, answer: bytes) -> None:
    async def send_answer(exchange: Exchange) -> None:
        exchange.writer.write(answer)

    async def scenario() -> None:
        async with serving(send_answer) as server, upstream() as client:
            assert await post_and_read(client, server.url) == b"{}"
            await ended(server, 0)
            assert client.idle_connections() == 0
            assert await post_and_read(client, server.url) == b"{}"
            assert server.connections == 2

    run(scenario())


def test_a_body_delimited_by_the_connection_close_is_read_to_it(run: Run) -> None:
    async def send_then_close(exchange: Exchange) -> None:
        exchange.writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it")
        exchange.writer.close()

    async def scenario() -> None:
        async with serving(send_then_close) as server, upstream() as client:
            assert await post_and_read(client, server.url) == b"all of it"
            assert client.idle_connections() == 0

    run(scenario())


def test_a_body_delimited_by_the_connection_close_is_broken_by_a_reset(run: Run) -> None:
    async def send_then_reset(exchange: Exchange) -> None:
        exchange.writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\npart of it")
        await exchange.writer.drain()
        sock = exchange.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        exchange.writer.transport.abort()

    async def scenario() -> None:
        async with serving(send_then_reset) as server, upstream() as client:
            with pytest.raises(UpstreamBroken):
                await post_and_read(client, server.url)

    run(scenario())


def test_iter_raw_yields_each_chunk_before_the_next_is_sent(run: Run) -> None:
    first_seen = asyncio.Event()

    async def stream_in_steps(exchange: Exchange) -> None:
        exchange.writer.write(CHUNKED_HEAD + chunk(b"data: 1\n\n"))
        await first_seen.wait()
        exchange.writer.write(chunk(b"data: 2\n\n") + LAST_CHUNK)

    async def scenario() -> None:
        async with serving(stream_in_steps) as server, upstream() as client:
            response = await client.post(server.url + "/v1/completions", BODY)
            assert response.content_type == "text/event-stream"
            chunks = []
            async for piece in response.iter_raw():
                chunks.append(piece)
                first_seen.set()
            await response.close()
            assert chunks == [b"data: 1\n\n", b"data: 2\n\n"]
            assert client.idle_connections() == 1

    run(scenario())


def test_a_replica_silent_past_the_read_timeout_times_out_before_its_head(run: Run) -> None:
    async def never_answer(exchange: Exchange) -> None:
        await exchange.until_client_closes()

    async def scenario() -> None:
        async with serving(never_answer) as server, upstream(read_timeout_s=0.2) as client:
            with pytest.raises(UpstreamTimeout):
                await client.post(server.url + "/v1/completions", BODY)
            await ended(server, 0)
            assert client.idle_connections() == 0

    run(scenario())


def test_a_replica_silent_past_the_read_timeout_mid_stream_times_out(run: Run) -> None:
    async def stall_after_one_chunk(exchange: Exchange) -> None:
        exchange.writer.write(CHUNKED_HEAD + chunk(b"data: 1\n\n"))
        await exchange.until_client_closes()

    async def scenario() -> None:
        async with serving(stall_after_one_chunk) as server, upstream(read_timeout_s=0.2) as client:
            response = await client.post(server.url + "/v1/completions", BODY)
            chunks = []
            with pytest.raises(UpstreamTimeout):
                async for piece in response.iter_raw():
                    chunks.append(piece)
            await response.close()
            assert chunks == [b"data: 1\n\n"]
            await ended(server, 0)
            assert client.idle_connections() == 0

    run(scenario())


def test_a_refused_connection_is_unreachable(run: Run) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there

    async def scenario() -> None:
        async with upstream() as client:
            with pytest.raises(UpstreamUnreachable, match="ConnectionRefusedError"):
                await client.post(f"http://127.0.0.1:{port}/v1/completions", BODY)

    run(scenario())


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/v1/completions", "http://127.0.0.1:port/v1/completions"])
def test_a_url_no_connection_can_be_made_to_is_unreachable(run: Run, url: str) -> None:
    async def scenario() -> None:
        async with upstream() as client:
            with pytest.raises(UpstreamUnreachable):
                await client.post(url, BODY)

    run(scenario())


def test_a_connection_not_accepted_within_the_connect_timeout_is_unreachable(run: Run) -> None:
    """A listener with a backlog of 0 that never accepts: Linux queues one connection, then drops
    the SYNs of the next, which therefore never completes."""
    with socket.socket() as listener, socket.socket() as queued:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        queued.connect(("127.0.0.1", port))

        async def scenario() -> None:
            async with upstream(connect_timeout_s=0.2) as client:
                with pytest.raises(UpstreamUnreachable, match="TimeoutError"):
                    await client.post(f"http://127.0.0.1:{port}/v1/completions", BODY)

        run(scenario())


@pytest.mark.parametrize(
    ("answer", "failing", "reason"),
    [
        (b"", "post", "closed the connection before answering"),
        (b"NOT HTTP AT ALL\r\n\r\n", "post", "unparsable HTTP"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123", "read", "closed the connection mid-answer"),
        (CHUNKED_HEAD + chunk(b"data: 1\n\n"), "read", "closed the connection mid-answer"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "read", "unparsable HTTP"),
    ],
    ids=["before-head", "not-http", "mid-content-length", "mid-chunked", "bad-chunk"],
)
def test_an_answer_cut_short_or_garbled_is_broken(run: Run, answer: bytes, failing: str, reason: str) -> None:
    async def send_then_close(exchange: Exchange) -> None:
        exchange.writer.write(answer)
        exchange.writer.close()

    async def scenario() -> None:
        async with serving(send_then_close) as server, upstream() as client:
            url = server.url + "/v1/completions"
            if failing == "post":
                with pytest.raises(UpstreamBroken, match=reason):
                    await client.post(url, BODY)
            else:
                response = await client.post(url, BODY)
                with pytest.raises(UpstreamBroken, match=reason):
                    await response.read()
                await response.close()
            assert client.idle_connections() == 0

    run(scenario())


def test_bytes_past_the_end_of_an_answer_close_the_connection(run: Run) -> None:
    async def answer_twice(exchange: Exchange) -> None:
        exchange.writer.write(whole(b"{}") + whole(b"{}"))

    async def scenario() -> None:
        async with serving(answer_twice) as server, upstream() as client:
            assert await post_and_read(client, server.url) == b"{}"
            await ended(server, 0)
            assert client.idle_connections() == 0

    run(scenario())


def test_bytes_sent_to_an_idle_connection_close_it(run: Run) -> None:
    pooled = asyncio.Event()

    async def answer_then_babble(exchange: Exchange) -> None:
        await answer_numbered(exchange)
        await pooled.wait()
        exchange.writer.write(whole(b"{}"))

    async def scenario() -> None:
        async with serving(answer_then_babble) as server, upstream() as client:
            await post_and_read(client, server.url)
            assert client.idle_connections() == 1
            pooled.set()
            await ended(server, 0)
            assert client.idle_connections() == 0

    run(scenario())


@pytest.mark.parametrize("cancelled", ["post", "read", "iteration"])
def test_a_cancelled_wait_leaves_no_used_connection_in_the_pool(run: Run, cancelled: str) -> None:
    asked = asyncio.Event()

    async def first_stalls(exchange: Exchange) -> None:
        if exchange.connection > 0:
            exchange.writer.write(whole(b"{}"))
            return
        if cancelled != "post":
            exchange.writer.write(CHUNKED_HEAD + chunk(b"data: 1\n\n"))
        asked.set()
        await exchange.until_client_closes()

    async def scenario() -> None:
        async with serving(first_stalls) as server, upstream() as client:
            url = server.url + "/v1/completions"
            response: UpstreamResponse | None = None

            async def consume() -> None:
                nonlocal response
                response = await client.post(url, BODY)
                if cancelled == "read":
                    await response.read()
                elif cancelled == "iteration":
                    async for _ in response.iter_raw():
                        pass

            task = asyncio.create_task(consume())
            await asyncio.wait_for(asked.wait(), 5)
            if cancelled != "post":
                await until(lambda: response is not None, "the head to arrive")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            if response is not None:
                await response.close()
            await ended(server, 0)
            assert client.idle_connections() == 0
            assert await post_and_read(client, server.url) == b"{}"
            assert server.connections == 2

    run(scenario())


def test_concurrent_requests_to_one_replica_each_get_a_connection(run: Run) -> None:
    concurrent = 4
    all_asked = asyncio.Event()
    asked = 0

    async def answer_once_all_asked(exchange: Exchange) -> None:
        nonlocal asked
        asked += 1
        if asked == concurrent:
            all_asked.set()
        await all_asked.wait()
        await answer_numbered(exchange)

    async def scenario() -> None:
        async with serving(answer_once_all_asked) as server, upstream() as client:
            answers = await asyncio.gather(*(post_and_read(client, server.url) for _ in range(concurrent)))
            assert sorted(answers) == [b'{"answer":%d}' % i for i in range(concurrent)]
            assert server.connections == concurrent
            assert client.idle_connections() == concurrent

    run(scenario())


def test_a_slow_reader_pauses_reading_from_the_replica_until_it_catches_up(run: Run) -> None:
    piece = bytes(range(256)) * 256  # 64 KiB
    pieces = 128  # 8 MiB: more than loopback's socket buffers hold

    async def send_a_lot(exchange: Exchange) -> None:
        exchange.writer.write(CHUNKED_HEAD + chunk(piece) * pieces + LAST_CHUNK)
        await exchange.writer.drain()

    async def scenario() -> None:
        async with serving(send_a_lot) as server, upstream(buffer_bytes=64 * 1024) as client:
            response = await client.post(server.url + "/v1/completions", BODY)
            transport = cast(Any, response)._connection.transport  # white box: the pause is the point
            await until(lambda: not transport.is_reading(), "the client to stop reading the socket")
            assert await response.read() == piece * pieces
            await response.close()
            assert client.idle_connections() == 1

    run(scenario())


def test_closing_the_client_closes_idle_and_busy_connections(run: Run) -> None:
    async def first_stalls_second_answers(exchange: Exchange) -> None:
        if exchange.number == 0:
            exchange.writer.write(CHUNKED_HEAD)
            await exchange.until_client_closes()
        else:
            exchange.writer.write(whole(b"{}"))

    async def scenario() -> None:
        async with serving(first_stalls_second_answers) as server:
            client = HttpToolsUpstream(connect_timeout_s=2, read_timeout_s=5, keepalive_s=30)
            busy = await client.post(server.url + "/v1/completions", BODY)
            await post_and_read(client, server.url)
            assert client.idle_connections() == 1
            await client.close()
            await ended(server, 0)
            await ended(server, 1)
            with pytest.raises(UpstreamBroken):
                await busy.read()
            await busy.close()
            with pytest.raises(RuntimeError):
                await client.post(server.url + "/v1/completions", BODY)

    run(scenario())
