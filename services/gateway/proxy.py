"""Serving one OpenAI request: authenticate, read, route, forward with failover, relay, observe.

Contracts:
- Refusals (bad key, bad body, unknown model, no ready replica) are OpenAI-shaped errors and never
  reach a replica. The replica's own answers, errors included, are passed through with their status
  and bytes (streams: byte for byte, minus the usage chunk only the gateway asked for).
- A request goes to its replicas in `Router.route` order. It moves to the next one only when no byte
  of it can have been acted on: the connection failed, or writing the request failed. Any later
  failure is answered (502, or 504 on a timeout) and never retried, so nothing runs twice. (The
  client itself sends a request once more when a kept-alive connection was closed under it unanswered;
  counted in `warmplane_gateway_resends_total`: see `upstream.UpstreamClosed`.)
- A replica that refused connections, broke the protocol or died mid-stream is ejected from the ring
  for `eject_s` (or until it reports ready again). A stream that dies gets one final SSE error event,
  then ends: the client is never left hanging.
- In-flight counts (the ring's load bound) cover a request from its first attempt to its last byte
  from the replica.
- A request's event and metrics are recorded after its answer went to the server (a whole answer:
  once its bytes were handed over; a stream: once it ended), so the client never waits for them.
- With a result cache (`result_cache.py`), a request it may answer is looked up once the tenant, model
  and epoch are known; a hit is answered without a replica (`x-warmplane-cache: l1 | exact | semantic
  | flight`), and a miss's 200 answer is offered to the cache (`x-warmplane-cache: miss`) once it went
  out. A miss that follows an identical request in flight waits for its answer first (bounded); every
  other miss ends in `keep` or `abandon`, however its request ends, so no follower waits on it in vain.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from warmplane.services.gateway import errors
from warmplane.services.gateway.errors import SERVER, ApiError
from warmplane.services.gateway.membership import Replica
from warmplane.services.gateway.metrics import GatewayMetrics
from warmplane.services.gateway.observations import Observer, Served
from warmplane.services.gateway.openai_request import (
    PATHS,
    ClientRequest,
    Kind,
    chain_of,
    decode,
    upstream_body,
)
from warmplane.services.gateway.relayed_stream import Outcome, RelayedStream
from warmplane.services.gateway.result_cache import ResultCache
from warmplane.services.gateway.result_keys import CACHE_HEADER
from warmplane.services.gateway.result_lookup import Hit, Lookup
from warmplane.services.gateway.router import Router
from warmplane.services.gateway.settings import GatewayOptions, RoutingSettings
from warmplane.services.gateway.sse_relay import Fingerprint, SseRelay
from warmplane.services.gateway.tenants import EpochBook, TenantDirectory
from warmplane.services.gateway.upstream import (
    Upstream,
    UpstreamBroken,
    UpstreamResponse,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from warmplane.shared.cache_salt import SaltBook
from warmplane.shared.prefix_chain import Namespace, PrefixChain
from warmplane.shared.rate_limit import RateLimiter

REPLICA_HEADER = "x-warmplane-replica"
_MAX_FINGERPRINTS = 4_096
"""Replicas whose fingerprint is remembered at once; past that the memory starts again."""
_decoder = msgspec.json.Decoder()


@dataclass(frozen=True, slots=True)
class _Job:
    request: ClientRequest
    tenant: str
    epoch: int
    chain: PrefixChain
    started: float
    cache: Lookup | None


class Proxy:
    """The serving path. `wall` gives Unix seconds (ring ramp, ejections), `monotonic` durations."""

    def __init__(
        self,
        *,
        tenants: TenantDirectory,
        salts: SaltBook,
        epochs: EpochBook,
        router: Router,
        client: Upstream,
        observer: Observer,
        metrics: GatewayMetrics,
        options: GatewayOptions,
        routing: RoutingSettings,
        results: ResultCache | None = None,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._tenants, self._salts, self._epochs = tenants, salts, epochs
        self._router = router
        self._client = client
        self._observer = observer
        self._metrics = metrics
        self._options = options
        self._routing = routing
        self._results = results
        self._wall = wall
        self._monotonic = monotonic
        self._rates = RateLimiter(options.rate_limit)
        self._fingerprints: dict[str, Fingerprint] = {}
        """Each replica's `system_fingerprint` as its last usage chunk showed it (`sse_relay`)."""

    def authenticate(self, request: Request) -> str:
        """The tenant of the request's bearer key. Raises `ApiError` (401) without a valid one."""
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if not header:
            raise errors.missing_api_key()
        key = key.strip()
        tenant = self._tenants.tenant(key) if scheme.lower() == "bearer" and key else None
        if tenant is None:
            raise errors.invalid_api_key()
        return tenant

    def admit(self, request: Request) -> str:
        """The request's tenant (`authenticate`), if it is within the tenant's rate limit; raises
        `ApiError` (401, or 429 with `Retry-After`) otherwise."""
        tenant = self.authenticate(request)
        wait_s = self._rates.take(tenant, self._monotonic())
        if wait_s:
            raise errors.rate_limited(wait_s)
        return tenant

    async def handle(self, kind: Kind, request: Request) -> Response:
        started = self._monotonic()
        tenant = model = "-"
        try:
            tenant = self.admit(request)
            client_request = decode(await self._read_body(request), kind)
            if not self._router.membership.serves(client_request.model):
                raise errors.unknown_model(client_request.model)
            model = client_request.model
            epoch = self._epochs.epoch(tenant, model)
            cache = None
            if self._results is not None:
                cache = await self._results.lookup(client_request, tenant, epoch, request.headers)
                if cache is not None and cache.follows:
                    await self._results.follow(cache)
                if cache is not None and cache.hit is not None:
                    return self._from_cache(client_request, tenant, started, cache.hit)
            chain = chain_of(client_request, Namespace(tenant, model))
            job = _Job(client_request, tenant, epoch, chain, started, cache)
            try:
                return await self._forward(job)
            except BaseException:
                if cache is not None and self._results is not None:
                    self._results.abandon(cache)
                raise
        except ApiError as error:
            self._finish(tenant, model, kind, error.status, started, code=error.code)
            return error_response(error)

    async def _read_body(self, request: Request) -> bytes:
        """The body, if it is JSON by its content type and within `max_body_bytes` (declared or read)."""
        limit = self._options.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise errors.body_too_large(limit)
        if request.headers.get("content-type", "").partition(";")[0].strip().lower() != "application/json":
            raise errors.unsupported_media_type()
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise errors.body_too_large(limit)
            chunks.append(chunk)
        return b"".join(chunks)

    async def _forward(self, job: _Job) -> Response:
        request = job.request
        salt = self._salts.salt(job.tenant, request.model, job.epoch)
        if salt is None:  # settings refuse a tenant with keys but no secret; kept for safety
            raise ApiError(500, "The tenant has no cache namespace configured.", type=SERVER, code="no_salt")
        key = job.chain.ids[min(self._routing.depth, len(job.chain.ids) - 1)]
        candidates = self._router.route(request.model, key, self._wall())
        if not candidates:
            raise errors.no_ready_replica(request.model)
        body = upstream_body(request, salt, self._options.priority)
        for index, replica in enumerate(candidates):
            self._acquire(replica)
            try:
                upstream = await self._send(replica, request.kind, body)
            except UpstreamUnreachable:
                self._release(replica)
                self._eject(replica, "connect")
                self._metrics.failovers.labels(replica.name).inc()
                continue
            except BaseException:
                self._release(replica)
                raise
            if upstream.resent:
                self._metrics.resends.labels(replica.name).inc()
            route = "ring" if index == 0 else "failover"
            if request.stream and upstream.status == 200:
                return self._relay(job, replica, route, upstream)
            return await self._answer(job, replica, route, upstream)
        raise errors.upstream_failed(f"none of the {len(candidates)} replicas tried accepted a connection")

    async def _send(self, replica: Replica, kind: Kind, body: bytes) -> UpstreamResponse:
        try:
            return await self._client.post(replica.url + PATHS[kind], body)
        except UpstreamTimeout:
            raise errors.upstream_timeout() from None
        except UpstreamBroken as exc:
            self._eject(replica, "protocol")
            raise errors.upstream_failed(str(exc)) from None

    async def _answer(self, job: _Job, replica: Replica, route: str, upstream: UpstreamResponse) -> Response:
        """A complete (non-streamed) answer, or any error status, passed through as it came."""
        request = job.request
        try:
            content = await upstream.read()
        except UpstreamTimeout:
            raise errors.upstream_timeout() from None
        except UpstreamBroken as exc:
            self._eject(replica, "protocol")
            raise errors.upstream_failed(f"its answer broke off ({exc})") from None
        finally:
            await upstream.close()
            self._release(replica)
        status = upstream.status

        def settle() -> None:
            if status == 200:
                self._observe(job, replica, route, _usage_of(content), None)
            if job.cache is not None and self._results is not None:
                if status == 200:
                    self._results.keep(job.cache, content)
                else:
                    self._results.abandon(job.cache)
            self._finish(job.tenant, request.model, request.kind, status, job.started, code=str(status))

        headers = {REPLICA_HEADER: replica.name}
        if status == 200 and job.cache is not None:
            headers[CACHE_HEADER] = "miss"
        return SettledResponse(content, status, headers, upstream.content_type, settle=settle)

    def _from_cache(self, request: ClientRequest, tenant: str, started: float, hit: Hit) -> Response:
        self._finish(tenant, request.model, request.kind, 200, started, code="200")
        return Response(hit.answer, headers={CACHE_HEADER: hit.tier}, media_type="application/json")

    def _relay(self, job: _Job, replica: Replica, route: str, upstream: UpstreamResponse) -> Response:
        request = job.request

        def on_end(outcome: Outcome, ttft: float | None) -> None:
            self._release(replica)
            status = {"complete": 200, "broken": 502, "abandoned": 499}[outcome]
            self._finish(job.tenant, request.model, request.kind, status, job.started, code=outcome)
            if ttft is not None:
                self._metrics.pair(job.tenant, request.model).ttft.observe(ttft)
            if outcome == "broken":
                self._eject(replica, "mid_stream")
            elif outcome == "complete":
                self._observe(job, replica, route, relay.usage, ttft)
            if relay.fingerprint is not None:
                if len(self._fingerprints) >= _MAX_FINGERPRINTS and replica.name not in self._fingerprints:
                    self._fingerprints.clear()  # replicas come and go: names of long-gone ones are dropped
                self._fingerprints[replica.name] = relay.fingerprint

        relay = SseRelay(
            strip_usage_chunk=not request.wants_usage, fingerprint=self._fingerprints.get(replica.name)
        )
        return RelayedStream(
            upstream,
            relay,
            started=job.started,
            monotonic=self._monotonic,
            on_end=on_end,
            headers={REPLICA_HEADER: replica.name},
        )

    def _observe(
        self, job: _Job, replica: Replica, route: str, usage: dict[str, Any] | None, ttft: float | None
    ) -> None:
        self._observer.served(
            Served(
                job.request,
                job.chain,
                job.tenant,
                job.epoch,
                replica.name,
                replica.revision,
                route,
                usage,
                ttft,
            )
        )

    def _acquire(self, replica: Replica) -> None:
        self._metrics.in_flight_of(replica.name).set(self._router.acquire(replica))

    def _release(self, replica: Replica) -> None:
        self._metrics.in_flight_of(replica.name).set(self._router.release(replica))

    def _eject(self, replica: Replica, reason: str) -> None:
        self._router.membership.eject(replica.name, self._wall() + self._routing.eject_s)
        self._metrics.ejections.labels(replica.name, reason).inc()

    def _finish(self, tenant: str, model: str, kind: Kind, status: int, started: float, *, code: str) -> None:
        pair = self._metrics.pair(tenant, model)
        pair.requests(kind, status).inc()
        pair.latency.observe(self._monotonic() - started)
        if status >= 400:
            pair.errors(code).inc()


class SettledResponse(Response):
    """A whole answer that calls `settle()` once it was handed to the server, or failed to be: the
    request's event and metrics cost the client nothing."""

    def __init__(
        self,
        content: bytes,
        status: int,
        headers: dict[str, str],
        media_type: str | None,
        *,
        settle: Callable[[], None],
    ) -> None:
        super().__init__(content, status_code=status, headers=headers, media_type=media_type)
        self._settle = settle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._settle()


def error_response(error: ApiError) -> Response:
    return Response(
        error.body(), status_code=error.status, headers=error.headers, media_type="application/json"
    )


def _usage_of(content: bytes) -> dict[str, Any] | None:
    try:
        body = _decoder.decode(content)
    except msgspec.DecodeError:
        return None
    usage = body.get("usage") if isinstance(body, dict) else None
    return usage if isinstance(usage, dict) else None
