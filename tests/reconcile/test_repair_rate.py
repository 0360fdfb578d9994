"""Drift repairs are rate-limited per InferenceService, counting only repairs that wrote."""

from __future__ import annotations

import collections
import logging
import time

import kopf
import pytest

from inference_operator.handlers import repair


def _memo() -> kopf.Memo:
    """What `startup.configure` gives the repairs: one record for every object's copy."""
    return kopf.Memo(repair_times=repair.RepairTimes(collections.deque))


async def test_the_fourth_writing_repair_in_a_window_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(repair.asyncio, "sleep", sleep)
    memo, key, logger = _memo(), ("ml", "resnet"), logging.getLogger("test")
    for _ in range(repair.REPAIR_BURST):
        await repair._await_repair_slot(memo, key, logger)
        repair._repair_times(memo, key).append(time.monotonic())
    assert waits == []
    # Looks that found nothing to write (stale events, an HPA scaling) take no slot: still free
    # for another InferenceService, and this one waits out the rest of its window.
    await repair._await_repair_slot(memo, ("ml", "other"), logger)
    assert waits == []
    await repair._await_repair_slot(memo, key, logger)
    assert len(waits) == 1 and 0 < waits[0] <= repair.REPAIR_WINDOW_SECONDS


async def test_slots_free_up_after_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(repair.asyncio, "sleep", sleep)
    memo, key, logger = _memo(), ("ml", "resnet"), logging.getLogger("test")
    old = time.monotonic() - repair.REPAIR_WINDOW_SECONDS - 1
    repair._repair_times(memo, key).extend([old] * repair.REPAIR_BURST)
    await repair._await_repair_slot(memo, key, logger)
    assert waits == [] and not repair._repair_times(memo, key)
