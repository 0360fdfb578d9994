"""The bounds of a gRPC port (the Open Inference Protocol's, on the model server and on the
activator alike): how many calls are in progress at once (`CallTable`: at the limit, the call
waiting longest for its message is ended for a newcomer, never a probe), and the memory of
messages being received (`MessageBudget`: a call asks for its message only with the largest one
reserved, so gRPC's core never holds more than the budget), and the sizes that pin gRPC's own
buffers to those bounds."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from .budgets import MemoryBudget
from .errors import Busy

SERVICE = "inference.GRPCInferenceService"
#: HTTP/2 streams one connection may have open at once (the common default of HTTP/2 servers).
MAX_STREAMS_PER_CONNECTION = 100
#: gRPC connections per call slot (max_connections calls): gRPC refuses connections beyond its
#: limit, where the HTTP port closes its idlest connection instead, so the limit must leave room
#: for the idle connections of clients that hold channels open (2,000 idle ones took 26-38 MiB).
CONNECTIONS_PER_CALL_SLOT = 4
#: Calls to the probe methods admitted beyond the call limit.
PROBE_SLOTS = 16
PROBES = frozenset({"ServerLive", "ServerReady", "ModelReady"})
#: grpc's message sizes are C ints.
MAX_MESSAGE_BYTES = (1 << 31) - 1
#: Bytes gRPC's core reads ahead on a stream whose call has not asked for its message (its default,
#: pinned: with BDP probing off it stays there; on, the windows grew until 100 calls of 19 MiB
#: with 2 asking at once still took 1.2 GiB).
LOOKAHEAD_BYTES = 64 * 1024
#: ModelReady calls receiving their message at once, beside the message budget (it is a name).
PROBE_RECEIVERS = 4


class Refused(Exception):
    """No slot for a new call: every call in progress has its message and is being served."""


@dataclass(eq=False)
class Call:
    """One call in progress: its task (to end it) and whether its message has arrived."""

    task: asyncio.Task[Any] | None
    waiting: bool = True
    evicted: bool = False
    probe: bool = False


@dataclass
class CallTable:
    """The calls in progress, at most `limit` (+ `probe_slots` for probes). At the limit, a new
    call ends the one that has waited longest for its message (never a probe: a flood of calls
    whose message does not come would end the kubelet's); with none waiting it is refused."""

    limit: int
    probe_slots: int = PROBE_SLOTS
    calls: dict[Call, None] = field(default_factory=dict)  # in arrival order

    def enter(self, probe: bool) -> Call:
        if len(self.calls) >= self.limit:
            oldest = next((call for call in self.calls if call.waiting and not call.probe), None)
            if oldest is not None:
                self.evict(oldest)
            elif not probe or len(self.calls) >= self.limit + self.probe_slots:
                raise Refused(f"the server is at its limit of {self.limit} calls in progress; retry shortly")
        call = Call(asyncio.current_task(), probe=probe)
        self.calls[call] = None
        return call

    def evict(self, call: Call) -> None:
        self.calls.pop(call, None)
        call.evicted = True
        if call.task is not None:
            call.task.cancel()

    def leave(self, call: Call) -> None:
        self.calls.pop(call, None)


class Reservation:
    """Bytes a call holds of the message budget."""

    def __init__(self, budget: MemoryBudget, held: int) -> None:
        self.budget = budget
        self.held = held

    def keep(self, size: int) -> None:
        """Hold only `size` (at most what is held); the rest goes back."""
        kept = max(0, min(size, self.held))
        self.budget.release(self.held - kept)
        self.held = kept

    def become(self, size: int) -> bool:
        """Hold exactly `size`: what is held beyond it goes back, and more is taken only if it is
        free now (what it counts is already in memory: waiting would only hold it longer)."""
        if size <= self.held:
            self.keep(size)
            return True
        if not self.budget.take_now(size - self.held):
            return False
        self.held = size
        return True

    def release(self) -> None:
        self.keep(0)


class MessageBudget:
    """Memory for messages being received: each call reserves the largest message before it asks
    for its own, first come first served, and is refused after `wait_s` without one."""

    def __init__(self, total: int, message_limit: int, wait_s: float) -> None:
        self.memory = MemoryBudget(max(total, message_limit))
        self.message_limit = message_limit
        self.wait_s = wait_s
        self.waiting = 0

    async def reserve(self) -> Reservation:
        self.waiting += 1
        try:
            await self.memory.acquire(self.message_limit, self.wait_s)
        except Busy:
            raise Refused(
                f"the server is receiving other messages up to its budget of {self.memory.total >> 20} MiB "
                f"(each call reserves the largest message, {self.message_limit >> 20} MiB, until its own has "
                "come); retry shortly"
            ) from None
        finally:
            self.waiting -= 1
        return Reservation(self.memory, self.message_limit)
