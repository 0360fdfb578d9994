"""API fault injection: the API server misbehaves, the operator converges anyway.

Faults are kmock reactions on the emulated API (409 conflicts, 500s, 429 with Retry-After,
slow responses, watch streams that drop) plus an operator restart in the middle of a
reconcile. After the faults stop, every InferenceService must reach its desired objects and
status, with no duplicate and no lost write, within a bounded time.
"""

from __future__ import annotations

import asyncio

import pytest
from kopf.testing import KopfRunner

from testsupport.cluster import Cluster, captured_operator_logs, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ARGS = ["run", "--all-namespaces", "--standalone", "-m", "inference_operator.handlers"]
DEPLOYMENTS = "apps/v1/deployments"
SERVICES = "v1/services"
NAMES = [f"svc-{i}" for i in range(4)]


def service(name: str, gpus: int = 1, replicas: int = 2) -> dict:
    return {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"model": {"uri": f"pvc://models/{name}"}, "replicas": replicas, "resources": {"gpu": {"count": gpus}}},
    }


def gpus_of(cluster: Cluster, name: str) -> str | None:
    deployment = cluster.get(DEPLOYMENTS, "ml", name)
    if deployment is None:
        return None
    return deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["amd.com/gpu"]


def converged(cluster: Cluster, name: str, gpus: int) -> bool:
    cr = cluster.get_cr("ml", name) or {}
    status = cr.get("status") or {}
    return (
        gpus_of(cluster, name) == str(gpus)
        and cluster.get(SERVICES, "ml", name) is not None
        and cluster.get("policy/v1/poddisruptionbudgets", "ml", name) is not None
        and status.get("observedGeneration") == cr["metadata"]["generation"]
        and status.get("url") == f"http://{name}.ml.svc.cluster.local"
    )


def slow(seconds: float):
    """A reaction that answers late, then lets the emulator answer as usual."""

    async def answer_late() -> None:
        await asyncio.sleep(seconds)
        raise StopAsyncIteration

    return answer_late


def test_fault_storm_converges_without_duplicates(cluster: Cluster) -> None:
    api = cluster.emulator
    # (requests the fault applies to, how many of them fail, then the API behaves; what it is)
    faults = [
        (api["patch /apis/apps/v1/namespaces/ml/deployments/svc-1"], 2, 500, "500 on Deployment apply"),
        (api["patch /api/v1/namespaces/ml/services/svc-2"], 2, 429, "429 + Retry-After on Service apply"),
        (api["patch /apis/apps/v1/namespaces/ml/deployments/svc-0"], 2, 409, "409 on Deployment patch"),
        (
            api["patch", "/apis/inference.rocm.dev/v1alpha1/namespaces/ml/inferenceservices/svc-1/status"],
            2,
            500,
            "500 on status patch",
        ),
        (api["get /apis/apps/v1/namespaces/ml/deployments/svc-2"], 3, slow(1.5), "1.5 s slow read"),
        (api["get /apis/apps/v1/deployments", {"watch": "true"}], 3, b"", "dropped watch stream"),
    ]
    for view, count, fault, _ in faults:
        reaction = view[:count] << fault
        if fault == 429:
            reaction << "Retry-After: 1" << {"message": "slow down"}

    with captured_operator_logs() as logs, KopfRunner(ARGS, timeout=120) as runner:
        for name in NAMES:
            assert cluster.apply_cr(service(name)).status_code in (200, 201)
        wait_for(lambda: all(converged(cluster, n, 1) for n in NAMES), timeout=60, message="convergence under faults")
        for name in NAMES:  # a spec change after the storm is still applied, once
            cluster.patch_cr("ml", name, {"spec": {"resources": {"gpu": {"count": 2}}}})
        wait_for(
            lambda: all(converged(cluster, n, 2) for n in NAMES), timeout=60, message="convergence of the spec change"
        )
    assert runner.exit_code == 0, runner.output

    writes = api.writes
    # One create per object (a failed create that was stored is found, not repeated) …
    assert writes["deployments:create"] == len(NAMES)
    assert writes["services:create"] == len(NAMES)
    assert writes["poddisruptionbudgets:create"] == len(NAMES)
    # … and every Deployment got exactly one successful GPU change.
    for name in NAMES:
        history = [v for v in api.objects[DEPLOYMENTS, "ml", name].history if v is not None]
        gpu_counts = [
            v["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["amd.com/gpu"]
            for v in history
            if "spec" in v
        ]
        assert gpu_counts.count("2") >= 1 and gpu_counts[-1] == "2"
    assert logs.count("Handler 'reconcile_service' failed permanently") == 0
    retried = logs.count("failed temporarily") + logs.count("failed with an exception")
    assert retried >= 4, "the faults were not even noticed"
    for view, count, _, what in faults:
        # kmock stores a write even when a reaction answers it with an error (a write that
        # "failed" after landing), so a retry may find it done: each fault fires at least once.
        # A dropped watch stream is re-opened each time: it must have been re-opened past them all.
        minimum = count + 1 if what == "dropped watch stream" else 1
        assert len(view) >= minimum, f"{what}: {len(view)} requests"
    injected = sum(count for _, count, _, _ in faults)
    print(f"faults injected: {injected}; handler retries: {retried}")


def test_operator_restart_mid_reconcile_converges(cluster: Cluster) -> None:
    # The Deployment's creating apply hangs for 3 s (request 0: a new service's set has no dry
    # run, reconcile.create_all): the operator is stopped inside that reconcile.
    cluster.emulator["patch /apis/apps/v1/namespaces/ml/deployments/restart"][0:1] << slow(3)
    with KopfRunner(ARGS, timeout=60) as first:
        cluster.apply_cr(service("restart"))
        wait_for(lambda: cluster.emulator.writes["deployments:create"] >= 1, message="create in flight")
    assert first.exit_code == 0, first.output

    with KopfRunner(ARGS, timeout=60) as second:
        wait_for(lambda: converged(cluster, "restart", 1), timeout=30, message="convergence after restart")
    assert second.exit_code == 0, second.output
    assert cluster.emulator.writes["deployments:create"] == 1
    assert cluster.emulator.writes["services:create"] == 1
