"""A TLS terminator for tests: clients speak TLS to it, it speaks plain TCP to a part that has no TLS of
its own (the embedded PostgreSQL is built without SSL; the embedded broker has no TLS listener).

`postgres=True` speaks PostgreSQL's negotiation first: the client's `SSLRequest` is answered `S`, then the
TLS handshake runs on the same connection. A client that does not ask for TLS is closed, so whatever
reaches the part through here came over TLS. `sessions` counts the handshakes that succeeded.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Self

_SSL_REQUEST = 80877103


class TlsTerminator:
    def __init__(
        self, backend: tuple[str, int], context: ssl.SSLContext, *, postgres: bool = False, port: int = 0
    ) -> None:
        self.backend = backend
        self._port = port
        self.context = context
        self.postgres = postgres
        self.sessions = 0
        self.refused = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def __aenter__(self) -> Self:
        tls = None if self.postgres else self.context  # Postgres starts TLS after its own request
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self._port, ssl=tls)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        for pipe in list(self._pipes):
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._pipes.add(task)
        try:
            if self.postgres and not await self._negotiate(reader, writer):
                self.refused += 1
                return
            self.sessions += 1
            up_reader, up_writer = await asyncio.open_connection(*self.backend)
            pumps = {
                asyncio.create_task(_pump(reader, up_writer)),
                asyncio.create_task(_pump(up_reader, writer)),
            }
            try:  # either side closing closes both: a TLS stream cannot pass on a half-close
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
                up_writer.close()
        except (OSError, asyncio.IncompleteReadError):  # refused, reset, a failed handshake (SSLError)
            pass
        finally:
            writer.close()
            self._pipes.discard(task)

    async def _negotiate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        length, code = struct.unpack("!ii", await reader.readexactly(8))
        if (length, code) != (8, _SSL_REQUEST):
            return False
        writer.write(b"S")
        await writer.drain()
        try:
            await writer.start_tls(self.context)
        except ssl.SSLError:
            return False
        return True


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        while data := await source.read(65_536):
            sink.write(data)
            await sink.drain()


def server_context(certificate: str, key: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certificate, key)
    return context


def _openssl(folder: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)


def make_certificates(folder: Path) -> None:
    """`ca.pem` and the server's `server.pem`/`server.key` for 127.0.0.1 signed by it; `other-ca.pem`,
    a CA that signed nothing here."""
    for ca in ("ca", "other-ca"):
        _openssl(folder, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                 f"/CN=warmplane test {ca}", "-keyout", f"{ca}.key", "-out", f"{ca}.pem")  # fmt: skip
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl(folder, "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
             "-keyout", "server.key", "-out", "server.csr")  # fmt: skip
    _openssl(folder, "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "1", "-extfile", "san.ext", "-out", "server.pem")  # fmt: skip
