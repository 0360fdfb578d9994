"""spec.disaggregation on a real kube-apiserver: the two roles' objects applied (server-side
apply, the operator's manager) and owned by the service, the KV-transfer NetworkPolicies' selectors
as stored, the CRD's CEL refusals as the API server runs them, status.roles and a Ready condition
that names the short role (the Deployment controller played through the status subresource),
every role object pruned when disaggregation is removed, and no write on restart."""

from __future__ import annotations

import json

import pytest

from tests.reconcile.test_operator_realapi import (
    apply_cr,
    deployment,
    get,
    isvc,
    namespace,
    observed,
    service_obj,
    writes_on_restart,
)
from tests.tiers import realapi
from tests.tiers.realapi import Operator
from testsupport.cluster import condition, wait_for
from testsupport.envtest import ApiServer

pytestmark = [pytest.mark.realapi, pytest.mark.slow, pytest.mark.integration]
operator = realapi.operator_fixture()  # the tier's operator process, not the emulator's

NAME = "llm"
ROLES = ("prefill", "decode")
ROLE_LABEL = "inference.rocm.dev/role"
NETPOL = "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/{name}"
PDB = "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{name}"
HPA = "/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers/{name}"


def pd_spec(**disaggregation: object) -> dict:
    return {
        "model": {"uri": "pvc://models/llm", "name": "llm"},
        "runtime": {"engine": "vllm"},
        "resources": {"gpu": {"count": 0}, "cpu": "2", "memory": "4Gi"},
        "routing": {"router": {"replicas": 1}},
        "disaggregation": {
            "prefill": {"replicas": 2},
            "decode": {"autoscaling": {"maxReplicas": 3, "metric": "kvCacheUsage", "target": 80}},
            **disaggregation,
        },
    }


def role_objects(server: ApiServer, ns: str) -> dict[str, dict | None]:
    found: dict[str, dict | None] = {}
    for role in ROLES:
        name = f"{NAME}-{role}"
        found[f"Deployment/{role}"] = deployment(server, ns, name)
        found[f"NetworkPolicy/{role}"] = get(server, NETPOL.format(ns=ns, name=name))
    found["PodDisruptionBudget/prefill"] = get(server, PDB.format(ns=ns, name=f"{NAME}-prefill"))
    found["HorizontalPodAutoscaler/decode"] = get(server, HPA.format(ns=ns, name=f"{NAME}-decode"))
    return found


def play_rollout(server: ApiServer, ns: str, name: str, ready: int) -> None:
    """The Deployment controller's part, through the status subresource."""
    live = deployment(server, ns, name)
    assert live is not None
    replicas = live["spec"].get("replicas", 1)
    status = {
        "observedGeneration": live["metadata"]["generation"],
        "replicas": replicas,
        "updatedReplicas": replicas,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "conditions": [
            {
                "type": "Progressing",
                "status": "True",
                "reason": "NewReplicaSetAvailable" if ready >= replicas else "ReplicaSetUpdated",
                "message": "x",
            }
        ],
    }
    server.kubectl(
        "-n",
        ns,
        "patch",
        f"deployment/{name}",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )


def test_the_crd_refuses_what_a_disaggregated_service_cannot_be(apiserver: ApiServer) -> None:
    ns = namespace(apiserver)
    no_router = pd_spec()
    del no_router["routing"]
    with pytest.raises(Exception, match="needs routing.router"):
        apply_cr(apiserver, ns, "a", no_router)
    alone = pd_spec(scaleToZero={}, decode={"autoscaling": {"mode": "builtin", "maxReplicas": 2, "target": 1}})
    with pytest.raises(Exception, match="needs both roles' autoscaling with mode builtin"):
        apply_cr(apiserver, ns, "b", alone)  # the prefill role is on no built-in loop
    with pytest.raises(Exception, match="one or the other"):
        apply_cr(apiserver, ns, "c", pd_spec() | {"routing": {"router": {}, "inferencePool": True}})


