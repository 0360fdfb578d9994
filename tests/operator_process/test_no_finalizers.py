"""A service with a daemon (the autoscaler, a canary, adapters) carries no finalizer: with the
operator gone (`helm uninstall`) it can still be deleted, and with the operator running its
daemons end when it is deleted (lifetimes.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
import pytest
from kopf.testing import KopfRunner

from inference_operator import handlers, lifetimes
from inference_operator.handlers import service, shared
from inference_operator.lifetimes import release_finalizers
from testsupport.cluster import Cluster, captured_operator_logs, inference_service, wait_for

pytestmark = pytest.mark.integration

ARGS = ["run", "--all-namespaces", "--standalone", "--verbose", "-m", "inference_operator.handlers"]
SPEC = {
    "model": {"uri": "pvc://models/resnet50"},
    "resources": {"gpu": {"count": 0}, "cpu": "1", "memory": "1Gi"},
    "autoscaling": {"minReplicas": 1, "maxReplicas": 2, "metric": "rps", "target": 10, "intervalSeconds": 2},
    "rollout": {
        "strategy": "canary",
        "canary": {"steps": [50], "analysis": {"maxLatencyMs": 100, "intervalSeconds": 2}},
    },
}


def test_every_daemon_is_registered_without_a_finalizer() -> None:
    spawning = kopf.get_default_registry()._spawning._handlers
    ids = {h.id for h in spawning}
    assert {"autoscaler", "canary", "adapters"} <= ids, ids
    assert not [h.id for h in spawning if h.requires_finalizer]
    assert handlers.lifetimes is not None and release_finalizers() == len(spawning)


def test_a_service_with_daemons_is_deletable_with_the_operator_gone(cluster: Cluster) -> None:
    with captured_operator_logs() as logs, KopfRunner(ARGS, timeout=60) as runner:
        assert cluster.apply_cr(inference_service("scaled", "ml", SPEC)).status_code in (200, 201)
        wait_for(lambda: (cluster.get_cr("ml", "scaled").get("status") or {}).get("url"), message="reconciled")
        wait_for(lambda: logs.count("Daemon 'autoscaler' is invoked"), message="the autoscaler running")
        assert not cluster.get_cr("ml", "scaled")["metadata"].get("finalizers")  # type: ignore[index]
        # Deleted while the operator runs: its daemons end (kopf would not stop them itself).
        assert cluster.request("DELETE", "/apis/inference.rocm.dev/v1alpha1/namespaces/ml/inferenceservices/scaled")
        wait_for(lambda: cluster.get_cr("ml", "scaled") is None, message="deleted")
        wait_for(lambda: logs.count("Daemon 'autoscaler' succeeded"), timeout=10, message="the autoscaler ended")
        wait_for(lambda: logs.count("Daemon 'canary' succeeded"), timeout=10, message="the canary analysis ended")
        # One more, left behind when the operator stops.
        assert cluster.apply_cr(inference_service("left", "ml", SPEC)).status_code in (200, 201)
        wait_for(lambda: (cluster.get_cr("ml", "left").get("status") or {}).get("url"), message="reconciled")
    assert runner.exception is None, runner.exception
    deleted = cluster.request("DELETE", "/apis/inference.rocm.dev/v1alpha1/namespaces/ml/inferenceservices/left")
    assert deleted.status_code == 200, deleted.text
    assert cluster.get_cr("ml", "left") is None


async def test_a_deleted_service_leaves_no_daemon_waiting_and_no_status_lock() -> None:
    memo = kopf.Memo(status_locks=shared.StatusLocks())
    ref = shared.isvc_ref("ml", "gone")
    gone = shared.status_lock(memo, ref)
    other = shared.status_lock(memo, shared.isvc_ref("ml", "kept"))
    life = lifetimes.Lifetime(memo, "uid-gone")
    body = {"metadata": {"namespace": "ml", "name": "gone", "uid": "uid-gone"}}
    await service.service_deleted(event={"type": "DELETED"}, body=body, memo=memo)
    assert life.gone
    assert len(memo.status_locks) == 1 and shared.status_lock(memo, shared.isvc_ref("ml", "kept")) is other
    assert shared.status_lock(memo, ref) is not gone  # forgotten: a service made again gets a new one


async def test_a_daemon_sleep_leaves_no_failed_task_for_kopf_to_reraise_at_stop() -> None:
    """kopf re-raises the exception of every task that ends while the operator stops: a sleep
    must end its own waits by cancellation only, never by a TimeoutError of a task of its own."""
    from kopf._cogs.aiokits.aioenums import AsyncFlagWaiter, FlagSetter

    loop = asyncio.get_running_loop()
    created: list[asyncio.Task[object]] = []
    previous = loop.get_task_factory()

    def recording(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[object]:
        task: asyncio.Task[object] = asyncio.Task(coro, loop=loop, **kwargs)
        created.append(task)
        return task

    loop.set_task_factory(recording)  # type: ignore[arg-type]
    try:
        stopper: FlagSetter[object] = FlagSetter()
        life = lifetimes.Lifetime(kopf.Memo(), "uid-sleeping")
        await life.sleep(AsyncFlagWaiter(stopper), 0.05)  # type: ignore[arg-type]
        await asyncio.sleep(0.05)  # let the cancelled waits finish
    finally:
        loop.set_task_factory(previous)
    assert created, "the sleep waits in tasks of its own"
    assert all(task.done() for task in created)
    failed = [task for task in created if not task.cancelled() and task.exception() is not None]
    assert not failed, [task.exception() for task in failed]
