"""Bearer tokens and what each may see. Pure: no I/O.

A caller is a `Principal`; `Principal.tenants_visible` and `may_see_payloads` are the one place the
cross-tenant rules live, so every endpoint asks them instead of deciding for itself. A refusal never
says whether the other tenant exists.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass

from warmplane.services.api.settings import ApiCaller, Role


class Unauthenticated(Exception):
    """No token, or one no entry holds (answered 401)."""


class Forbidden(Exception):
    """A valid token without the right (answered 403)."""


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    role: Role
    tenant: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def tenant_scope(self, asked: str | None) -> str | None:
        """The tenant a read is restricted to: `asked` (None: every tenant) if this caller may read it.

        A tenant token reads only its own tenant, whether it asks for it or not.
        Raises `Forbidden` for any other tenant, with a message that names only the caller's own.
        """
        if self.role != "tenant":
            return asked
        if asked is not None and asked != self.tenant:
            raise Forbidden(f"this token reads only tenant {self.tenant!r}")
        return self.tenant

    def may_see_payloads(self, tenant: str) -> bool:
        """Payload previews (prompt text) only to admins and to the tenant's own tokens."""
        return self.role == "admin" or (self.role == "tenant" and self.tenant == tenant)

    @property
    def sees_fleet(self) -> bool:
        """Fleet-wide figures (plans and their items mix tenants): admins and readers only."""
        return self.role != "tenant"

    def require_fleet(self) -> None:
        if not self.sees_fleet:
            raise Forbidden("this view spans tenants: it needs a reader or admin token")

    def require_admin(self) -> None:
        if self.role != "admin":
            raise Forbidden("this action needs an admin token")


class TokenBook:
    """Looks a bearer token up in constant time per entry; keeps digests, not the tokens."""

    def __init__(self, tokens: Iterable[ApiCaller]) -> None:
        self._entries = [
            (_digest(t.token.get_secret_value()), Principal(t.name, t.role, t.tenant)) for t in tokens
        ]

    def __len__(self) -> int:
        return len(self._entries)

    def authenticate(self, authorization: str | None) -> Principal:
        """The principal for an `Authorization: Bearer <token>` header; raises `Unauthenticated`."""
        if not authorization:
            raise Unauthenticated("missing Authorization header: send 'Authorization: Bearer <token>'")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("the Authorization header must be 'Bearer <token>'")
        digest = _digest(token.strip())
        found: Principal | None = None
        for known, principal in self._entries:  # no early exit: every entry costs the same
            if hmac.compare_digest(known, digest):
                found = principal
        if found is None:
            raise Unauthenticated("unknown token")
        return found


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()
