"""What the API's routes are handed: the read model, the publisher, the tokens, the clock.

`build_app` takes an `ApiDeps`; `service.py` builds the real one (asyncpg pool, acknowledged Kafka
publisher) inside the app's lifespan, so nothing is created at import time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Protocol

from fastapi import Depends, Header, Request

from warmplane.services.api import figures
from warmplane.services.api.answer_cache import AnswerCache
from warmplane.services.api.auth import Principal, TokenBook
from warmplane.services.api.figures import Window
from warmplane.services.api.metrics import ApiMetrics
from warmplane.services.api.pg_read import PgReadModel
from warmplane.services.api.settings import ApiOptions
from warmplane.shared.events import Event


class EventSink(Protocol):
    async def publish(self, event: Event) -> None:
        """Return once the broker acknowledged `event`; raise if it did not."""


@dataclass
class ApiDeps:
    read: PgReadModel
    events: EventSink
    tokens: TokenBook
    options: ApiOptions
    bucket_seconds: int
    """The statistics' bucket width (`WARMPLANE_STATISTICS__BUCKET_SECONDS`)."""
    metrics: ApiMetrics
    clock: Callable[[], float]
    """Unix seconds now."""
    warm_sets: AnswerCache[Any]
    """`/v1/warm-sets` answers, reused for `options.warm_sets_cache_s`."""

    def window(self, window_s: int | None, step_s: int | None = None) -> Window:
        """The statistics buckets of the last `window_s` seconds (the default window if None), in steps
        of `step_s` (one step if None)."""
        options = self.options
        seconds = window_s or options.default_window_s
        return figures.window(self.clock(), seconds, step_s, self.bucket_seconds)


def api_deps(request: Request) -> ApiDeps:
    deps: ApiDeps = request.app.state.deps
    return deps


def principal(
    request: Request,
    authorization: Annotated[
        str | None, Header(description="Bearer <token> (WARMPLANE_API_CALLERS)", include_in_schema=False)
    ] = None,
) -> Principal:
    """The caller, from `Authorization: Bearer <token>`; 401 without a known token."""
    found = api_deps(request).tokens.authenticate(authorization)
    request.state.principal = found
    return found


Deps = Annotated[ApiDeps, Depends(api_deps)]
Caller = Annotated[Principal, Depends(principal)]
