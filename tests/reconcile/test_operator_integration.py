"""The real operator process against the emulated cluster: what users see after kubectl apply."""

from __future__ import annotations

import time

import pytest

from testsupport.cluster import DEPLOYMENTS, Cluster, captured_operator_logs, condition, wait_for, wait_quiet

pytestmark = pytest.mark.integration

SERVICES = "v1/services"
PDBS = "policy/v1/poddisruptionbudgets"


def resnet(**spec_overrides) -> dict:
    spec = {
        "model": {"uri": "pvc://models/resnet50", "format": "onnx", "version": "3"},
        "resources": {"gpu": {"count": 2, "productName": "AMD_Instinct_MI300X_OAM"}, "cpu": "8", "memory": "64Gi"},
    }
    spec.update(spec_overrides)
    return {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "resnet", "namespace": "ml"},
        "spec": spec,
    }


def test_apply_creates_deployment_and_service(cluster: Cluster, operator) -> None:
    assert cluster.apply_cr(resnet()).status_code in (200, 201)
    deployment = wait_for(lambda: cluster.get(DEPLOYMENTS, "ml", "resnet"), message="Deployment")
    service = wait_for(lambda: cluster.get(SERVICES, "ml", "resnet"), message="Service")
    cr = cluster.get_cr("ml", "resnet")

    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["amd.com/gpu"] == "2"
    assert {"name": "ROCR_VISIBLE_DEVICES", "value": "0,1"} in container["env"]
    assert deployment["metadata"]["ownerReferences"][0]["uid"] == cr["metadata"]["uid"]
    assert [p["name"] for p in service["spec"]["ports"]] == ["http", "metrics"]
    status = wait_for(
        lambda: (
            (cluster.get_cr("ml", "resnet").get("status") or {}).get("url") and cluster.get_cr("ml", "resnet")["status"]
        ),
        message="status.url",
    )
    assert status["url"] == "http://resnet.ml.svc.cluster.local"
    assert status["observedGeneration"] == 1
    assert condition(cluster.get_cr("ml", "resnet"), "Ready")["status"] == "False"
    # One Normal event per kind of change, on the InferenceService, naming every object.
    events = wait_for(lambda: cluster.events("ml", "resnet"), message="events")
    assert [(e["type"], e["reason"], e["message"]) for e in events] == [
        ("Normal", "Created", "Deployment resnet created, Service resnet created"),
    ]


