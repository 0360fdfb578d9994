"""handlers.daemons.service_daemon: what every daemon of an InferenceService does around its own
work (the autoscaler, the canary analysis, the adapters' status), driven here without kopf's loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import kopf
import pytest
from kopf._cogs.aiokits.aioenums import AsyncFlagWaiter, FlagSetter

from inference_operator import lifetimes
from inference_operator.handlers import daemons
from inference_operator.handlers.daemons import Daemon, Tick, service_daemon
from inference_operator.models import InferenceServiceSpec

UID = "uid-daemon"
GOOD = {"model": {"uri": "pvc://models/m"}, "replicas": 2}
BAD = {"model": {"uri": "ftp://nowhere"}}
LOGGER = "test.service_daemon"


def _daemon(registry: kopf.OperatorRegistry, events: list[Any], on_tick: Any) -> Any:
    @service_daemon("t", when=lambda **_: True, registry=registry)
    @contextlib.asynccontextmanager
    async def work(daemon: Daemon) -> AsyncIterator[Tick]:
        """The test's work."""
        events.append("held")

        async def tick(spec: InferenceServiceSpec) -> float:
            events.append(spec.replicas)
            on_tick(daemon)
            return 0.01

        try:
            yield tick
        finally:
            events.append("released")

    return work


def _run(handler: Any, body: dict[str, Any], memo: kopf.Memo) -> Any:
    stopper: FlagSetter[object] = FlagSetter()
    logger = logging.getLogger(LOGGER)
    return handler(stopped=AsyncFlagWaiter(stopper), body=body, meta=body["metadata"], memo=memo, logger=logger)


async def _until(predicate: Any, timeout: float = 5) -> None:
    """Wait for `predicate()` while the daemon runs on this loop."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_it_is_registered_with_the_operators_daemon_settings() -> None:
    registry = kopf.OperatorRegistry()
    work = _daemon(registry, [], lambda daemon: None)
    (handler,) = registry._spawning.get_all_handlers()
    assert (handler.id, handler.fn) == ("t", work)
    assert (handler.backoff, handler.cancellation_backoff, handler.cancellation_timeout) == (15.0, 5, 10)
    assert work.__doc__ == "The test's work."


async def test_an_invalid_spec_is_read_again_and_what_it_holds_is_released_when_its_object_goes(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    monkeypatch.setattr(daemons, "SPEC_RETRY_SECONDS", 0.01)
    memo = kopf.Memo()
    body: dict[str, Any] = {"metadata": {"namespace": "ml", "name": "m", "uid": UID}, "spec": BAD}
    events: list[Any] = []

    def on_tick(daemon: Daemon) -> None:
        assert daemon.ref.path().endswith("/namespaces/ml/inferenceservices/m")
        if len(events) == 3:  # held, 2, 2: the second tick ends it as a deletion would
            lifetimes.object_deleted(memo, UID)

    handler = _daemon(kopf.OperatorRegistry(), events, on_tick)
    running = asyncio.ensure_future(_run(handler, body, memo))
    await _until(lambda: sum("t idle: spec.model.uri" in r.getMessage() for r in caplog.records) >= 2)
    assert events == ["held"], "no tick on a spec that does not parse, read again and again"
    body["spec"] = GOOD  # kopf updates the body in place: the next read sees the new spec
    await asyncio.wait_for(running, timeout=5)
    assert events == ["held", 2, 2, "released"]


async def test_what_it_holds_is_released_when_a_tick_fails() -> None:
    memo = kopf.Memo()
    body: dict[str, Any] = {"metadata": {"namespace": "ml", "name": "m", "uid": UID}, "spec": GOOD}
    events: list[Any] = []

    def on_tick(daemon: Daemon) -> None:
        raise RuntimeError("tick failed")

    handler = _daemon(kopf.OperatorRegistry(), events, on_tick)
    with pytest.raises(RuntimeError, match="tick failed"):
        await asyncio.wait_for(_run(handler, body, memo), timeout=5)
    assert events == ["held", 2, "released"]
