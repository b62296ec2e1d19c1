"""HTTP/1.1 framing for the benchmarks' raw-socket stubs and clients, which read a message's head and then
exactly its body, with no HTTP library in the way."""

from __future__ import annotations


def content_length(head: bytes) -> int:
    """The Content-Length that a message head (its lines split by CRLF) declares, 0 if it declares none.
    Raises ValueError if the value is not a whole number."""
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0
