"""Two operator replicas with kopf peering against one emulated cluster: one acts, one waits,
and the waiting one takes over when the active one stops (cleanly or killed)."""

from __future__ import annotations

import pathlib
import signal
import time
from collections.abc import Iterator

import pytest

from tests.ha.operators import Replica, declare_peering, peers
from testsupport.cluster import Cluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PEERING = "rocm-inference-operator"
DEPLOYMENTS = "apps/v1/deployments"
LIFETIME = 6  # seconds; bounds the takeover after a replica is killed


def service(name: str) -> dict:
    return {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "model": {"uri": "pvc://models/resnet50", "format": "onnx"},
            "resources": {"gpu": {"count": 1}, "cpu": "2", "memory": "8Gi"},
        },
    }


@pytest.fixture
def replicas(cluster: Cluster, tmp_path: pathlib.Path) -> Iterator[tuple[Replica, Replica]]:
    """An active replica (priority 200), then a standby (priority 100) once it is up."""
    declare_peering(cluster, PEERING)
    active = Replica("replica-a", 200, tmp_path / "a.log")
    standby = Replica("replica-b", 100, tmp_path / "b.log")
    try:
        active.start(cluster, PEERING, LIFETIME)
        # A replica starts paused until it has seen the peering: then it resumes.
        wait_for(
            lambda: (
                "replica-a" in peers(cluster, PEERING)
                and active.reconciles() >= 0
                and "Resuming operations after the pause" in active.output()
            ),
            timeout=60,
            message="replica-a's keep-alive, metrics and resumption",
        )
        standby.start(cluster, PEERING, LIFETIME)
        wait_for(lambda: "replica-b" in peers(cluster, PEERING), timeout=60, message="replica-b's keep-alive")
        wait_for(
            lambda: "Pausing the watch-stream for inferenceservices" in standby.output(),
            timeout=30,
            message="replica-b's paused watch",
        )
        yield active, standby
    finally:
        active.kill()
        standby.kill()


def _only_active_reconciles(cluster: Cluster, active: Replica, standby: Replica) -> None:
    assert cluster.apply_cr(service("first")).status_code in (200, 201)
    wait_for(lambda: cluster.get(DEPLOYMENTS, "ml", "first"), timeout=30, message="Deployment first")
    wait_for(lambda: active.reconciles() >= 1, timeout=30, message="replica-a's reconcile count")
    # A spec change is handled by the active replica too, still not by the standby.
    assert cluster.patch_cr("ml", "first", {"spec": {"replicas": 2}}).status_code == 200
    wait_for(
        lambda: (cluster.get(DEPLOYMENTS, "ml", "first") or {}).get("spec", {}).get("replicas") == 2,
        timeout=30,
        message="Deployment first scaled to 2",
    )
    wait_for(lambda: active.reconciles() >= 2, timeout=30, message="replica-a's second reconcile")
    assert standby.reconciles() == 0
    assert "reconciled generation" not in standby.output()
    assert "reconciled generation 1" in active.output()


def _standby_creates_second(cluster: Cluster, standby: Replica, since: float, timeout: float, message: str) -> float:
    """Add the service `second` and wait for the standby, resumed, to reconcile it; returns
    the seconds from `since` (the active replica's exit) to its Deployment."""
    assert cluster.apply_cr(service("second")).status_code in (200, 201)
    wait_for(lambda: cluster.get(DEPLOYMENTS, "ml", "second"), timeout=timeout, message=message)
    takeover = time.monotonic() - since
    # The Deployment is written before the handler finishes (status, then the count).
    wait_for(lambda: standby.reconciles() >= 1, timeout=30, message="replica-b's reconcile count")
    assert "Resuming operations after the pause" in standby.output()
    return takeover


def test_only_the_active_replica_reconciles_and_the_standby_takes_over_on_exit(
    cluster: Cluster, replicas: tuple[Replica, Replica]
) -> None:
    active, standby = replicas
    _only_active_reconciles(cluster, active, standby)

    stopped = time.monotonic()
    assert active.stop(signal.SIGTERM) == 0, active.output()[-3000:]
    takeover = _standby_creates_second(cluster, standby, stopped, 30, "Deployment second, created by replica-b")
    print(f"takeover after a clean exit: {takeover:.1f}s")  # noqa: T201  (shown with -s)
    assert "replica-a" not in peers(cluster, PEERING)
    status = wait_for(
        lambda: (cluster.get_cr("ml", "second").get("status") or {}).get("url"), timeout=30, message="status of second"
    )
    assert status == "http://second.ml.svc.cluster.local"


def test_the_standby_takes_over_when_the_active_replica_is_killed(
    cluster: Cluster, replicas: tuple[Replica, Replica]
) -> None:
    active, standby = replicas
    _only_active_reconciles(cluster, active, standby)

    killed = time.monotonic()
    active.kill()  # SIGKILL: no goodbye in the peering; its keep-alive has to expire
    assert "replica-a" in peers(cluster, PEERING)
    takeover = _standby_creates_second(
        cluster,
        standby,
        killed,
        LIFETIME + 30,
        "Deployment second, created by replica-b after replica-a's keep-alive expired",
    )
    print(f"takeover after a kill (keep-alive lifetime {LIFETIME}s): {takeover:.1f}s")  # noqa: T201
