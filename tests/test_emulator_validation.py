"""The emulated API server refuses (422) what a real one refuses: names, labels, duplicate
ports, and InferenceServices the CRD's schema or CEL rules reject."""

from __future__ import annotations

import pytest

from testsupport.cluster import Cluster

SERVICES = "/api/v1/namespaces/ml/services"
DEPLOYMENTS = "/apis/apps/v1/namespaces/ml/deployments"


def service(name: str, ports: list[dict] | None = None, labels: dict | None = None) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "ml", "labels": labels or {}},
        "spec": {"selector": {"app": "x"}, "ports": ports or [{"name": "http", "port": 80, "targetPort": 8080}]},
    }


def configmap_like_deployment(name: str) -> dict:
    labels = {"app": "x"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
        },
    }


def post(cluster: Cluster, path: str, obj: dict):
    return cluster.request("POST", path, obj, content_type="application/json")


@pytest.mark.parametrize("name", ["1model", "a.b", "x" * 64, "Upper", "ends-"])
def test_service_names_must_be_dns_1035_labels(cluster: Cluster, name: str) -> None:
    response = post(cluster, SERVICES, service(name))
    assert response.status_code == 422, response.text
    assert "metadata.name: Invalid value" in response.json()["message"]
    assert cluster.get("v1/services", "ml", name) is None


def test_a_deployment_may_use_a_dns_1123_subdomain_a_service_may_not(cluster: Cluster) -> None:
    assert post(cluster, DEPLOYMENTS, configmap_like_deployment("1model.v2")).status_code == 200
    assert post(cluster, DEPLOYMENTS, configmap_like_deployment("x" * 254)).status_code == 422
    assert post(cluster, DEPLOYMENTS, configmap_like_deployment("Model")).status_code == 422
    assert post(cluster, SERVICES, service("model-v2")).status_code == 200


def test_label_values_are_checked(cluster: Cluster) -> None:
    response = post(cluster, SERVICES, service("ok", labels={"app.kubernetes.io/instance": "y" * 64}))
    assert response.status_code == 422
    assert "must be no more than 63 characters" in response.json()["message"]
    assert post(cluster, SERVICES, service("ok", labels={"app": "a.b_c-1"})).status_code == 200


def test_duplicate_service_port_names_are_refused(cluster: Cluster) -> None:
    ports = [{"name": "metrics", "port": 80}, {"name": "metrics", "port": 81}]
    response = post(cluster, SERVICES, service("svc", ports))
    assert response.status_code == 422
    assert 'spec.ports[1].name: Duplicate value: "metrics"' in response.json()["message"]
    unnamed = [{"port": 80}, {"port": 81}]
    assert post(cluster, SERVICES, service("svc", unnamed)).status_code == 422


def inference_service(**spec: object) -> dict:
    return {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "resnet", "namespace": "ml"},
        "spec": {"model": {"uri": "pvc://models/resnet50"}, **spec},
    }


def test_cel_rules_of_the_crd_refuse_a_custom_resource(cluster: Cluster) -> None:
    bad = inference_service(autoscaling={"minReplicas": 5, "maxReplicas": 2, "target": 50})
    response = cluster.apply_cr(bad)
    assert response.status_code == 422
    assert "minReplicas" in response.json()["message"]
    assert cluster.get_cr("ml", "resnet") is None


def test_a_patch_breaking_a_cel_rule_is_refused_and_defaults_are_stored(cluster: Cluster) -> None:
    assert cluster.apply_cr(inference_service()).status_code == 200
    stored = cluster.get_cr("ml", "resnet")
    assert stored["spec"]["runtime"]["port"]  # the schema's default, filled by the API server
    response = cluster.patch_cr("ml", "resnet", {"spec": {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}})
    assert response.status_code == 422
    assert "autoscaling" not in cluster.get_cr("ml", "resnet")["spec"]


def test_services_take_cluster_ips_from_a_range_that_can_be_full(cluster: Cluster) -> None:
    cluster.emulator.service_ip_range = 2
    headless = service("headless")
    headless["spec"]["clusterIP"] = "None"
    assert post(cluster, SERVICES, headless).status_code == 200  # takes no address
    for name in ("a", "b"):
        assert post(cluster, SERVICES, service(name)).status_code == 200
    full = post(cluster, SERVICES + "?dryRun=All", service("c"))  # a dry run is refused alike
    assert full.status_code == 500 and 'serviceIP for Service "c": range is full' in full.json()["message"]
    assert post(cluster, SERVICES, service("c")).status_code == 500
    assert cluster.get("v1/services", "ml", "c") is None
    assert cluster.request("DELETE", f"{SERVICES}/a").status_code == 200  # frees its address
    assert post(cluster, SERVICES + "?dryRun=All", service("c")).status_code == 200  # reserves nothing
    assert post(cluster, SERVICES, service("c")).status_code == 200
    assert post(cluster, SERVICES, service("d")).status_code == 500
