"""Spec changes that remove or re-key fields must reach the live objects, as on a real API server.

The emulator keeps field ownership like a real API server (testsupport/apply.py): fields set by
a POST stay owned by the POSTing client's manager, and a later server-side apply by the
operator's manager never removes them; a changed port is a new list-map entry next to the old.
The operator therefore creates and changes every object by server-side apply alone, and takes
over fields other managers own (objects made by earlier versions, hand edits) before applying.
"""

from __future__ import annotations

import pytest

from testsupport.cluster import Cluster, wait_for

pytestmark = pytest.mark.integration

DEPLOYMENTS = "apps/v1/deployments"
SERVICES = "v1/services"


def service(gpus: int, metrics_port: int = 9090) -> dict:
    return {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "resnet", "namespace": "ml"},
        "spec": {
            "model": {"uri": "pvc://models/resnet50"},
            "runtime": {"metricsPort": metrics_port},
            "resources": {"gpu": {"count": gpus}},
        },
    }


def observed(cluster: Cluster, generation: int) -> bool:
    status = (cluster.get_cr("ml", "resnet") or {}).get("status") or {}
    return status.get("observedGeneration") == generation


def test_gpu_count_to_zero_leaves_no_gpu_field(cluster: Cluster, operator) -> None:
    assert cluster.apply_cr(service(gpus=2)).status_code in (200, 201)
    wait_for(lambda: cluster.get(DEPLOYMENTS, "ml", "resnet"), message="Deployment")
    cluster.patch_cr("ml", "resnet", {"spec": {"resources": {"gpu": {"count": 0}}}})
    wait_for(lambda: observed(cluster, 2), message="observedGeneration 2")
    pod = cluster.get(DEPLOYMENTS, "ml", "resnet")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert "amd.com/gpu" not in (container.get("resources") or {}).get("limits", {})
    assert not {"ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"} & {e["name"] for e in container.get("env") or []}
    assert not pod.get("tolerations")


def test_metrics_port_change_applies_cleanly(cluster: Cluster, operator) -> None:
    assert cluster.apply_cr(service(gpus=1, metrics_port=9090)).status_code in (200, 201)
    wait_for(lambda: cluster.get(SERVICES, "ml", "resnet"), message="Service")
    cluster.patch_cr("ml", "resnet", {"spec": {"runtime": {"metricsPort": 9091}}})
    wait_for(lambda: observed(cluster, 2), message="observedGeneration 2")
    ports = cluster.get(DEPLOYMENTS, "ml", "resnet")["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert sorted(p["containerPort"] for p in ports if p.get("name") == "metrics") == [9091]
    service_ports = cluster.get(SERVICES, "ml", "resnet")["spec"]["ports"]
    assert [p["port"] for p in service_ports if p["name"] == "metrics"] == [9091]
