"""What a soak sends: request events from a fleet's worth of serving nodes (an emitter, at a set rate),
chats through the gateway, the status page's reads of the API, and epoch bumps through the API (each one a
plan and a warm). Loops are bounded by `until` (a monotonic deadline) and tally what they did."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from bench.soak_fleet import TENANTS, SoakFleet
from warmplane.shared.emitter import Emitter
from warmplane.shared.event_ids import new_event_id
from warmplane.shared.events import ModelRef, PrefixPayload, RequestObserved
from warmplane.shared.settings import EmitterSettings
from warmplane.shared.topics import Topics

PRODUCER = "soak-load"
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_TICK_S = 0.1
_HTTP = httpx.Timeout(60.0, connect=5.0)
_KEEPALIVE = httpx.Limits(keepalive_expiry=1.0)
"""Shorter than the servers' keep-alive (uvicorn's 5 s): a connection the server is closing as it idles out
is not reused. At the status page's 5 s period, a client keeping connections as long as the server did had a
request cut off now and then (`Server disconnected without sending a response`)."""
NO_ANSWER = 0
"""The status tallied for a request that got no HTTP answer (a transport error)."""


def _words(rng: random.Random, count: int) -> str:
    return " ".join("".join(rng.choices(_LETTERS, k=rng.randint(2, 9))) for _ in range(count)) + "."


@dataclass(frozen=True, slots=True)
class Root:
    tenant: str
    prefix_id: int
    system: str
    conversations: tuple[int, ...]
    """Each conversation's id; its turns are ids derived from it, so the node set is finite."""


def roots(rng: random.Random, per_tenant: int = 8, conversations: int = 40) -> list[Root]:
    """Shared system prompts (about 300 tokens each on the tiny tokenizer), each with its conversations."""
    return [
        Root(
            tenant,
            rng.getrandbits(62),
            _words(rng, 120),
            tuple(rng.getrandbits(62) for _ in range(conversations)),
        )
        for tenant in TENANTS
        for _ in range(per_tenant)
    ]


@dataclass
class Tally:
    """What the load did: request events emitted, and each kind of HTTP call by status (`NO_ANSWER` for
    none)."""

    emitted: int = 0
    chats: Counter[int] = field(default_factory=Counter)
    reads: Counter[int] = field(default_factory=Counter)
    bumps: Counter[int] = field(default_factory=Counter)


