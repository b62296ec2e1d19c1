"""Who is asking, and the KV namespace they read: API keys to tenants, (tenant, model) epochs, salts.

Keys are looked up by their SHA-256 digest: the key itself is not kept in a dict or compared byte by
byte, and no message here ever quotes it. The `cache_salt` comes from `derive_cache_salt` with exactly
the warmer's inputs (tenant secret, tenant, client-facing model name, epoch), so warm-ups land where
real traffic reads (design brief, section 7).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence

from pydantic import SecretStr


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class TenantDirectory:
    """API key → tenant. `tenant_keys` maps each tenant to its keys; a key may belong to one tenant only."""

    def __init__(self, tenant_keys: Mapping[str, Sequence[SecretStr]]) -> None:
        self._tenants: dict[bytes, str] = {}
        for tenant, keys in tenant_keys.items():
            for key in keys:
                self._tenants[_digest(key.get_secret_value())] = tenant

    def tenant(self, api_key: str) -> str | None:
        """The tenant owning `api_key`, None for a key nobody owns."""
        return self._tenants.get(_digest(api_key))


class EpochBook:
    """The current epoch of each (tenant, model): 0 until an `epoch.bumped` raises it; never lowered.
    Watchers (`watch`) are told of every raise, after it."""

    def __init__(self) -> None:
        self._epochs: dict[tuple[str, str], int] = {}
        self._watchers: list[Callable[[str, str, int], None]] = []

    def watch(self, watcher: Callable[[str, str, int], None]) -> None:
        """Call `watcher(tenant, model, epoch)` on every raise from now on."""
        self._watchers.append(watcher)

    def epoch(self, tenant: str, model: str) -> int:
        return self._epochs.get((tenant, model), 0)

    def bump(self, tenant: str, model: str, epoch: int) -> bool:
        """Raise (tenant, model) to `epoch`; False (and nothing changed) if it is not newer."""
        if epoch <= self.epoch(tenant, model):
            return False
        self._epochs[(tenant, model)] = epoch
        for watcher in self._watchers:
            watcher(tenant, model, epoch)
        return True
