"""Shutdown: nothing of the operator's keeps kopf waiting once the watchers are gone."""

from __future__ import annotations

import asyncio
import logging

from inference_operator.handlers.startup import PAUSE_WAITER_PREFIX, release_abandoned_watch_waiters


async def test_cleanup_cancels_only_abandoned_watch_stream_waiters() -> None:
    forever = asyncio.Event()
    waiters = [
        asyncio.create_task(forever.wait(), name=f"{PAUSE_WAITER_PREFIX}{kind}") for kind in ("deployments", "pdbs")
    ]
    other = asyncio.create_task(forever.wait(), name="worker for something")
    await asyncio.sleep(0)

    await asyncio.wait_for(release_abandoned_watch_waiters(logger=logging.getLogger("test")), 5)

    assert all(task.cancelled() for task in waiters)
    assert not other.done()  # not ours to stop: kopf's own shutdown handles the rest
    other.cancel()
    await asyncio.gather(other, return_exceptions=True)
