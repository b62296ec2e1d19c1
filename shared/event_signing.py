"""Control events signed by Warmplane's own services: an HMAC-SHA256 of a record's value under a key they
share (`WARMPLANE_EVENT_KEYS`), carried in the record's `warmplane-signature` header.

Lifecycle, epoch and plan events steer the fleet: a forged `replica.became_ready` points gateways at an
endpoint of the forger's choosing, a forged `epoch.bumped` retires a tenant's cache. With keys set, the
publisher (`event_publisher.py`) signs every event with the first key, and the consumers of the lifecycle
and plans topics accept a record only if one of the keys signed it: the second key is the one being
rotated in or out, so producers and consumers need not change keys at the same instant. Without keys
nothing is signed or checked (the embedded parts, tests), and each service says so at start.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import SecretStr

from warmplane.shared.topics import SIGNATURE_HEADER

_SCHEME = b"hmac-sha256="
log = logging.getLogger(__name__)


class EventSigner:
    """Signs with `keys[0]`; verifies against every key (at most two: current and rotating)."""

    def __init__(self, keys: Sequence[SecretStr]) -> None:
        self._keys = [key.get_secret_value().encode() for key in keys]

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def say_if_off(self, service: str) -> None:
        """A warning at start when there are no keys: control events are then taken on trust."""
        if not self._keys:
            log.warning(
                "%s: WARMPLANE_EVENT_KEYS is empty: control events are neither signed nor checked", service
            )

    def headers(self, value: bytes) -> list[tuple[str, bytes]]:
        """The headers that sign `value` (none without keys)."""
        if not self._keys:
            return []
        return [(SIGNATURE_HEADER, _SCHEME + base64.b64encode(_mac(self._keys[0], value)))]

    def refusal(self, value: bytes | None, headers: Sequence[tuple[str, bytes]] | None) -> str | None:
        """None if a key signed `value` (or there are no keys); otherwise why the record is refused, one
        line that quotes no signature or key."""
        if not self._keys:
            return None
        given = [v for name, v in headers or () if name == SIGNATURE_HEADER]
        if not given:
            return "unsigned control event: no warmplane-signature header"
        if len(given) > 1 or not given[0].startswith(_SCHEME):
            return "badly signed control event: not one hmac-sha256 signature"
        try:
            signature = base64.b64decode(given[0][len(_SCHEME) :], validate=True)
        except ValueError:
            return "badly signed control event: the signature is not base64"
        payload = value or b""
        matches = [hmac.compare_digest(_mac(key, payload), signature) for key in self._keys]
        return None if any(matches) else "badly signed control event: no current key signed it"


def _mac(key: bytes, value: bytes) -> bytes:
    return hmac.new(key, value, hashlib.sha256).digest()


@dataclass(frozen=True, slots=True)
class SignedTopics:
    """The topics whose records a consumer accepts only signed (when `signer` has keys)."""

    signer: EventSigner
    topics: frozenset[str]

    def checks(self, topic: str) -> bool:
        return self.signer.enabled and topic in self.topics
