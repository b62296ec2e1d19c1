"""Relaying a replica's server-sent events byte for byte, reading the usage chunk on the way.

vLLM frames each event as `data: <json>\n\n`. The relay forwards every complete event exactly as it
arrived, except when the gateway asked for the usage chunk (`"choices": []` with `usage`) and the
client did not. Then the client must see what the engine would have sent it directly, and with usage
on, vLLM moves `system_fingerprint` from each chunk that finishes a choice (`"finish_reason":"..."`)
to the usage chunk. The fingerprint is the engine's constant (its version and configuration hash, or
nothing with `--fingerprint-mode none`), so once a usage chunk of a replica has shown it (`Fingerprint`),
the relay writes it at the end of a finishing chunk, where vLLM writes it, and forwards the chunk at
once. Before that it holds a finishing chunk back until the next event; if that is the usage chunk,
it is dropped and its fingerprint put back. (Holding cost a one-token answer its first byte: its only
content chunk is the finishing one.) A replica restarted with another fingerprint gives one stream
the old one. Bytes after the last complete event wait for the rest of their event (or the end).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

_SEPARATOR = b"\n\n"
_DATA = b"data: "
_FINISHED = b'"finish_reason":"'
_FINGERPRINT = b'"system_fingerprint"'
_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


def _has_usage(data: bytes) -> bool:
    return b'"usage":{' in data or b'"usage": {' in data


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """A replica's `system_fingerprint` as its usage chunks carry it (`value` None: they carry none)."""

    value: str | None


class SseRelay:
    """Feed upstream chunks in, forward what `feed` and `finish` return; read `usage` (and the replica's
    `fingerprint`, None while no usage chunk showed it) at the end. `fingerprint`: what the replica's
    earlier streams showed, if any."""

    def __init__(self, *, strip_usage_chunk: bool, fingerprint: Fingerprint | None = None) -> None:
        self._strip = strip_usage_chunk
        self._pending = b""
        self._held: bytes | None = None
        self.usage: dict[str, Any] | None = None
        """The last `usage` object seen in the stream, if any."""
        self.fingerprint = fingerprint

    def feed(self, chunk: bytes) -> bytes:
        """The complete events `chunk` finishes, to forward now (possibly empty)."""
        data = self._pending + chunk if self._pending else chunk
        end = data.rfind(_SEPARATOR)
        if end < 0:
            self._pending = data
            return b""
        self._pending = data[end + len(_SEPARATOR) :]
        complete = data[: end + len(_SEPARATOR)]
        if self._strip:
            return b"".join(self._rewrite(complete))
        if _has_usage(complete):
            for event in complete.split(_SEPARATOR)[:-1]:
                self._read_usage(event)
        return complete

    def finish(self) -> bytes:
        """What is left when the upstream ends (a held chunk, an unterminated last event), as is."""
        held, self._held = self._held or b"", None
        rest, self._pending = self._pending, b""
        return held + rest

    def _rewrite(self, complete: bytes) -> list[bytes]:
        out: list[bytes] = []
        for event in complete.split(_SEPARATOR)[:-1]:
            framed = event + _SEPARATOR
            chunk = self._read_usage(event)
            if chunk is not None and chunk.get("choices") == []:
                if self._held is not None:
                    out.append(_with_fingerprint(self._held, chunk.get("system_fingerprint")))
                    self._held = None
                continue
            if self._held is not None:
                out.append(self._held)
                self._held = None
            if _FINISHED not in event:
                out.append(framed)
            elif self.fingerprint is not None:
                out.append(_with_fingerprint(framed, self.fingerprint.value))
            else:
                self._held = framed
        return out

    def _read_usage(self, event: bytes) -> dict[str, Any] | None:
        """The decoded chunk if `event` carries a usage object (remembered in `usage`), else None."""
        if not (event.startswith(_DATA) and _has_usage(event)):
            return None
        try:
            chunk = _decoder.decode(event[len(_DATA) :])
        except msgspec.DecodeError:
            return None
        usage = chunk.get("usage") if isinstance(chunk, dict) else None
        if not isinstance(usage, dict):
            return None
        self.usage = usage
        if chunk.get("choices") == []:
            fingerprint = chunk.get("system_fingerprint")
            self.fingerprint = Fingerprint(fingerprint if isinstance(fingerprint, str) else None)
        return chunk  # type: ignore[no-any-return]


def _with_fingerprint(framed: bytes, fingerprint: object) -> bytes:
    """`framed` (`data: {...}\n\n`) with `system_fingerprint` as its last key, unless it has one."""
    closing = b"}" + _SEPARATOR
    if fingerprint is None or _FINGERPRINT in framed or not framed.endswith(closing):
        return framed
    return framed[: -len(closing)] + b',"system_fingerprint":' + _encoder.encode(fingerprint) + closing
