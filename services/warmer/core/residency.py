"""Which of a replica's warmed prefixes it still holds, and which to probe to find out. Pure: no I/O.

The warmer knows each verified prefix's blocks (`BlockChain`, from the token ids the engine rendered its
warm request to) and the engine's blocks (`KvIndex`, from its KV events). While the index is complete its
word is final. While it is not (events were lost for good), a prefix it cannot find may still be held:
a probe settles it (re-filling it if it was gone), and stands until the cache is cleared.

Contracts:
- `assess` splits the held keys into held and lost; keys the warmer has no chain for (warmed before
  their token ids were known) are held, as the verified plan said.
- A key verified less than `grace_s` ago that the index cannot find is held: the engine answers a warm
  request and publishes its blocks on two paths, and the answer may come first.
- With an incomplete index, a key the index cannot find is held if a probe confirmed it (or it was
  verified within the grace) and the index has seen none of its blocks removed since, else held but
  `unsettled` (to probe). A probe is the warm request itself, so one that succeeds leaves the prefix held
  whether it hit or not; an eviction seen after it voids its answer. A clear voids every answer.
- `sample` picks, in a stable order that rotates, the keys a periodic reconciliation probes: a probe
  that misses a key the complete index holds shows lost events.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Final

from warmplane.services.warmer.core.kv_index import BlockChain, KvIndex
from warmplane.services.warmer.core.replica import HeldKey
from warmplane.shared.events import PrefixPayload

GRACE_S: Final = 10.0


@dataclass(frozen=True, slots=True)
class Assessment:
    held: frozenset[HeldKey]
    lost: frozenset[HeldKey]
    unsettled: frozenset[HeldKey]
    """Held keys the index cannot find and no probe has settled (only with an incomplete index)."""

    @property
    def complete(self) -> bool:
        return not self.unsettled


@dataclass
class Residency:
    """The warmed prefixes' chains and the probes' answers for one incarnation of one replica."""

    chains: dict[HeldKey, BlockChain] = field(default_factory=dict)
    payloads: dict[HeldKey, PrefixPayload] = field(default_factory=dict)
    """What a probe of each key sends (its warm request)."""
    confirmed: set[HeldKey] = field(default_factory=set)
    """Keys a probe confirmed held since the cache was last cleared."""
    learned_at: dict[HeldKey, float] = field(default_factory=dict)
    """When each key was last verified or probed (its grace starts there)."""
    learned_seq: dict[HeldKey, int] = field(default_factory=dict)
    """The index's last batch when each key was last verified or probed: a removal after it is news."""
    grace_s: float = GRACE_S
    _turn: int = 0

    def learn(
        self,
        chains: Mapping[HeldKey, BlockChain],
        payloads: Mapping[HeldKey, PrefixPayload],
        now: float,
        seq: int,
    ) -> None:
        """Chains and payloads of keys verified at `now`, when the index had applied batch `seq` (a verified
        key is held: an older probe's answer goes: the index is asked first again)."""
        for key, chain in chains.items():
            self.chains[key] = chain
            self.learned_at[key] = now
            self.learned_seq[key] = seq
            self.confirmed.discard(key)
            if key in payloads:
                self.payloads[key] = payloads[key]

    def assess(self, held: Collection[HeldKey], index: KvIndex, now: float) -> Assessment:
        kept: set[HeldKey] = set()
        lost: set[HeldKey] = set()
        unsettled: set[HeldKey] = set()
        for key in held:
            chain = self.chains.get(key)
            if chain is None or index.holds(chain):
                kept.add(key)
                continue
            in_grace = now - self.learned_at[key] < self.grace_s
            if index.complete:
                (kept if in_grace else lost).add(key)
                continue
            kept.add(key)
            answered = key in self.confirmed or in_grace
            if not answered or index.removed_since(chain, self.learned_seq[key]):
                unsettled.add(key)
        return Assessment(frozenset(kept), frozenset(lost), frozenset(unsettled))

    def confirm(self, key: HeldKey, now: float, seq: int) -> None:
        """A probe of `key` succeeded at `now`, when the index had applied batch `seq`: the engine holds it
        (the probe filled it if it was gone), and its blocks are in flight on the event stream (the grace
        starts over)."""
        self.confirmed.add(key)
        if key in self.learned_at:
            self.learned_at[key] = now
            self.learned_seq[key] = seq

    def cleared(self) -> None:
        """The engine's cache was cleared: every probe's answer is void."""
        self.confirmed.clear()

    def forget(self, keys: Collection[HeldKey]) -> None:
        """Keys no longer held (lost): their chains and answers go; a re-warm learns them again."""
        for key in keys:
            self.chains.pop(key, None)
            self.learned_at.pop(key, None)
            self.learned_seq.pop(key, None)
            self.payloads.pop(key, None)
            self.confirmed.discard(key)

    def sample(self, held: Collection[HeldKey], count: int) -> list[HeldKey]:
        """Up to `count` of `held` that have chains, taking the next ones in sorted order each call."""
        known = sorted(key for key in held if key in self.chains)
        if not known or count < 1:
            return []
        start = self._turn % len(known)
        self._turn = start + count
        return [known[(start + offset) % len(known)] for offset in range(min(count, len(known)))]
