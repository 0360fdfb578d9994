"""routing.inferencePool on a real kube-apiserver: the operator, bound to exactly the chart's
rules, creates the InferencePool (a stand-in of its CRD is installed) and the endpoint picker's
ServiceAccount, RoleBinding (allowed by `bind` on the picker's ClusterRole alone), Deployment
and Service; turning the pool off removes them. No kubelet runs here: the picker never starts."""

from __future__ import annotations

import time

import pytest
import yaml

from inference_operator.builders.endpoint_picker import CLUSTER_ROLE
from tests.tiers import realapi
from tests.tiers.realapi import Operator
from testsupport.cluster import condition, wait_for
from testsupport.envtest import OPERATOR_USER, ApiServer

pytestmark = [pytest.mark.realapi, pytest.mark.slow, pytest.mark.integration]
operator = realapi.operator_fixture()  # the tier's operator process, not the emulator's

NAME, PICKER = "llama", "llama-epp"


def get(server: ApiServer, path: str) -> dict | None:
    with server.client() as client:
        response = client.get(path)
    return response.json() if response.status_code == 200 else None


def paths(ns: str) -> dict[str, str]:
    return {
        "InferencePool": f"/apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools/{NAME}",
        "ServiceAccount": f"/api/v1/namespaces/{ns}/serviceaccounts/{PICKER}",
        "RoleBinding": f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings/{PICKER}",
        "Deployment": f"/apis/apps/v1/namespaces/{ns}/deployments/{PICKER}",
        "Service": f"/api/v1/namespaces/{ns}/services/{PICKER}",
    }


def apply(server: ApiServer, ns: str, routing: dict) -> None:
    doc = {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": NAME, "namespace": ns},
        "spec": {
            "model": {"uri": "pvc://models/llama", "name": "llama"},
            "runtime": {"engine": "vllm"},
            "resources": {"gpu": {"count": 2}, "cpu": "4", "memory": "16Gi"},
            "routing": routing,
        },
    }
    server.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(doc))


def reconciled(server: ApiServer, ns: str) -> dict | None:
    obj = get(server, f"/apis/inference.rocm.dev/v1alpha1/namespaces/{ns}/inferenceservices/{NAME}")
    status = (obj or {}).get("status") or {}
    return obj if obj and status.get("observedGeneration") == obj["metadata"]["generation"] else None


def test_the_pool_and_its_endpoint_picker_are_created_and_removed(apiserver: ApiServer, operator: Operator) -> None:
    ns = f"epp-{int(time.time() * 1000) % 100000}"
    apiserver.kubectl("create", "namespace", ns)
    # The operator's user may bind the picker's ClusterRole, yet holds none of its rights (it
    # watches pods too, its services' own, for status: the objectives are the picker's alone).
    can_i = apiserver.kubectl(
        "auth", "can-i", "watch", "inferenceobjectives.inference.networking.x-k8s.io", "-n", ns,
        "--as", OPERATOR_USER, check=False,
    )  # fmt: skip
    assert can_i.stdout.strip() == "no"
    for role in (CLUSTER_ROLE, "admin"):
        can_bind = apiserver.kubectl(
            "auth", "can-i", "bind", f"clusterroles/{role}", "-n", ns, "--as", OPERATOR_USER, check=False
        )
        assert can_bind.stdout.strip() == ("yes" if role == CLUSTER_ROLE else "no"), role

    apply(apiserver, ns, {"inferencePool": True, "endpointPicker": {"weights": {"loraAffinity": 4}}})
    objects = {
        kind: wait_for(lambda p=path: get(apiserver, p), timeout=120, message=kind) for kind, path in paths(ns).items()
    }
    pool, binding = objects["InferencePool"], objects["RoleBinding"]
    assert pool["spec"]["endpointPickerRef"] == {
        "group": "",
        "kind": "Service",
        "name": PICKER,
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }
    assert binding["roleRef"]["name"] == CLUSTER_ROLE
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": PICKER, "namespace": ns}]
    # The binding works: the picker's account may watch pods and the pool in its namespace only.
    account = f"system:serviceaccount:{ns}:{PICKER}"
    for verb, resource, where in [
        ("watch", "pods", ns),
        ("list", "inferencepools.inference.networking.k8s.io", ns),
        ("list", "pods", "default"),
    ]:
        answer = apiserver.kubectl("auth", "can-i", verb, resource, "-n", where, "--as", account, check=False)
        assert answer.stdout.strip() == ("yes" if where == ns else "no"), (verb, resource, where)
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == PICKER
    assert '"lora-affinity-scorer","weight":4' in " ".join(pod["containers"][0]["args"])
    ports = {p["name"]: p["port"] for p in objects["Service"]["spec"]["ports"]}
    assert ports == {"grpc-ext-proc": 9002, "http-metrics": 9090}
    obj = wait_for(lambda: reconciled(apiserver, ns), timeout=120, message="reconciled")
    degraded = condition(obj, "Degraded")
    assert degraded is not None and degraded["status"] == "False", obj.get("status")
    writes = apiserver.operator_writes(ns)
    assert writes["rolebindings:patch"] >= 1 and writes["inferencepools:patch"] >= 1, writes

    apply(apiserver, ns, {})
    for kind, path in paths(ns).items():
        wait_for(lambda p=path: get(apiserver, p) is None, timeout=120, message=f"{kind} removed")
    assert get(apiserver, f"/apis/apps/v1/namespaces/{ns}/deployments/{NAME}") is not None
