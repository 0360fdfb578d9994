"""SIGTERM's course through the server, shared by the process edge (runner.py) and the app.

Readiness turns false at once (`draining`). When the listener closes (`stopping`), queued
requests run at once instead of waiting for a batch to fill, and the queues get what is left
of the drain timeout. Signals arrive in a signal handler or a timer thread, so the event the
app awaits is set through the app's own loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable


class Shutdown:
    """One server's shutdown state: set from any thread, awaited by the app."""

    def __init__(self, drain_timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.drain_timeout_s = drain_timeout_s
        self.draining = False
        self._clock = clock
        self._stopping_at: float | None = None
        self._stopping = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def stopping(self) -> bool:
        return self._stopping_at is not None

    def drain(self) -> None:
        """SIGTERM received: not ready any more, still serving."""
        self.draining = True

    def stop(self) -> None:
        """The listener is closing: run queued requests now. Idempotent, any thread."""
        self.draining = True
        if self._stopping_at is None:
            self._stopping_at = self._clock()
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is waiting
                loop.call_soon_threadsafe(self._stopping.set)

    async def wait_stopping(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self.stopping:  # stop() ran before the loop was known
            return
        await self._stopping.wait()

    def drain_budget(self) -> float:
        """What is left of the drain timeout for the queues once the listener has closed."""
        if self._stopping_at is None:
            return self.drain_timeout_s
        return max(0.5, self.drain_timeout_s - (self._clock() - self._stopping_at))
