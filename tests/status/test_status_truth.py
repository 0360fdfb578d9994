"""The real operator against the emulated cluster: status follows the cluster's latest news,
whatever order it arrives in, and says within seconds why a service's pods do not serve."""

from __future__ import annotations

import httpx
import pytest

from testsupport.cluster import DEPLOYMENTS, Cluster, condition, inference_service, wait_for
from testsupport.waiting import eventually_async

pytestmark = pytest.mark.integration

NAME = "race"
ISVC_PATH = f"/apis/inference.rocm.dev/v1alpha1/namespaces/ml/inferenceservices/{NAME}"
PODS = "/api/v1/namespaces/ml/pods"
SPEC = {
    "model": {"uri": "https://models.example/resnet/model.onnx"},
    "resources": {"gpu": {"count": 0}, "cpu": "1", "memory": "1Gi"},
}
# What the Deployment controller writes once it has seen a new Deployment whose pod never
# turns ready: observed, one replica, none available.
SETTLED = {
    "replicas": 1,
    "updatedReplicas": 1,
    "unavailableReplicas": 1,
    "conditions": [
        {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable"},
        {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"},
    ],
}


def test_the_deployments_news_before_the_reconciles_own_write_is_not_lost(cluster: Cluster, operator) -> None:
    """The race, on demand: the Deployment controller's status lands while the reconcile that
    created the Deployment has not yet written the service's status (held in the apply's
    answer), and the operator's look at that news comes before the reconcile's write. With
    no pod ever ready, nothing else would write status again."""
    gets = cluster.emulator[f"get {ISVC_PATH}"]

    async def settle_before_the_reconcile_answers() -> None:
        generation = cluster.get(DEPLOYMENTS, "ml", NAME)["metadata"]["generation"]  # type: ignore[index]
        looked = len(gets)
        async with httpx.AsyncClient() as client:
            response = await client.patch(
                f"{cluster.url}/apis/apps/v1/namespaces/ml/deployments/{NAME}/status",
                json={"status": {"observedGeneration": generation, **SETTLED}},
                headers={"Content-Type": "application/merge-patch+json"},
            )
            response.raise_for_status()
        await eventually_async(lambda: len(gets) > looked, interval=0.02, what="the operator reading the service")
        raise StopAsyncIteration  # then the apply is answered as usual

    # Request 0 is the apply that creates it (a new service's set has no dry run: create_all).
    (
        cluster.emulator[f"patch /apis/apps/v1/namespaces/ml/deployments/{NAME}"][0:1]
        << settle_before_the_reconcile_answers
    )
    assert cluster.apply_cr(inference_service(NAME, "ml", SPEC)).status_code in (200, 201)

    progressing = cluster.wait_condition("ml", NAME, "Progressing", "True", "RolloutInProgress")
    wait_for(
        lambda: (
            (condition(cluster.get_cr("ml", NAME), "Progressing") or {}).get("message")
            == "0 of 1 updated replicas are available"
        ),
        timeout=15,
        message=f"status from the settled Deployment (it says: {progressing.get('message')!r})",
    )
    status = cluster.get_cr("ml", NAME)["status"]  # type: ignore[index]
    assert (status["replicas"], status["updatedReplicas"], status["readyReplicas"]) == (1, 1, 0)


def pod(name: str, init_status: dict, labels: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "labels": labels},
        "spec": {
            "initContainers": [{"name": "model-fetch", "image": "fetcher"}],
            "containers": [{"name": "model-server", "image": "server"}],
        },
        "status": {"phase": "Pending", "initContainerStatuses": [init_status]},
    }


FETCH_FAILED = {
    "name": "model-fetch",
    "ready": False,
    "restartCount": 2,
    "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s restarting failed container"}},
    "lastState": {
        "terminated": {
            "exitCode": 1,
            "reason": "Error",
            "message": "fetch failed (exit 1, source): https://user:pw@models.example/resnet/model.onnx"
            "?X-Amz-Signature=abcdef0123: HTTP 404",
        }
    },
}


def test_a_failing_model_fetch_is_in_status_and_a_warning_within_seconds(cluster: Cluster, operator) -> None:
    assert cluster.apply_cr(inference_service(NAME, "ml", SPEC)).status_code in (200, 201)
    deployment = wait_for(lambda: cluster.get(DEPLOYMENTS, "ml", NAME), message="Deployment")
    cluster.wait_condition("ml", NAME, "Progressing", "True")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    manifest = pod(f"{NAME}-abc", FETCH_FAILED, labels)
    created = cluster.request("POST", PODS, manifest, content_type="application/json")
    assert created.status_code in (200, 201), created.text
    # The kubelet's report (status is its own subresource: a create ignores it).
    reported = cluster.patch("v1/pods", "ml", f"{NAME}-abc", {"status": manifest["status"]}, "status")
    assert reported.status_code == 200, reported.text

    degraded = cluster.wait_condition("ml", NAME, "Degraded", "True", "ModelFetchFailed", timeout=15)
    assert degraded["message"] == (
        f"pod {NAME}-abc: container model-fetch: fetch failed (exit 1, source): "
        "https://models.example/resnet/model.onnx: HTTP 404 (restarted 2 times)"
    )
    ready = condition(cluster.get_cr("ml", NAME), "Ready")
    assert ready is not None and (ready["status"], ready["reason"]) == ("False", "ModelFetchFailed")
    assert ready["message"] == f"0/1 replicas ready: {degraded['message']}"
    warnings = wait_for(
        lambda: [e for e in cluster.events("ml", NAME) if e["type"] == "Warning" and e["reason"] == "ModelFetchFailed"],
        message="a ModelFetchFailed warning",
    )
    assert warnings[0]["message"] == degraded["message"]

    # The fetch succeeds on its next try and the server loads: the problem is gone.
    fetched = {"name": "model-fetch", "ready": True, "restartCount": 3, "state": {"terminated": {"exitCode": 0}}}
    healed = cluster.patch("v1/pods", "ml", f"{NAME}-abc", {"status": {"initContainerStatuses": [fetched]}}, "status")
    assert healed.status_code == 200, healed.text
    cluster.wait_condition("ml", NAME, "Degraded", "False", "AsExpected", timeout=15)
    assert (condition(cluster.get_cr("ml", NAME), "Ready") or {}).get("reason") == "ReplicasNotReady"
