"""The chart's ValidatingAdmissionPolicy on a real kube-apiserver: the API server compiles and
runs its CEL (strings library included), refuses `kubectl apply` of a spec outside the pod
policy naming field and value, admits the rest, and binds it to the watched namespaces only.
tests/chart/test_admission_policy.py holds the same CEL to the operator's policy.py.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from tests.chart import helm as h
from tests.chart.conftest import require_helm
from testsupport.envtest import ApiServer
from testsupport.waiting import eventually

pytestmark = [pytest.mark.realapi, pytest.mark.slow, pytest.mark.integration]

CRS = "/apis/inference.rocm.dev/v1alpha1/namespaces/{ns}/inferenceservices"
_releases = itertools.count()


def inference_service(ns: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


def create(client: httpx.Client, obj: dict[str, Any], dry_run: bool = False) -> httpx.Response:
    params = {"dryRun": "All"} if dry_run else {}
    return client.post(CRS.format(ns=obj["metadata"]["namespace"]), json=obj, params=params)


def patch(client: httpx.Client, obj: dict[str, Any], body: dict[str, Any]) -> httpx.Response:
    path = CRS.format(ns=obj["metadata"]["namespace"]) + "/" + obj["metadata"]["name"]
    return client.patch(path, json=body, headers={"Content-Type": "application/merge-patch+json"})


@pytest.fixture
def installed_policy(apiserver: ApiServer) -> Iterator[tuple[str, str, float]]:
    """(watched namespace, unwatched namespace, seconds until enforced) with the chart's policy
    installed for the first only; a violating object created in it before the policy, named `old`."""
    require_helm()
    n = next(_releases)
    stamp = int(time.time() * 1000) % 100000
    watched, unwatched = f"vap{n}-{stamp}", f"vap{n}-{stamp}-other"
    for ns in (watched, unwatched):
        apiserver.kubectl("create", "namespace", ns)
    values = {
        "watch": {"allNamespaces": False, "namespaces": [watched]},
        "replicaCount": 1,
        "ha": {"enabled": False},
        "policy": {
            "serviceAccounts": ["default", "inference"],
            "httpRoute": {"gateways": [f"{watched}/local", "gateways/*"], "hostnames": ["*.ml.example.com"]},
        },
    }
    objects = h.render(values, release=f"vap{n}")
    admission = [o for o in objects if o["apiVersion"] == "admissionregistration.k8s.io/v1"]
    assert sorted(o["kind"] for o in admission) == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    violating = inference_service(watched, "probe", {"model": {"uri": "pvc://m"}, "runtime": {"image": "ubuntu"}})
    with apiserver.client() as client:
        old = inference_service(watched, "old", {"model": {"uri": "pvc://m"}, "runtime": {"image": "ubuntu"}})
        assert create(client, old).status_code == 201
        apiserver.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(admission))
        try:
            start = time.monotonic()
            eventually(
                lambda: create(client, violating, dry_run=True).status_code == 403,
                interval=0.2,
                what="the policy to be enforced (the API server's policy informer)",
            )
            yield watched, unwatched, time.monotonic() - start  # a figure for the log, not a bound
        finally:
            for obj in admission:
                apiserver.kubectl("delete", obj["kind"], obj["metadata"]["name"], "--ignore-not-found")


def test_the_policy_refuses_at_admission_what_the_operator_would_refuse(
    apiserver: ApiServer, installed_policy: tuple[str, str, float]
) -> None:
    ns, other, enforced_after = installed_policy
    print(f"policy enforced after {enforced_after:.1f} s")
    refused = {
        "account": (
            {"model": {"uri": "pvc://m"}, "scheduling": {"serviceAccountName": "cluster-admin"}},
            "scheduling.serviceAccountName 'cluster-admin' is not allowed (allowed: default, inference)",
        ),
        "priority": (
            {"model": {"uri": "pvc://m"}, "scheduling": {"priorityClassName": "system-node-critical"}},
            "scheduling.priorityClassName 'system-node-critical' is not allowed (allowed: none)",
        ),
        "token": (
            {"model": {"uri": "pvc://m"}, "scheduling": {"automountServiceAccountToken": True}},
            "scheduling.automountServiceAccountToken true is not allowed on this cluster",
        ),
        "hub-image": (
            {"model": {"uri": "pvc://m"}, "runtime": {"image": "attacker/steal"}},
            "runtime.image 'attacker/steal' is not from an allowed registry (ghcr.io/rocm-inference/, docker.io/vllm/)",
        ),
        "oci-model": (
            {"model": {"uri": "oci://ubuntu:24.04"}},
            "model.uri 'ubuntu:24.04' is not from an allowed registry (ghcr.io/rocm-inference/, docker.io/vllm/)",
        ),
        "groups": (
            {"model": {"uri": "pvc://m"}, "resources": {"gpu": {"supplementalGroups": [44, 1000]}}},
            "resources.gpu.supplementalGroups 1000 is not allowed (allowed: 1-999; never 0)",
        ),
        # A disaggregated role's own resources, judged as spec.resources is.
        "decode-groups": (
            {
                "model": {"uri": "pvc://m"},
                "runtime": {"engine": "vllm"},
                "routing": {"router": {}},
                "disaggregation": {"decode": {"resources": {"gpu": {"supplementalGroups": [44, 1000]}}}},
            },
            "disaggregation.decode.resources.gpu.supplementalGroups 1000 is not allowed (allowed: 1-999; never 0)",
        ),
        # A parentRef without a namespace is the InferenceService's (CEL reads it as __namespace__).
        "gateway": (
            {"model": {"uri": "pvc://m"}, "routing": {"httpRoute": {"parentRefs": [{"name": "shared"}]}}},
            f"routing.httpRoute.parentRefs '{ns}/shared' is not an allowed Gateway (allowed: {ns}/local, gateways/*)",
        ),
        "every-host": (
            {"model": {"uri": "pvc://m"}, "routing": {"httpRoute": {"parentRefs": [{"name": "local"}]}}},
            "routing.httpRoute.hostnames empty (every host) is not allowed (allowed: *.ml.example.com)",
        ),
        "hostname": (
            {
                "model": {"uri": "pvc://m"},
                "routing": {"httpRoute": {"parentRefs": [{"name": "local"}], "hostnames": ["login.example.com"]}},
            },
            "routing.httpRoute.hostnames 'login.example.com' is not allowed (allowed: *.ml.example.com)",
        ),
    }
    for name, (spec, message) in refused.items():
        document = yaml.safe_dump(inference_service(ns, name, spec))
        result = apiserver.kubectl("apply", "-f", "-", stdin=document, check=False)
        assert result.returncode != 0, name
        assert "Forbidden" in result.stderr and message in result.stderr, result.stderr

    allowed = {
        "partial": {"model": {"uri": "pvc://m"}},
        "account": {"model": {"uri": "pvc://m"}, "scheduling": {"serviceAccountName": "inference"}},
        # Docker Hub shorthand for docker.io/vllm/, a registry of the operator's own images.
        "hub-vllm": {"model": {"uri": "hf://org/name"}, "runtime": {"engine": "vllm", "image": "vllm/vllm:v1"}},
        "oci-model": {"model": {"uri": "oci://ghcr.io/rocm-inference/models/resnet:1"}},
        "groups": {"model": {"uri": "pvc://m"}, "resources": {"gpu": {"supplementalGroups": [44, 992]}}},
        "prefill-groups": {
            "model": {"uri": "pvc://m"},
            "runtime": {"engine": "vllm"},
            "routing": {"router": {}},
            "disaggregation": {"prefill": {"resources": {"gpu": {"supplementalGroups": [44, 992]}}}},
        },
        # Runs the policy's tracing expressions (its regexes, the port taken from the URL).
        "tracing": {
            "model": {"uri": "pvc://m"},
            "runtime": {
                "grpcPort": 8500,
                "tracing": {"endpoint": "http://otel-collector.observability:4318/v1/traces"},
            },
        },
        "route": {
            "model": {"uri": "pvc://m"},
            "routing": {
                "httpRoute": {
                    "parentRefs": [{"name": "local"}, {"name": "inference", "namespace": "gateways"}],
                    "hostnames": ["llm.ml.example.com", "*.team.ml.example.com"],
                }
            },
        },
    }
    for name, spec in allowed.items():
        apiserver.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(inference_service(ns, f"ok-{name}", spec)))

    with apiserver.client() as client:
        # Bound to the watched namespace only.
        outside = inference_service(other, "account", refused["account"][0])
        assert create(client, outside).status_code == 201
        # An object from before the policy: metadata writes (kopf's finalizer and annotations)
        # pass, a spec write is judged, and it can be deleted.
        old = inference_service(ns, "old", {})
        assert patch(client, old, {"metadata": {"finalizers": ["test/keep"], "labels": {"a": "b"}}}).is_success
        response = patch(client, old, {"spec": {"replicas": 2}})
        assert response.status_code == 403
        assert "runtime.image 'ubuntu' is not from an allowed registry" in response.json()["message"]
        assert client.delete(CRS.format(ns=ns) + "/old").is_success
        assert patch(client, old, {"metadata": {"finalizers": None}}).is_success
        assert client.get(CRS.format(ns=ns) + "/old").status_code == 404