class Load:
    """The four loops over one fleet; `run(until)` runs them together."""

    def __init__(self, fleet: SoakFleet, *, event_rate: float, chat_rate: float, bump_every_s: float,
                 read_every_s: float, seed: int = 7) -> None:  # fmt: skip
        self.fleet = fleet
        self.rng = random.Random(seed)
        self.roots = roots(self.rng)
        self.event_rate, self.chat_rate = event_rate, chat_rate
        self.bump_every_s, self.read_every_s = bump_every_s, read_every_s
        self.tally = Tally()
        self.emitter = Emitter(
            fleet.kafka, EmitterSettings(close_timeout_s=30), Topics(fleet.kafka.topic_prefix)
        )
        self._paid: set[int] = set()

    async def run(self, until: float) -> None:
        async with httpx.AsyncClient(timeout=_HTTP, limits=_KEEPALIVE) as http:
            await asyncio.gather(
                self._events(until),
                self._chats(http, until),
                self._reads(http, until),
                self._bumps(http, until),
            )

    def request(self) -> RequestObserved:
        """One request over a root, one of its conversations and up to two turns of it (a chain of two to
        four prefixes); the root's first request carries its system prompt as the payload a warm replays."""
        root = self.rng.choice(self.roots)
        conversation = self.rng.choice(root.conversations)
        chain = [
            root.prefix_id,
            conversation,
            *(conversation ^ turn for turn in range(1, self.rng.randint(1, 4))),
        ]
        payload = None
        if root.prefix_id not in self._paid:
            self._paid.add(root.prefix_id)
            payload = PrefixPayload(
                prefix_id=root.prefix_id, messages=[{"role": "system", "content": root.system}]
            )
        return RequestObserved(
            event_id=new_event_id(), occurred_at=datetime.now(UTC), producer=PRODUCER, tenant=root.tenant,
            model=ModelRef(self.fleet.model), replica="soak-elsewhere", chain=chain,
            chain_tokens=[300 + 100 * i for i in range(len(chain))], prompt_tokens=300 + 100 * len(chain),
            cached_tokens=300 if self.rng.random() < 0.5 else 0, payload=payload,
        )  # fmt: skip

    async def _events(self, until: float) -> None:
        began, due = time.monotonic(), 0.0
        while (now := time.monotonic()) < until:
            due = (now - began) * self.event_rate
            while self.tally.emitted < due:
                self.emitter.emit(self.request())
                self.tally.emitted += 1
            await asyncio.sleep(_TICK_S)  # pacing: the next tick's share comes due meanwhile

    def chat(self) -> tuple[str, dict[str, Any]]:
        """A tenant's key and a greedy chat over one of its system prompts; half are asked again word for
        word (the result cache's share)."""
        root = self.rng.choice(self.roots)
        user = f"question {self.rng.randrange(20)}" if self.rng.random() < 0.5 else _words(self.rng, 20)
        body = {
            "model": self.fleet.model, "max_tokens": 2, "temperature": 0,
            "messages": [{"role": "system", "content": root.system}, {"role": "user", "content": user}],
        }  # fmt: skip
        return self.fleet.credentials.keys[root.tenant], body

    async def _chats(self, http: httpx.AsyncClient, until: float) -> None:
        await _every(1 / self.chat_rate, until, lambda: self._one_chat(http))

    async def _one_chat(self, http: httpx.AsyncClient) -> None:
        key, body = self.chat()
        headers = {"Authorization": f"Bearer {key}"}
        url = f"{self.fleet.gateway_url}/v1/chat/completions"
        self.tally.chats[await _status(http.post(url, json=body, headers=headers))] += 1

    async def _reads(self, http: httpx.AsyncClient, until: float) -> None:
        async def status_page() -> None:
            for path, params in (
                ("/v1/replicas", {}),
                ("/v1/warm-sets", {"model": self.fleet.model}),
                ("/v1/misses/top", {"model": self.fleet.model}),
            ):
                answer = http.get(self.fleet.api_url + path, params=params, headers=self._admin())
                self.tally.reads[await _status(answer)] += 1

        await _every(self.read_every_s, until, status_page)

    async def _bumps(self, http: httpx.AsyncClient, until: float) -> None:
        async def bump() -> None:
            tenant = TENANTS[sum(self.tally.bumps.values()) % len(TENANTS)]
            answer = http.post(
                f"{self.fleet.api_url}/v1/epochs/bump", params={"tenant": tenant, "model": self.fleet.model},
                json={"reason": "soak"}, headers=self._admin(),
            )  # fmt: skip
            self.tally.bumps[await _status(answer)] += 1

        await _every(self.bump_every_s, until, bump, first_after_s=self.bump_every_s)

    def _admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.fleet.credentials.admin_token}"}


async def _status(request: Awaitable[httpx.Response]) -> int:
    """The answer's status code, or `NO_ANSWER` when the request got none: tallied, so a run reports it."""
    try:
        return (await request).status_code
    except httpx.TransportError:
        return NO_ANSWER


async def _every(period_s: float, until: float, action: Any, *, first_after_s: float = 0.0) -> None:
    """`action()` at a fixed period until `until`; a slow one delays the next, never overlaps it."""
    due = time.monotonic() + first_after_s
    while due < until:
        await asyncio.sleep(
            max(0.0, due - time.monotonic())
        )  # pacing to the schedule, not a wait for a state
        await action()
        due += period_s