def test_spec_change_patches_deployment(cluster: Cluster, operator) -> None:
    cluster.apply_cr(resnet())
    wait_for(lambda: cluster.get(DEPLOYMENTS, "ml", "resnet"), message="Deployment")
    before = cluster.emulator.writes["deployments:update"]

    response = cluster.patch_cr("ml", "resnet", {"spec": {"resources": {"gpu": {"count": 4}}, "replicas": 3}})
    assert response.status_code == 200

    def patched() -> dict | None:
        d = cluster.get(DEPLOYMENTS, "ml", "resnet")
        limits = d["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        return d if limits["amd.com/gpu"] == "4" else None

    deployment = wait_for(patched, message="Deployment with 4 GPUs")
    env = {e["name"]: e["value"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["ROCR_VISIBLE_DEVICES"] == "0,1,2,3"
    assert deployment["spec"]["replicas"] == 3
    assert cluster.emulator.writes["deployments:update"] == before + 1
    # Three replicas → a PodDisruptionBudget appears; observedGeneration follows the spec.
    wait_for(lambda: cluster.get(PDBS, "ml", "resnet"), message="PodDisruptionBudget")
    wait_for(
        lambda: cluster.get_cr("ml", "resnet")["status"].get("observedGeneration") == 2, message="observedGeneration 2"
    )


def test_deployment_becoming_ready_makes_service_ready(cluster: Cluster, operator) -> None:
    cluster.apply_cr(resnet(replicas=2))
    wait_for(lambda: cluster.get(DEPLOYMENTS, "ml", "resnet"), message="Deployment")
    cluster.complete_rollout("ml", "resnet", replicas=2)

    ready = wait_for(
        lambda: (c := condition(cluster.get_cr("ml", "resnet"), "Ready")) and c["status"] == "True" and c,
        message="Ready=True",
    )
    assert ready["reason"] == "MinimumReplicasAvailable"
    status = cluster.get_cr("ml", "resnet")["status"]
    assert (status["replicas"], status["readyReplicas"]) == (2, 2)
    assert condition(cluster.get_cr("ml", "resnet"), "Progressing")["status"] == "False"
    assert condition(cluster.get_cr("ml", "resnet"), "Degraded")["status"] == "False"


def test_resync_of_unchanged_service_writes_nothing(cluster: Cluster, tmp_path) -> None:
    from kopf.testing import KopfRunner

    args = ["run", "--all-namespaces", "--standalone", "-m", "inference_operator.handlers"]
    cluster.apply_cr(resnet(replicas=2))
    with captured_operator_logs() as logs, KopfRunner(args, timeout=60) as first:
        wait_for(lambda: cluster.get(PDBS, "ml", "resnet"), message="PodDisruptionBudget")
        wait_for(lambda: logs.count("reconciled generation 1"), message="handled")
        wait_quiet(lambda: dict(cluster.emulator.writes), message="no more writes")
    assert first.exit_code == 0, first.output
    # kopf's diff base is kept in the operator's process, not on the object (handlers/bookkeeping.py).
    annotations = cluster.get_cr("ml", "resnet")["metadata"].get("annotations") or {}
    assert not [key for key in annotations if key.startswith("inference.rocm.dev/")], annotations
    writes_before = dict(cluster.emulator.writes)

    # A restart sees every InferenceService anew: the reconcile runs again, finds every hash
    # equal, and writes nothing at all: no object, no status, no event, no bookkeeping.
    with captured_operator_logs() as logs, KopfRunner(args, timeout=60) as second:
        wait_for(lambda: logs.count("reconciled generation 1: 0 writes"), message="resync")
        wait_quiet(lambda: dict(cluster.emulator.writes), quiet=1.0, message="no more writes")
    assert second.exit_code == 0, second.output
    new_writes = {
        k: v - writes_before.get(k, 0) for k, v in cluster.emulator.writes.items() if v != writes_before.get(k, 0)
    }
    assert new_writes == {}, f"resync wrote: {new_writes}"
    assert "status keys changed: none" in second.output


def test_invalid_spec_is_refused_by_schema(cluster: Cluster, operator) -> None:
    bad = resnet()
    bad["spec"]["resources"]["gpu"]["count"] = -1
    response = cluster.apply_cr(bad)
    assert response.status_code == 422
    assert "spec.resources.gpu.count" in response.json()["message"]


def test_spec_that_slips_past_schema_is_reported_degraded(cluster: Cluster) -> None:
    # minReplicas > maxReplicas is a CEL rule: an object stored before the rule existed (an
    # older CRD; the emulator with crd_validation off) still has it, so the operator must catch
    # it, report it, and not retry in a loop.
    from kopf.testing import KopfRunner

    args = ["run", "--all-namespaces", "--standalone", "-m", "inference_operator.handlers"]
    with captured_operator_logs() as logs, KopfRunner(args, timeout=60) as runner:
        _degrade_then_fix(cluster, logs)
    assert runner.exit_code == 0, runner.output


def _degrade_then_fix(cluster: Cluster, logs) -> None:
    cluster.emulator.crd_validation = False
    cluster.apply_cr(resnet(autoscaling={"minReplicas": 5, "maxReplicas": 2, "target": 50}))
    cluster.emulator.crd_validation = True
    degraded = wait_for(
        lambda: (c := condition(cluster.get_cr("ml", "resnet"), "Degraded")) and c["status"] == "True" and c,
        message="Degraded=True",
    )
    assert degraded["reason"] == "InvalidSpec"
    assert "minReplicas" in degraded["message"]
    assert cluster.get(DEPLOYMENTS, "ml", "resnet") is None
    assert cluster.emulator.writes["deployments:create"] == 0
    time.sleep(2)  # room for a retry storm, if there were one
    assert logs.count("Handler 'reconcile_service' failed permanently") == 1

    # Fixing the spec clears the condition and creates the workload.
    cluster.patch_cr("ml", "resnet", {"spec": {"autoscaling": {"minReplicas": 1}}})
    wait_for(lambda: cluster.get(DEPLOYMENTS, "ml", "resnet"), message="Deployment after fix")
    wait_for(
        lambda: condition(cluster.get_cr("ml", "resnet"), "Degraded")["status"] == "False", message="Degraded=False"
    )


def test_deleted_deployment_is_recreated(cluster: Cluster, operator) -> None:
    cluster.apply_cr(resnet())
    first = wait_for(lambda: cluster.get(DEPLOYMENTS, "ml", "resnet"), message="Deployment")
    response = cluster.request("DELETE", "/apis/apps/v1/namespaces/ml/deployments/resnet")
    assert response.status_code == 200
    second = wait_for(lambda: cluster.get(DEPLOYMENTS, "ml", "resnet"), message="Deployment again")
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    assert cluster.emulator.writes["deployments:create"] == 2


def test_transient_api_error_is_retried(cluster: Cluster, operator) -> None:
    # The first Service creation fails with 500 (stored anyway, as a half-failed write might be);
    # the retry must converge without a duplicate or a Degraded condition.
    cluster.emulator["post /api/v1/namespaces/ml/services"][:1] << 500
    cluster.apply_cr(resnet())
    wait_for(lambda: (cluster.get_cr("ml", "resnet").get("status") or {}).get("url"), message="status after retry")
    assert cluster.get(SERVICES, "ml", "resnet") is not None
    assert condition(cluster.get_cr("ml", "resnet"), "Degraded")["status"] == "False"
    assert cluster.emulator.writes["services:create"] == 1


def test_a_full_service_ip_range_is_reported_and_heals(cluster: Cluster, operator) -> None:
    """The API server answers 500 "range is full" for a Service while its cluster IP range is
    exhausted: the InferenceService says so (Degraded=ApiError, with the server's message), the
    operator keeps retrying, and the Service comes once an address is free."""
    cluster.emulator.service_ip_range = 1
    first, second = resnet(), resnet()
    second["metadata"]["name"] = "bert"
    assert cluster.apply_cr(first).status_code in (200, 201)
    wait_for(lambda: cluster.get(SERVICES, "ml", "resnet"), message="the first Service")
    assert cluster.apply_cr(second).status_code in (200, 201)
    degraded = wait_for(
        lambda: (c := condition(cluster.get_cr("ml", "bert"), "Degraded")) and c["status"] == "True" and c,
        timeout=30,
        message="Degraded=True on the second",
    )
    assert degraded["reason"] == "ApiError" and "range is full" in degraded["message"], degraded
    assert condition(cluster.get_cr("ml", "bert"), "Ready")["reason"] == "ApiError"
    assert cluster.get(SERVICES, "ml", "bert") is None
    # kopf posts events from a queue of its own, after the status write.
    wait_for(
        lambda: any(e["type"] == "Warning" and e["reason"] == "ApiError" for e in cluster.events("ml", "bert")),
        message="an ApiError warning",
    )

    # The first InferenceService goes, and with it (the garbage collector's part) its Service.
    for path in (
        "/apis/inference.rocm.dev/v1alpha1/namespaces/ml/inferenceservices/resnet",
        "/api/v1/namespaces/ml/services/resnet",
    ):
        assert cluster.request("DELETE", path).status_code == 200
    wait_for(lambda: cluster.get(SERVICES, "ml", "bert"), timeout=30, message="the second Service, on a retry")
    healed = wait_for(
        lambda: (c := condition(cluster.get_cr("ml", "bert"), "Degraded")) and c["status"] == "False" and c,
        timeout=30,
        message="Degraded=False",
    )
    assert healed["reason"] == "AsExpected"
