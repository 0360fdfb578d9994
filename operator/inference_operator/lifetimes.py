"""The daemons' lifetime without finalizers: an InferenceService stays deletable with no operator.

kopf puts its finalizer on every object that has a daemon (the autoscaler, the canary analysis,
the adapters status), so that it can stop the daemon before the object goes. Ours have nothing
to do at deletion (status lives in the object, owned objects go with their owner), and a
finalizer outlives `helm uninstall`: `kubectl delete` of the service then hangs and its
namespace stays Terminating. kopf 1.45 has no option for it (`kopf.on.delete(optional=True)`
has no counterpart on `kopf.daemon`), so `release_finalizers` marks the registered daemons as
not needing one; kopf then also removes the finalizer it put on objects before. Without it
kopf does not stop a deleted object's daemons: `Lifetime` does, from the DELETED event.
"""

from __future__ import annotations

import asyncio
import dataclasses

import kopf

GONE_KEY = "gone"


def release_finalizers(registry: kopf.OperatorRegistry | None = None) -> int:
    """Mark every registered daemon and timer as needing no finalizer; how many were marked."""
    spawning = (registry or kopf.get_default_registry())._spawning
    handlers = spawning._handlers
    spawning._handlers = [dataclasses.replace(h, requires_finalizer=False) for h in handlers]
    return len(handlers)


class Lifetime:
    """One daemon's view of its object: gone once a DELETED event for its uid arrived. The
    daemons of one object share one asyncio.Event (in the memo until the object is deleted)."""

    def __init__(self, memo: kopf.Memo, uid: str) -> None:
        self._memo = memo
        self._uid = uid
        events: dict[str, asyncio.Event] = memo.setdefault(GONE_KEY, {})
        self._gone = events.setdefault(uid, asyncio.Event())

    @property
    def gone(self) -> bool:
        return self._gone.is_set()

    def alive(self, stopped: kopf.DaemonStopped) -> bool:
        """Go on: kopf has not stopped the daemon and its object still exists."""
        return not stopped and not self._gone.is_set()

    async def sleep(self, stopped: kopf.DaemonStopped, seconds: float) -> None:
        """Wait `seconds`, or less if kopf stops the daemon or the object is deleted.

        The time limit is ours, not kopf's `stopped.wait(seconds)`: that one ends a task of its
        own with TimeoutError, and when that happens while the operator stops, kopf re-raises it
        as the operator's failure. Waits without a limit end only when set or cancelled."""
        waits = {asyncio.ensure_future(self._gone.wait()), asyncio.ensure_future(stopped.wait())}
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()


def object_deleted(memo: kopf.Memo, uid: str) -> None:
    """A DELETED event: every daemon of that object ends at its next wait."""
    event = (memo.get(GONE_KEY) or {}).pop(uid, None)  # its daemons hold it: one per live object
    if event is not None:
        event.set()
