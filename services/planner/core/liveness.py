"""When a replica that went without a word counts as lost, and when a lost one is back.

A warmer says every heartbeat interval that each replica it drives is alive (`replica.heartbeat`). A
replica whose node is lost sends no drain and no stop; its heartbeats stop. Silence alone proves little:
the broker may be away, or the planner behind. So a replica is judged against the rest of the fleet: it is
lost when it was last heard a timeout before both `now` and the newest heartbeat of any replica. A fleet
that falls silent together is not judged, and neither is a fleet of one.

A replica marked lost whose warmer was only cut off speaks again; `returned` tells when its heartbeat
should put it back in service.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from warmplane.shared.events import ReplicaState


@dataclass(frozen=True, slots=True)
class Heard:
    """A replica as the registry holds it, with the newest moment its warmer was heard (None: never)."""

    replica: str
    node: str
    model: str
    model_revision: str
    endpoint: str
    heard_at: datetime | None


def silent(fleet: Sequence[Heard], now: datetime, timeout_s: float) -> list[Heard]:
    """The replicas of `fleet` (every replica that should be heard) to mark lost (module doc)."""
    heard = [replica.heard_at for replica in fleet if replica.heard_at is not None]
    if not heard:
        return []
    timeout = timedelta(seconds=timeout_s)
    cut = min(max(heard), now) - timeout
    return [replica for replica in fleet if replica.heard_at is not None and replica.heard_at < cut]


def returned(beat_at: datetime, beat_state: ReplicaState, gone_since: datetime) -> bool:
    """Whether a heartbeat sent at `beat_at` in `beat_state` puts back a replica recorded gone since
    `gone_since`: one sent after it was marked gone, by a warmer that still serves it as ready. (A replica
    still warming announces ready itself when it is; a stopped one sends no heartbeats.)"""
    return beat_state == "ready" and beat_at > gone_since
