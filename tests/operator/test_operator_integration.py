"""The real operator process against the emulated cluster: what users see after kubectl apply."""

from __future__ import annotations

import copy

import pytest

from tests.cluster import Cluster, wait_for

pytestmark = pytest.mark.integration

DEPLOYMENTS = "apps/v1/deployments"
SERVICES = "v1/services"
PDBS = "policy/v1/poddisruptionbudgets"


def resnet(**spec_overrides) -> dict:
    spec = {
        "model": {"uri": "pvc://models/resnet50", "format": "onnx", "version": "3"},
        "resources": {"gpu": {"count": 2, "productName": "AMD_Instinct_MI300X_OAM"}, "cpu": "8",
                      "memory": "64Gi"},
    }
    spec.update(spec_overrides)
    return {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "resnet", "namespace": "ml"},
        "spec": spec,
    }


def condition(obj: dict | None, type_: str) -> dict | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return c
    return None


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
    status = wait_for(lambda: (cluster.get_cr("ml", "resnet").get("status") or {}).get("url")
                      and cluster.get_cr("ml", "resnet")["status"], message="status.url")
    assert status["url"] == "http://resnet.ml.svc.cluster.local"
    assert status["observedGeneration"] == 1
    assert condition(cluster.get_cr("ml", "resnet"), "Ready")["status"] == "False"
