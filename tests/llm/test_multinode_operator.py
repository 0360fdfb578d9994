"""resources.gpu.nodes > 1 through the real operator: without the LeaderWorkerSet CRD the service
is Degraded naming what is missing (and runs nothing: a pipeline needs every stage); once the CRD
is there, the next re-check creates the LeaderWorkerSet."""

from __future__ import annotations

import pytest

from inference_operator import credentials, k8s
from testsupport.cluster import Cluster, inference_service, wait_for
from testsupport.emulator import declare

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NAMESPACE = "ml"
NAME = "llama"
LWS = "leaderworkerset.x-k8s.io/v1/leaderworkersets"


def test_a_missing_leader_worker_set_crd_degrades_the_service_until_it_is_installed(
    cluster: Cluster, operator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(credentials, "RECHECK_SECONDS", 1)
    monkeypatch.setattr(k8s, "MISSING_API_RECHECK_SECONDS", 0.5)
    spec = {
        "model": {"uri": "pvc://models/llama-405b", "name": "llama"},
        "runtime": {"engine": "vllm"},
        "resources": {"gpu": {"count": 8, "nodes": 2}},
    }
    service = inference_service(NAME, NAMESPACE, spec)
    assert cluster.apply_cr(service).status_code in (200, 201)
    degraded = cluster.wait_condition(NAMESPACE, NAME, "Degraded", "True", "ApiUnavailable")
    assert "LeaderWorkerSet" in degraded["message"] and "set resources.gpu.nodes: 1" in degraded["message"]
    assert cluster.get("apps/v1/deployments", NAMESPACE, NAME) is None  # no half of a pipeline
    assert cluster.get("v1/services", NAMESPACE, NAME) is not None

    declare(cluster.emulator, LWS, "LeaderWorkerSet", subresources=("status", "scale"))  # the CRD is installed
    lws = wait_for(lambda: cluster.get(LWS, NAMESPACE, NAME), timeout=30, message="the LeaderWorkerSet")
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    cluster.wait_condition(NAMESPACE, NAME, "Degraded", "False")
