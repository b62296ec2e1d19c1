"""vLLM ``cache_salt`` per (tenant, model, epoch), keyed by the tenant's secret (design brief, section 7).

The gateway and the warmer both call :func:`derive_cache_salt`, so warm-ups land in the KV namespace real
traffic reads: vLLM mixes the salt into the first block's hash, and a hit needs the identical salt. Tenants
never share KV (another tenant's secret gives another salt), and an epoch bump moves everyone to a fresh
namespace without resetting the engine's cache.

Contracts:
- The salt is HMAC-SHA256, keyed by the tenant secret, over a canonical JSON encoding of
  ``["warmplane/cache-salt/v1", tenant, model, epoch]`` (JSON, not a joined string: no choice of names makes
  two inputs encode alike), as unpadded base64url: always exactly 43 characters of ``[A-Za-z0-9_-]``, so never
  ``@``, ``/``, ``\\`` or NUL, and within vLLM's 1 to 128 characters.
- Deterministic across processes and machines; a change to any input changes the salt.
- The secret never appears in the output, in an exception message or in a repr.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Collection, Mapping
from typing import Final

import msgspec
from pydantic import SecretStr

SALT_LENGTH: Final = 43
"""Characters in every salt: 32 bytes of HMAC-SHA256 as unpadded base64url."""
_DOMAIN: Final = "warmplane/cache-salt/v1"
_canonical = msgspec.json.Encoder(order="sorted")


def derive_cache_salt(tenant_secret: SecretStr | bytes, tenant: str, model: str, epoch: int) -> str:
    """The ``cache_salt`` for ``tenant``'s requests to ``model`` in ``epoch``.

    ``epoch`` is the (tenant, model) epoch, a non-negative integer. Raises ``ValueError`` (naming no
    secret) for an empty secret, one ending in a NUL byte (HMAC would take it for the same key without
    it, so two tenants' salts could meet), or a negative epoch.
    """
    key = tenant_secret.get_secret_value().encode() if isinstance(tenant_secret, SecretStr) else tenant_secret
    if not key:
        raise ValueError("the tenant secret must not be empty")
    if key.endswith(b"\0"):  # HMAC pads a short key with zero bytes: b"k" and b"k\0" would be one key
        raise ValueError("the tenant secret must not end in a NUL byte")
    if epoch < 0:
        raise ValueError(f"epoch must be non-negative, got {epoch}")
    message = _canonical.encode((_DOMAIN, tenant, model, epoch))
    digest = hmac.new(key, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


class SaltBook:
    """The `cache_salt` of each (tenant, model, epoch) from the tenants' secrets, memoised: what the gateway
    puts on a tenant's requests and the warmer on its warms, so both land in one namespace. None for a
    tenant without a secret (the gateway sends its requests unsalted; the warmer fails its items, since a
    warm under any other salt lands where its traffic never reads); "" for an `unsalted` tenant, whose
    traffic reaches the engine with no salt (the warmer's `WARMPLANE_UNSALTED_TENANTS`)."""

    def __init__(self, secrets: Mapping[str, SecretStr], unsalted: Collection[str] = ()) -> None:
        self._secrets = secrets
        self._unsalted = frozenset(unsalted)
        self._salts: dict[tuple[str, str, int], str] = {}

    def salt(self, tenant: str, model: str, epoch: int) -> str | None:
        if tenant in self._unsalted:
            return ""
        key = (tenant, model, epoch)
        salt = self._salts.get(key)
        if salt is None:
            secret = self._secrets.get(tenant)
            if secret is None or not secret.get_secret_value():
                return None
            salt = self._salts[key] = derive_cache_salt(secret, tenant, model, epoch)
        return salt
