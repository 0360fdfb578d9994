"""kopf peering with each peer's liveness judged by this replica's own clock, not the peer's.

kopf's peering (1.45) takes a peer for dead once its keep-alive's `lastseen`, a timestamp the
peer wrote with its own clock, plus its lifetime is past this replica's wall clock. Between two
nodes whose clocks disagree by more than the slack between keep-alives (lifetime minus the
renewal interval, 5 to 10 s), that goes wrong both ways: a standby whose clock is ahead sees the
leader's fresh keep-alives as expired, resumes, and two replicas reconcile at once (it also
deletes the leader's record, again and again); a standby whose clock is behind sees a killed
leader as alive for the skew on top of the lifetime.

Here, as client-go's leader election does, a keep-alive is valid for its lifetime from the moment
this replica first saw it (a new `lastseen` value), measured on this process's monotonic clock:
the peers' wall clocks are never compared, so no offset between them, and no step of one, matters.
What is assumed is only that clocks run at the same rate (NTP slews at most 500 ppm) and that a
replica sees its peers' keep-alives through its watch.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Callable
from typing import Any

#: A sighting older than this is forgotten (a peer gone for good); its record, if still there,
#: was removed as dead long before by every replica's cleanup.
FORGET_AFTER_S = 3600.0


@dataclasses.dataclass
class Sighting:
    token: str
    at: float


class Sightings:
    """When this replica first saw each peer's current keep-alive, by the clock it is given."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._seen: dict[str, Sighting] = {}

    def remaining(self, identity: str, lastseen: str | None, lifetime: float) -> float:
        """Seconds the keep-alive `lastseen` of `identity` stays valid: its lifetime from the first
        time this replica saw that value. A lifetime of 0 (a peer's goodbye) is expired now; no
        `lastseen` is a record being written now (this replica's own), valid for its lifetime."""
        now = self._clock()
        if lifetime <= 0:
            self._seen.pop(identity, None)
            return 0.0
        if lastseen is None:
            return lifetime
        seen = self._seen.get(identity)
        if seen is None or seen.token != lastseen:
            seen = self._seen[identity] = Sighting(lastseen, now)
            self._forget(now)
        return lifetime - (now - seen.at)

    def _forget(self, now: float) -> None:
        for identity in [i for i, s in self._seen.items() if now - s.at > FORGET_AFTER_S]:
            del self._seen[identity]


SIGHTINGS = Sightings()


def install() -> None:
    """Make kopf's peering judge its peers by SIGHTINGS. Idempotent.

    kopf builds a `Peer` from every keep-alive it reads, and pauses or resumes by its `is_dead`
    and sleeps until its `deadline`; both are derived here from when the keep-alive was first seen.
    """
    from kopf._core.engines import peering

    if getattr(peering.Peer, "judged_by_sightings", False):
        return

    class SightedPeer(peering.Peer):
        judged_by_sightings = True

        def __init__(self, *, identity: peering.Identity, lastseen: str | None = None, **fields: Any):
            super().__init__(identity=identity, lastseen=lastseen, **fields)
            remaining = SIGHTINGS.remaining(identity, lastseen, self.lifetime.total_seconds())
            # In this replica's wall clock, as kopf compares it.
            self.deadline = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=remaining)
            self.is_dead = remaining <= 0

    peering.Peer = SightedPeer  # type: ignore[misc]
