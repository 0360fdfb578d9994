"""The requests the activator holds for services at zero: one `Gate` per routed service, and
`HeldRequests`, the pools they are held in under the limits (a service's, from its slice; the
activator's, from its flags) and how a full pool is shared.

A full pool is not first come, first kept: it makes room for a newcomer by letting go of the
newest request of whoever holds the most of it (routes.fair_victim), if that is more than the
newcomer would. In a service's pool the holders are its clients' addresses; in the activator's,
the namespaces (and of the namespace chosen, its client holding the most). So one tenant alone
may use every slot, and once another comes each keeps its fair share: a flood on two services
of one namespace cannot refuse another namespace's first request. The request let go is
answered 429 with Retry-After, as it would have been had it come last.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from .metrics import ActivatorMetrics
from .routes import Load, Route, fair_victim, hold_refusal, over_caps

#: While requests still wait, the service is woken again this often.
REWAKE_S = 30.0


@dataclass(eq=False)
class Held:
    """One request waiting for its service: released with the upstream to use and the event
    the request before it sets when this one may go (so they arrive in order), or with None
    when it gives its place back to a fairer claim (`HeldRequests.make_room`)."""

    size: int
    arrived: float
    released: asyncio.Future[tuple[str, asyncio.Event | None] | None]
    client: str = ""
    next_may_go: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True)
class Released:
    """A held request on its way: the upstream, the event of the request before it (it goes once
    that one has been handed over), and its own, set once it has been."""

    upstream: str
    before: asyncio.Event | None
    next_may_go: asyncio.Event


@dataclass(frozen=True)
class Refusal:
    """A held request not served: its HTTP status (GONE: the client left), why, and its Retry-After."""

    status: int
    message: str
    retry_after: bool | int


@dataclass(eq=False)
class Gate:
    """One routed service: its requests held, its poller, its wakes."""

    route: Route
    held: deque[Held] = field(default_factory=deque)
    held_bytes: int = 0
    clients: dict[str, Load] = field(default_factory=dict)  # what each client address holds here
    poller: asyncio.Task[None] | None = None
    last_wake: float = -REWAKE_S
    wake_wanted: bool = False  # requests were held since the last wake
    ready_until: float = 0.0
    lingering_until: float | None = None

    @property
    def load(self) -> Load:
        return Load(len(self.held), self.held_bytes)


@dataclass
class HeldRequests:
    """Every held request, counted per service, per client of a service, per namespace and in
    all, under the activator's caps (`caps`: requests and body bytes for all services)."""

    caps: Load
    metrics: ActivatorMetrics
    total: Load = Load()
    tenants: dict[str, Load] = field(default_factory=dict)  # what each namespace holds

    def make_room(self, gate: Gate, gates: Iterable[Gate], client: str, size: int) -> tuple[int, str] | None:
        """None once one more request of `client`, of `size` body bytes, may be held for `gate`
        (`gates`: every routed service), room made as the module doc says; else the status and
        message that refuse it."""
        policy = gate.route.policy
        while True:
            refusal = hold_refusal(gate.load, policy, self.total, self.caps, size)
            if refusal is None or refusal[0] != 429:
                return refusal
            measure = over_caps(gate.load, Load(policy.max_held, policy.max_held_bytes), size)
            if measure is not None:
                victim = fair_victim(gate.clients, client, measure, size)
                candidates = [gate]
            else:
                measure = over_caps(self.total, self.caps, size) or "requests"
                tenant = fair_victim(self.tenants, gate.route.key.namespace, measure, size)
                candidates = [each for each in gates if each.route.key.namespace == tenant]
                clients: dict[str, Load] = {}
                for each in candidates:
                    for address, load in each.clients.items():
                        clients[address] = clients.get(address, Load()).add(load.requests, load.body_bytes)
                victim = max(clients, key=lambda c: (getattr(clients[c], measure), c), default=None)
            newest = _newest(candidates, victim) if victim is not None else None
            if newest is None:
                return refusal
            self.give_back(*newest)
            if not newest[1].released.done():
                newest[1].released.set_result(None)

    def take(self, gate: Gate, held: Held) -> None:
        gate.held.append(held)
        self._count(gate, held, 1)
        self.metrics.held.labels(gate.route.key.namespace, gate.route.key.name).inc()

    def give_back(self, gate: Gate, held: Held) -> None:
        """`held` is no longer waiting (released, let go or ended); once."""
        with contextlib.suppress(ValueError):
            gate.held.remove(held)
            self._count(gate, held, -1)
            self.metrics.held.labels(gate.route.key.namespace, gate.route.key.name).dec()

    def release(self, gate: Gate, upstream: str) -> None:
        """Every held request of the gate on its way, in the order they came."""
        before: asyncio.Event | None = None
        while gate.held:
            held = gate.held[0]
            self.give_back(gate, held)
            if not held.released.done():
                held.released.set_result((upstream, before))
                before = held.next_may_go

    def _count(self, gate: Gate, held: Held, sign: int) -> None:
        """`held` counted in (sign 1) or out (-1) of its service's, client's, namespace's and the total load."""
        gate.held_bytes += sign * held.size
        self.total = self.total.add(sign, sign * held.size)
        for loads, owner in ((gate.clients, held.client), (self.tenants, gate.route.key.namespace)):
            load = loads.get(owner, Load()).add(sign, sign * held.size)
            if load.requests:
                loads[owner] = load
            else:
                loads.pop(owner, None)


def _newest(gates: list[Gate], client: str) -> tuple[Gate, Held] | None:
    """The request of `client` that came last to any of `gates`."""
    found: tuple[Gate, Held] | None = None
    for gate in gates:
        for held in reversed(gate.held):
            if held.client == client:
                if found is None or held.arrived >= found[1].arrived:
                    found = (gate, held)
                break
    return found
