"""resources.gpu.nodes on a real kube-apiserver with a stand-in of the LeaderWorkerSet CRD: the
operator, bound to exactly the chart's rules, creates the LeaderWorkerSet instead of a
Deployment, reads its rollout by groups from the status the LWS controller writes (played here:
no controller runs), scales it by groups, and goes back to a Deployment at nodes: 1."""

from __future__ import annotations

import time

import pytest
import yaml

from tests.reconcile.test_operator_realapi import observed
from tests.tiers import realapi
from tests.tiers.realapi import Operator
from testsupport.cluster import condition, wait_for
from testsupport.envtest import ApiServer

pytestmark = [pytest.mark.realapi, pytest.mark.slow, pytest.mark.integration]
operator = realapi.operator_fixture()  # the tier's operator process, not the emulator's

NAME = "llama"


def get(server: ApiServer, path: str) -> dict | None:
    with server.client() as client:
        response = client.get(path)
    return response.json() if response.status_code == 200 else None


def write_status(server: ApiServer, path: str, status: dict) -> None:
    """What the LWS controller would write."""
    with server.client() as client:
        answer = client.patch(
            path + "/status", json={"status": status}, headers={"Content-Type": "application/merge-patch+json"}
        )
        assert answer.status_code == 200, answer.text


def apply(server: ApiServer, ns: str, nodes: int, replicas: int = 1) -> None:
    doc = {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": NAME, "namespace": ns},
        "spec": {
            "replicas": replicas,
            "model": {"uri": "pvc://models/llama-405b", "name": "llama"},
            "runtime": {"engine": "vllm"},
            "resources": {"gpu": {"count": 8, "nodes": nodes}, "cpu": "4", "memory": "16Gi"},
        },
    }
    server.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(doc))


def test_a_multi_node_service_runs_as_a_leader_worker_set(apiserver: ApiServer, operator: Operator) -> None:
    ns = f"lws-{int(time.time() * 1000) % 100000}"
    apiserver.kubectl("create", "namespace", ns)
    lws_path = f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{ns}/leaderworkersets/{NAME}"
    isvc_path = f"/apis/inference.rocm.dev/v1alpha1/namespaces/{ns}/inferenceservices/{NAME}"
    deployment_path = f"/apis/apps/v1/namespaces/{ns}/deployments/{NAME}"

    apply(apiserver, ns, nodes=2)
    lws = wait_for(lambda: get(apiserver, lws_path), timeout=120, message="LeaderWorkerSet")
    assert get(apiserver, deployment_path) is None
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2 and lws["spec"]["replicas"] == 1
    (leader,) = template["leaderTemplate"]["spec"]["containers"]
    (worker,) = template["workerTemplate"]["spec"]["containers"]
    assert {"--tensor-parallel-size=8", "--pipeline-parallel-size=2", "--node-rank=0"} <= set(leader["args"])
    assert {"--node-rank=$(LWS_WORKER_INDEX)", "--headless"} <= set(worker["args"])
    service = get(apiserver, f"/api/v1/namespaces/{ns}/services/{NAME}")
    assert service is not None and service["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    waiting = wait_for(lambda: condition(get(apiserver, isvc_path), "Ready"), timeout=60, message="Ready condition")
    assert waiting["status"] == "False", waiting

    # The LWS controller's status: one group, ready, on the current template.
    status = {
        "observedGeneration": lws["metadata"]["generation"],
        "replicas": 1,
        "readyReplicas": 1,
        "updatedReplicas": 1,
        "hpaPodSelector": f"leaderworkerset.sigs.k8s.io/name={NAME},leaderworkerset.sigs.k8s.io/worker-index=0",
        "conditions": [
            {
                "type": "Available",
                "status": "True",
                "reason": "AllGroupsReady",
                "message": "All replicas are ready",
                "lastTransitionTime": "2026-12-04T00:00:00Z",
            }
        ],
    }
    write_status(apiserver, lws_path, status)
    ready = wait_for(
        lambda: (c := condition(get(apiserver, isvc_path), "Ready")) and c["status"] == "True" and c,
        timeout=60,
        message="Ready from the LeaderWorkerSet's status",
    )
    assert ready["reason"]

    # Scaled by groups, through the InferenceService's scale subresource.
    apiserver.kubectl("scale", "inferenceservice", NAME, "-n", ns, "--replicas=2")
    scaled = wait_for(
        lambda: (lws := get(apiserver, lws_path)) and lws["spec"]["replicas"] == 2 and lws, timeout=60, message="2"
    )
    # The controller answers once the operator's reconcile of the scale is done (an event that
    # comes during it is news the reconcile's own status then outdates, until the next one).
    wait_for(lambda: observed(apiserver, ns, NAME), timeout=60, message="the scale reconciled")
    write_status(
        apiserver,
        lws_path,
        {**status, "observedGeneration": scaled["metadata"]["generation"], "replicas": 2, "updatedReplicas": 2},
    )
    progressing = wait_for(
        lambda: (c := condition(get(apiserver, isvc_path), "Progressing")) and "groups" in c["message"] and c,
        timeout=60,
        message="progressing by groups",
    )
    assert progressing["message"] == "1 of 2 groups are ready", progressing
    assert condition(get(apiserver, isvc_path), "Ready")["message"] == "1/2 replicas ready"

    # Back to one node: a Deployment again, the LeaderWorkerSet gone.
    apply(apiserver, ns, nodes=1, replicas=2)
    wait_for(lambda: get(apiserver, deployment_path), timeout=120, message="Deployment")
    wait_for(lambda: get(apiserver, lws_path) is None, timeout=120, message="LeaderWorkerSet removed")
