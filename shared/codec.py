"""Encoding and decoding events: one typed pass with msgspec, and a reason for everything that fails.

Decoding never raises on bad input: it returns a `DecodeFailure` naming what is wrong, so the consumer
can dead-letter the message with that reason and go on. Only the slow path (a failure) parses twice,
to tell a schema version from the future apart from a malformed payload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import msgspec

from warmplane.shared.events import EVENT_TYPES, SCHEMA_VERSION, AnyEvent, Event

DEFAULT_MAX_EVENT_BYTES: Final = 256 * 1024


@dataclass(frozen=True, slots=True)
class DecodeFailure:
    """Why a message is not an event this reader accepts. `reason` is one line, fit for a header."""

    reason: str
    event_type: str = ""


class _Header(msgspec.Struct):
    type: str = ""
    schema_version: int | str | None = None


class EventCodec:
    """Thread-compatible, reusable encoder and decoder of the event contract.

    `max_event_bytes` caps the encoded size of one event; larger messages are refused unread.
    """

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        if max_event_bytes <= 0:
            raise ValueError("max_event_bytes must be positive")
        self.max_event_bytes = max_event_bytes
        self._decoder = msgspec.json.Decoder(AnyEvent)
        self._header = msgspec.json.Decoder(_Header)
        self._encoder = msgspec.json.Encoder()

    def encode(self, event: Event) -> bytes:
        """The JSON bytes of `event`. Raises `ValueError` if they exceed `max_event_bytes`."""
        data = self._encoder.encode(event)
        if len(data) > self.max_event_bytes:
            raise ValueError(f"event of {len(data)} bytes exceeds max_event_bytes={self.max_event_bytes}")
        return data

    def decode(self, data: bytes | None) -> Event | DecodeFailure:
        """The event in `data`, or why it is not one."""
        if data is None:
            return DecodeFailure("empty message (tombstone)")
        if len(data) > self.max_event_bytes:
            return DecodeFailure(
                f"message of {len(data)} bytes exceeds max_event_bytes={self.max_event_bytes}"
            )
        try:
            event: Event = self._decoder.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
            return self._explain(data, exc)
        if event.schema_version > SCHEMA_VERSION:
            return _from_the_future(type(event).__struct_config__.tag, event.schema_version)  # type: ignore[arg-type]
        return event

    def _explain(self, data: bytes, exc: Exception) -> DecodeFailure:
        try:
            header = self._header.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            return DecodeFailure(f"not a JSON event object: {_one_line(exc)}")
        version = header.schema_version
        if header.type not in EVENT_TYPES:
            return DecodeFailure(f"unknown event type {header.type!r}", header.type)
        if isinstance(version, int) and version > SCHEMA_VERSION:
            return _from_the_future(header.type, version)
        return DecodeFailure(f"invalid {header.type}: {_one_line(exc)}", header.type)


def _from_the_future(event_type: str, version: int) -> DecodeFailure:
    return DecodeFailure(
        f"schema_version {version} of {event_type} is newer than this reader (knows up to {SCHEMA_VERSION})",
        event_type,
    )


def _one_line(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text if text else type(exc).__name__
