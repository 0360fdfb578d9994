"""routing.inferencePool through the real operator: a cluster without the Inference Extension's
CRD still gets the vLLM Deployment and a Degraded condition naming what is missing; once the CRD
is there, the next re-check creates the InferencePool and clears the condition."""

from __future__ import annotations

import pytest

from inference_operator import credentials, k8s
from testsupport.cluster import Cluster, wait_for
from testsupport.emulator import declare

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NAMESPACE = "ml"
NAME = "llama"
POOLS = "inference.networking.k8s.io/v1/inferencepools"


def llm_service() -> dict:
    return {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {
            "model": {"uri": "pvc://models/llama", "name": "llama"},
            "runtime": {"engine": "vllm"},
            "resources": {"gpu": {"count": 2}},
            "routing": {"inferencePool": True},
        },
    }


def test_a_missing_inference_pool_crd_degrades_the_service_until_it_is_installed(
    cluster: Cluster, operator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The slow re-check timers, shortened for the test.
    monkeypatch.setattr(credentials, "RECHECK_SECONDS", 1)
    monkeypatch.setattr(k8s, "MISSING_API_RECHECK_SECONDS", 0.5)
    assert cluster.apply_cr(llm_service()).status_code in (200, 201)

    degraded = cluster.wait_condition(NAMESPACE, NAME, "Degraded", "True", "ApiUnavailable")
    assert "InferencePool" in degraded["message"] and "Inference Extension" in degraded["message"]
    assert "set routing.inferencePool: false" in degraded["message"]
    # The service still serves: its Deployment and Service exist.
    deployment = cluster.get("apps/v1/deployments", NAMESPACE, NAME)
    assert deployment is not None
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--tensor-parallel-size=2" in container["args"]
    assert cluster.get("v1/services", NAMESPACE, NAME) is not None

    declare(cluster.emulator, POOLS, "InferencePool")  # the CRD is installed
    pool = wait_for(lambda: cluster.get(POOLS, NAMESPACE, NAME), timeout=30, message="the InferencePool")
    assert pool["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"] == NAME
    assert pool["spec"]["targetPorts"] == [{"number": 8080}]
    cluster.wait_condition(NAMESPACE, NAME, "Degraded", "False")