def test_roles_applied_owned_guarded_reported_and_pruned(apiserver: ApiServer, operator: Operator) -> None:
    ns = namespace(apiserver)
    apply_cr(apiserver, ns, NAME, pd_spec())
    obj = wait_for(lambda: observed(apiserver, ns, NAME), timeout=120, message="reconciled")
    uid = obj["metadata"]["uid"]

    # Applied by the operator's one manager, owned (controller) by the service: deleting it
    # deletes them (the garbage collector follows these references).
    objects = role_objects(apiserver, ns)
    assert all(objects.values()), {k: v is not None for k, v in objects.items()}
    for key, live in objects.items():
        assert live is not None
        (ref,) = live["metadata"]["ownerReferences"]
        assert (ref["uid"], ref["controller"], ref["blockOwnerDeletion"]) == (uid, True, True), key
        managers = {(m["manager"], m["operation"]) for m in live["metadata"]["managedFields"]}
        assert managers == {("rocm-inference-operator", "Apply")}, (key, managers)
        assert live["metadata"]["labels"][ROLE_LABEL] == key.split("/")[1], key
    assert deployment(apiserver, ns, NAME) is None and service_obj(apiserver, ns, NAME) is None
    assert deployment(apiserver, ns, f"{NAME}-router") is not None

    # The KV-transfer policies as stored: each role's pods, from the other role's of this service.
    prefill = objects["Deployment/prefill"]
    decode = objects["Deployment/decode"]
    assert prefill is not None and decode is not None
    pods = {
        "prefill": prefill["spec"]["template"]["metadata"]["labels"],
        "decode": decode["spec"]["template"]["metadata"]["labels"],
    }
    for role, other in (("prefill", "decode"), ("decode", "prefill")):
        policy = objects[f"NetworkPolicy/{role}"]
        assert policy is not None
        selected = policy["spec"]["podSelector"]["matchLabels"]
        assert selected.items() <= pods[role].items() and not selected.items() <= pods[other].items()
        rule = policy["spec"]["ingress"][0]
        assert [set(peer) for peer in rule["from"]] == [{"podSelector"}]
        peer = rule["from"][0]["podSelector"]["matchLabels"]
        assert peer.items() <= pods[other].items() and not peer.items() <= pods[role].items()
        assert peer["app.kubernetes.io/instance"] == NAME
    router = deployment(apiserver, ns, f"{NAME}-router")
    assert router is not None
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--vllm-pd-disaggregation" in args and "--kv-connector=nixl" in args

    # status.roles: each role; Ready names the one that is short.
    roles = {r["role"]: r for r in obj["status"]["roles"]}
    assert set(roles) == {"prefill", "decode", "router"}, obj["status"]
    play_rollout(apiserver, ns, f"{NAME}-prefill", 2)
    play_rollout(apiserver, ns, f"{NAME}-router", 1)
    play_rollout(apiserver, ns, f"{NAME}-decode", 0)
    short = wait_for(
        lambda: (c := condition(isvc(apiserver, ns, NAME), "Ready")) and "decode 0/" in c["message"] and c,
        timeout=30,
        message="Ready names the short decode role",
    )
    assert short["status"] == "False" and "prefill 2/2" in short["message"], short
    play_rollout(apiserver, ns, f"{NAME}-decode", 1)
    wait_for(
        lambda: (condition(isvc(apiserver, ns, NAME), "Ready") or {}).get("status") == "True",
        timeout=30,
        message="Ready once every role is",
    )
    printed = apiserver.kubectl("-n", ns, "get", "ris", NAME, "--no-headers").stdout
    assert len(printed.strip().splitlines()) == 1, printed

    # A restart: the roles' objects are as wanted, nothing is written.
    resync, owned = writes_on_restart(apiserver, operator, ns)
    assert owned == {}, resync

    # Removing disaggregation: the label-selected prune deletes every role object.
    plain = pd_spec()
    del plain["disaggregation"]
    apply_cr(apiserver, ns, NAME, plain)
    wait_for(lambda: observed(apiserver, ns, NAME), timeout=120, message="reconciled without disaggregation")
    gone = wait_for(
        lambda: not any(role_objects(apiserver, ns).values()) and role_objects(apiserver, ns),
        timeout=60,
        message="role objects pruned",
    )
    assert not any(gone.values())
    assert deployment(apiserver, ns, NAME) is not None and service_obj(apiserver, ns, NAME) is not None
    assert "roles" in isvc(apiserver, ns, NAME)["status"]  # predictor and router now
    assert {r["role"] for r in isvc(apiserver, ns, NAME)["status"]["roles"]} == {"predictor", "router"}
