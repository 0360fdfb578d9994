"""The operator on a real kube-apiserver: what the emulator cannot prove.

Server-side apply with real field ownership, list-map keys and defaulting; the CRD's CEL rules
as the API server compiles and runs them; RBAC exactly as the chart grants it; `kubectl`'s own
reading of a rollout. Each test works in a namespace of its own.
"""

from __future__ import annotations

import copy
import itertools
import json
import time
from collections import Counter
from typing import Any

import pytest
import yaml

from tests.tiers import realapi
from tests.tiers.realapi import Operator
from testsupport.cluster import condition, wait_for
from testsupport.envtest import ROOT, ApiServer

pytestmark = [pytest.mark.realapi, pytest.mark.slow, pytest.mark.integration]
operator = realapi.operator_fixture()  # the tier's operator process, not the emulator's

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
_namespaces = itertools.count()
REPAIR_TIMEOUT = 60  # what the operator promises for a hand edit or a deletion (measured: under 1 s)


def namespace(server: ApiServer) -> str:
    name = f"t{next(_namespaces)}-{int(time.time() * 1000) % 100000}"
    server.kubectl("create", "namespace", name)
    return name


def get(server: ApiServer, path: str) -> dict | None:
    with server.client() as client:
        response = client.get(path)
    return response.json() if response.status_code == 200 else None


def deployment(server: ApiServer, ns: str, name: str) -> dict | None:
    return get(server, f"/apis/apps/v1/namespaces/{ns}/deployments/{name}")


def leader_worker_set(server: ApiServer, ns: str, name: str) -> dict | None:
    return get(server, f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{ns}/leaderworkersets/{name}")


def service_obj(server: ApiServer, ns: str, name: str) -> dict | None:
    return get(server, f"/api/v1/namespaces/{ns}/services/{name}")


def isvc(server: ApiServer, ns: str, name: str) -> dict | None:
    return get(server, f"/apis/inference.rocm.dev/v1alpha1/namespaces/{ns}/inferenceservices/{name}")


def apply_cr(server: ApiServer, ns: str, name: str, spec: dict) -> None:
    doc = {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }
    server.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(doc))


def observed(server: ApiServer, ns: str, name: str) -> dict | None:
    """The InferenceService once the operator has reconciled its latest generation."""
    obj = isvc(server, ns, name)
    status = (obj or {}).get("status") or {}
    return obj if obj and status.get("observedGeneration") == obj["metadata"]["generation"] else None


def wait_degraded(server: ApiServer, ns: str, name: str, status: str, timeout: float = 60) -> dict:
    """The service's Degraded condition, once it has `status`."""
    return wait_for(
        lambda: (c := condition(isvc(server, ns, name), "Degraded")) and c["status"] == status and c,
        timeout=timeout,
        message=f"Degraded={status}",
    )


def container(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]["containers"][0]


def resnet(gpus: int = 2, **extra: Any) -> dict:
    spec: dict[str, Any] = {
        "model": {"uri": "pvc://models/resnet50", "format": "onnx"},
        "resources": {"gpu": {"count": gpus}, "cpu": "2", "memory": "4Gi"},
    }
    spec.update(extra)
    return spec


def test_shipped_crds_install_and_cel_refuses_bad_specs(apiserver: ApiServer) -> None:
    crd = json.loads(apiserver.kubectl("get", "crd", "inferenceservices.inference.rocm.dev", "-o", "json").stdout)
    established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert established["Established"] == "True" and established["NamesAccepted"] == "True"
    ns = namespace(apiserver)
    cases = {
        "1model": (resnet(), "metadata.name"),
        "scaling": (resnet(autoscaling={"minReplicas": 5, "maxReplicas": 2, "target": 50}), "minReplicas"),
        "badport": (resnet(runtime={"port": 9090, "metricsPort": 9090}), "metricsPort"),
        "vllmgrpc": (resnet(runtime={"engine": "vllm", "grpcPort": 8081}), "grpcPort applies to engine modelServer"),
        "grpcport": (resnet(runtime={"grpcPort": 8080}), "runtime.grpcPort must differ"),
    }
    for name, (spec, words) in cases.items():
        doc = {
            "apiVersion": "inference.rocm.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": name, "namespace": ns},
            "spec": spec,
        }
        result = apiserver.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(doc), check=False)
        assert result.returncode != 0, f"{name} was accepted"
        assert words in result.stderr, result.stderr


def test_every_example_is_accepted_and_realised(apiserver: ApiServer, operator: Operator) -> None:
    ns = namespace(apiserver)
    # The Hub token an LLM example names, opted in the way its comments say.
    apiserver.kubectl("-n", ns, "create", "secret", "generic", "hf-token", "--from-literal=token=hf_test")
    apiserver.kubectl("-n", ns, "label", "secret", "hf-token", "inference.rocm.dev/model-credentials=true")
    names = []
    for path in EXAMPLES:
        doc = yaml.safe_load(path.read_text())
        doc["metadata"]["namespace"] = ns
        apiserver.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(doc))
        names.append(doc["metadata"]["name"])
    for name in names:
        obj = wait_for(lambda n=name: observed(apiserver, ns, n), timeout=120, message=f"{name} reconciled")
        if "disaggregation" in obj["spec"]:  # two roles' workloads in place of NAME's
            assert all(deployment(apiserver, ns, f"{name}-{role}") for role in ("prefill", "decode")), name
            assert {r["role"] for r in obj["status"]["roles"]} == {"prefill", "decode", "router"}, name
        else:
            # A multi-node example runs as a LeaderWorkerSet (its stand-in CRD is installed here).
            assert deployment(apiserver, ns, name) is not None or leader_worker_set(apiserver, ns, name), name
            assert service_obj(apiserver, ns, name) is not None, name
        policy = get(apiserver, f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/{name}")
        assert policy is not None and policy["spec"]["policyTypes"] == ["Ingress"], name
        degraded = condition(obj, "Degraded")
        assert degraded is not None, (name, obj.get("status"))
        # The only problem an example may report here is an add-on this bare API server lacks.
        assert degraded["status"] == "False" or degraded["reason"] == "ApiUnavailable", (name, degraded)
        if ((obj.get("spec") or {}).get("routing") or {}).get("router") is not None:
            # The router's RoleBinding to the chart's pod-reader role, made by an operator that may
            # bind that role without holding its rights (RBAC's escalation check, for real).
            binding = get(apiserver, f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings/{name}-router")
            assert binding is not None and binding["roleRef"]["name"] == "rocm-inference-router", name
            assert get(apiserver, f"/apis/apps/v1/namespaces/{ns}/deployments/{name}-router") is not None, name
            assert obj["status"]["url"] == f"http://{name}-router.{ns}.svc.cluster.local", obj["status"]


def test_gpu_count_to_zero_leaves_no_gpu_field(apiserver: ApiServer, operator: Operator) -> None:
    ns = namespace(apiserver)
    apply_cr(apiserver, ns, "resnet", resnet(gpus=2))
    wait_for(lambda: observed(apiserver, ns, "resnet"), timeout=120, message="first reconcile")
    before = deployment(apiserver, ns, "resnet")
    assert before is not None and container(before)["resources"]["limits"]["amd.com/gpu"] == "2"

    apply_cr(apiserver, ns, "resnet", resnet(gpus=0, runtime={"executionProviders": ["CPUExecutionProvider"]}))
    wait_for(lambda: observed(apiserver, ns, "resnet"), timeout=120, message="second reconcile")
    pod = deployment(apiserver, ns, "resnet")["spec"]["template"]["spec"]
    assert "amd.com/gpu" not in (pod["containers"][0].get("resources") or {}).get("limits", {})
    env = {e["name"] for e in pod["containers"][0].get("env") or []}
    assert not env & {"ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"}
    assert not pod.get("tolerations") and not pod.get("affinity")


def test_metrics_port_change_applies_without_a_duplicate(apiserver: ApiServer, operator: Operator) -> None:
    ns = namespace(apiserver)
    apply_cr(apiserver, ns, "resnet", resnet(gpus=1, runtime={"metricsPort": 9090}))
    wait_for(lambda: observed(apiserver, ns, "resnet"), timeout=120, message="first reconcile")
    apply_cr(apiserver, ns, "resnet", resnet(gpus=1, runtime={"metricsPort": 9091}))
    obj = wait_for(lambda: observed(apiserver, ns, "resnet"), timeout=120, message="second reconcile")
    assert condition(obj, "Degraded")["status"] == "False", condition(obj, "Degraded")
    ports = {p["name"]: p["containerPort"] for p in container(deployment(apiserver, ns, "resnet"))["ports"]}
    assert ports["metrics"] == 9091 and 9090 not in ports.values()
    svc_ports = {p["name"]: p["port"] for p in service_obj(apiserver, ns, "resnet")["spec"]["ports"]}
    assert svc_ports["metrics"] == 9091 and len(svc_ports) == len(set(svc_ports.values()))


def test_grpc_port_on_then_off_leaves_the_pod_and_service_without_it(apiserver: ApiServer, operator: Operator) -> None:
    """runtime.grpcPort through server-side apply: added to the container and the Service (with
    appProtocol grpc), then removed from both when the field goes, leaving no stray list entry."""
    ns = namespace(apiserver)
    apply_cr(apiserver, ns, "resnet", resnet(gpus=1, runtime={"grpcPort": 8081}))
    wait_for(lambda: observed(apiserver, ns, "resnet"), timeout=120, message="first reconcile")
    (svc_port,) = [p for p in service_obj(apiserver, ns, "resnet")["spec"]["ports"] if p["name"] == "grpc"]
    assert (svc_port["port"], svc_port["targetPort"], svc_port["appProtocol"]) == (8081, "grpc", "grpc")
    args = container(deployment(apiserver, ns, "resnet"))["args"]
    assert args[args.index("--grpc-port") + 1] == "8081"
    apply_cr(apiserver, ns, "resnet", resnet(gpus=1))
    wait_for(
        lambda: "--grpc-port" not in container(deployment(apiserver, ns, "resnet"))["args"],
        timeout=120,
        message="the flag removed",
    )
    assert "grpc" not in {p["name"] for p in container(deployment(apiserver, ns, "resnet"))["ports"]}
    assert "grpc" not in {p["name"] for p in service_obj(apiserver, ns, "resnet")["spec"]["ports"]}


def _image(server: ApiServer, ns: str) -> str:
    return container(deployment(server, ns, "resnet"))["image"]


def test_hand_edits_are_reverted(apiserver: ApiServer, operator: Operator) -> None:
    ns = namespace(apiserver)
    apply_cr(apiserver, ns, "resnet", resnet(gpus=1, replicas=2))
    wait_for(lambda: observed(apiserver, ns, "resnet"), timeout=120, message="first reconcile")
    wanted = _image(apiserver, ns)
    name = container(deployment(apiserver, ns, "resnet"))["name"]

    apiserver.kubectl("-n", ns, "set", "image", "deployment/resnet", f"{name}=evil.example/miner:1")
    wait_for(lambda: _image(apiserver, ns) == wanted, timeout=REPAIR_TIMEOUT, message="image reverted")

    apiserver.kubectl("-n", ns, "scale", "deployment/resnet", "--replicas=7")
    wait_for(
        lambda: deployment(apiserver, ns, "resnet")["spec"]["replicas"] == 2,
        timeout=REPAIR_TIMEOUT,
        message="replicas reverted",
    )

    edit = {"spec": {"template": {"spec": {"containers": [
        {"name": name, "env": [{"name": "EXFIL", "value": "1"}],
         "securityContext": {"privileged": True, "allowPrivilegeEscalation": True}}
    ]}}}}  # fmt: skip
    apiserver.kubectl("-n", ns, "patch", "deployment/resnet", "--type=strategic", "-p", json.dumps(edit))

    def clean() -> bool:
        c = container(deployment(apiserver, ns, "resnet"))
        env = {e["name"] for e in c.get("env") or []}
        return "EXFIL" not in env and not (c.get("securityContext") or {}).get("privileged")

    wait_for(clean, timeout=REPAIR_TIMEOUT, message="env and privileged reverted")
    events = json.loads(apiserver.kubectl("-n", ns, "get", "events", "-o", "json").stdout)["items"]
    assert any(e["reason"] == "Repaired" and "kubectl" in e["message"] for e in events), [e["message"] for e in events]


def test_deleted_service_and_pdb_come_back(apiserver: ApiServer, operator: Operator) -> None:
    ns = namespace(apiserver)
    apply_cr(apiserver, ns, "resnet", resnet(gpus=1, replicas=2))
    wait_for(lambda: observed(apiserver, ns, "resnet"), timeout=120, message="first reconcile")
    pdb_path = f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/resnet"
    first_svc = service_obj(apiserver, ns, "resnet")["metadata"]["uid"]
    assert get(apiserver, pdb_path) is not None
    apiserver.kubectl("-n", ns, "delete", "service/resnet", "poddisruptionbudget/resnet")
    started = time.monotonic()
    svc = wait_for(lambda: service_obj(apiserver, ns, "resnet"), timeout=REPAIR_TIMEOUT, message="Service back")
    wait_for(lambda: get(apiserver, pdb_path), timeout=REPAIR_TIMEOUT, message="PodDisruptionBudget back")
    assert svc["metadata"]["uid"] != first_svc
    print(f"Service and PodDisruptionBudget restored in {time.monotonic() - started:.1f} s")


def test_scale_subresource_reaches_the_deployment(apiserver: ApiServer, operator: Operator) -> None:
    ns = namespace(apiserver)
    apply_cr(apiserver, ns, "resnet", resnet(gpus=1))
    wait_for(lambda: observed(apiserver, ns, "resnet"), timeout=120, message="first reconcile")
    apiserver.kubectl("-n", ns, "scale", "inferenceservice/resnet", "--replicas=3")
    wait_for(
        lambda: deployment(apiserver, ns, "resnet")["spec"]["replicas"] == 3, timeout=120, message="Deployment at 3"
    )
    scale = get(apiserver, f"/apis/inference.rocm.dev/v1alpha1/namespaces/{ns}/inferenceservices/resnet/scale")
    assert scale["spec"]["replicas"] == 3
    assert "app.kubernetes.io/instance=resnet" in scale["status"]["selector"]


def _rollout(server: ApiServer, ns: str, status: dict) -> str:
    """Play the Deployment controller (status subresource); what `kubectl rollout status` says."""
    generation = deployment(server, ns, "resnet")["metadata"]["generation"]
    patch = {"status": {"observedGeneration": generation, **status}}
    server.kubectl(
        "-n", ns, "patch", "deployment/resnet", "--subresource=status", "--type=merge", "-p", json.dumps(patch)
    )
    result = server.kubectl("-n", ns, "rollout", "status", "deployment/resnet", "--watch=false", check=False)
    return result.stdout + result.stderr


def test_progressing_matches_kubectl_rollout_status(apiserver: ApiServer, operator: Operator) -> None:
    ns = namespace(apiserver)
    apply_cr(apiserver, ns, "resnet", resnet(gpus=1))
    wait_for(lambda: observed(apiserver, ns, "resnet"), timeout=120, message="first reconcile")

    pending = {
        "replicas": 1,
        "updatedReplicas": 1,
        "availableReplicas": 0,
        "readyReplicas": 0,
        "unavailableReplicas": 1,
        "conditions": [{"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated", "message": "x"}],
    }
    said = _rollout(apiserver, ns, pending)
    assert "0 of 1 updated replicas are available" in said, said
    progressing = wait_for(
        lambda: (c := condition(isvc(apiserver, ns, "resnet"), "Progressing")) and c["status"] == "True" and c,
        timeout=30,
        message="Progressing=True",
    )
    assert progressing["message"] == "0 of 1 updated replicas are available"

    done = copy.deepcopy(pending)
    done.update(availableReplicas=1, readyReplicas=1, unavailableReplicas=0)
    done["conditions"][0]["reason"] = "NewReplicaSetAvailable"
    said = _rollout(apiserver, ns, done)
    assert "successfully rolled out" in said, said
    wait_for(
        lambda: (
            (condition(isvc(apiserver, ns, "resnet"), "Progressing") or {}).get("status") == "False"
            and (condition(isvc(apiserver, ns, "resnet"), "Ready") or {}).get("status") == "True"
        ),
        timeout=30,
        message="Progressing=False, Ready=True",
    )


def test_keda_mode_without_keda_is_degraded_with_the_reason(apiserver: ApiServer, operator: Operator) -> None:
    ns = namespace(apiserver)
    scaling = {"mode": "keda", "minReplicas": 1, "maxReplicas": 3, "target": 50}
    apply_cr(apiserver, ns, "resnet", resnet(gpus=1, autoscaling=scaling))
    degraded = wait_for(
        lambda: (c := condition(isvc(apiserver, ns, "resnet"), "Degraded")) and c["status"] == "True" and c,
        timeout=60,
        message="Degraded=True",
    )
    assert degraded["reason"] == "ApiUnavailable" and "KEDA" in degraded["message"], degraded
    assert deployment(apiserver, ns, "resnet") is not None  # the service itself still runs


def test_a_write_the_api_keeps_failing_is_reported_and_retried(apiserver: ApiServer, operator: Operator) -> None:
    """A Service the API server keeps refusing with a 5xx (here: an admission webhook that is
    down, as in a cluster whose policy engine is broken; a full Service IP range answers the
    same way) shows as Degraded=ApiError with the server's message, and heals once it works."""
    ns = namespace(apiserver)
    apiserver.kubectl("label", "namespace", ns, f"webhook-down={ns}")
    webhook = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": f"down-{ns}"},
        "webhooks": [
            {
                "name": "services.down.example.com",
                "clientConfig": {"url": "https://127.0.0.1:1/validate"},  # nothing listens there
                "rules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["services"]}
                ],
                "namespaceSelector": {"matchLabels": {"webhook-down": ns}},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 1,
            }
        ],
    }
    apiserver.kubectl("apply", "-f", "-", stdin=json.dumps(webhook))
    try:
        apply_cr(apiserver, ns, "resnet", resnet(gpus=1))
        degraded = wait_degraded(apiserver, ns, "resnet", "True")
        assert degraded["reason"] == "ApiError", degraded
        assert "failed calling webhook" in degraded["message"] and "500" in degraded["message"], degraded
        ready = condition(isvc(apiserver, ns, "resnet"), "Ready")
        assert ready is not None and ready["status"] == "False", ready
        assert service_obj(apiserver, ns, "resnet") is None
        events = json.loads(apiserver.kubectl("get", "events", "-n", ns, "-o", "json").stdout)["items"]
        assert any(e["reason"] == "ApiError" and e["type"] == "Warning" for e in events), events
    finally:
        apiserver.kubectl("delete", "validatingwebhookconfiguration", f"down-{ns}")
    # The retries go on with backoff (1, 2, 4 ... s): the next one gets through.
    wait_for(lambda: service_obj(apiserver, ns, "resnet"), timeout=60, message="the Service, after the webhook went")
    healed = wait_degraded(apiserver, ns, "resnet", "False", timeout=30)
    assert healed["reason"] == "AsExpected"


def test_a_new_service_whose_deployment_is_refused_leaves_nothing(apiserver: ApiServer, operator: Operator) -> None:
    """A new service's objects are created without a dry run, the Deployment last: when the API
    server refuses it (here a ValidatingAdmissionPolicy, in the API server itself), the Service
    created before it is deleted again and the refusal is Degraded=ApplyFailed with its message."""
    ns = namespace(apiserver)
    apiserver.kubectl("label", "namespace", ns, f"no-deployments={ns}")
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": f"no-deployments-{ns}"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["apps"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["deployments"],
                    }
                ]
            },
            "validations": [{"expression": "false", "message": "no Deployments in this namespace"}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": f"no-deployments-{ns}"},
        "spec": {
            "policyName": f"no-deployments-{ns}",
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"no-deployments": ns}}},
        },
    }
    apiserver.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all([policy, binding]))
    try:
        # A binding takes effect once the API server's policy informer has it: wait until a
        # Deployment's dry run is refused.
        probe = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "probe", "namespace": ns}}
        probe["spec"] = {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
        }
        dry_create = ("create", "--dry-run=server", "-f", "-")
        wait_for(
            lambda: apiserver.kubectl(*dry_create, stdin=json.dumps(probe), check=False).returncode,
            timeout=30,
            message="the policy in force",
        )
        apply_cr(apiserver, ns, "resnet", resnet(gpus=1))
        degraded = wait_degraded(apiserver, ns, "resnet", "True")
        assert degraded["reason"] == "ApplyFailed", degraded
        assert "Deployment resnet" in degraded["message"], degraded
        assert "no Deployments in this namespace" in degraded["message"], degraded
        assert deployment(apiserver, ns, "resnet") is None
        wait_for(lambda: service_obj(apiserver, ns, "resnet") is None, timeout=10, message="the Service deleted again")
    finally:
        kinds = "validatingadmissionpolicybinding,validatingadmissionpolicy"
        apiserver.kubectl("delete", kinds, f"no-deployments-{ns}")


def writes_on_restart(apiserver: ApiServer, operator: Operator, ns: str) -> tuple[Counter[str], dict[str, int]]:
    """The operator stopped and started again: what it wrote in `ns` on its resync, all of it and
    to the objects it owns (the service's own status and events aside). Only this namespace:
    services of other tests run the built-in autoscaler, whose first tick after a restart may
    write status.autoscaler (that is its job, not reconcile's). The log names no object: the
    resync of generation 1 is waited for."""
    writes = apiserver.operator_writes(ns)
    logged = len(operator.text())
    with operator.stopped() as code:
        assert code == 0
    wait_for(lambda: "reconciled generation 1: 0 writes" in operator.text()[logged:], timeout=120, message="resync")
    time.sleep(3)
    resync = apiserver.operator_writes(ns) - writes
    return resync, {k: v for k, v in resync.items() if not k.startswith(("inferenceservices", "events"))}


def test_restart_resyncs_with_no_writes(apiserver: ApiServer, operator: Operator) -> None:
    ns = namespace(apiserver)
    before_create = apiserver.operator_writes(ns)
    apply_cr(apiserver, ns, "resnet", resnet(gpus=1, replicas=2))
    wait_for(lambda: observed(apiserver, ns, "resnet"), timeout=120, message="reconciled")
    time.sleep(2)  # let the watch events of its own writes pass
    created = apiserver.operator_writes(ns) - before_create
    print(f"writes to create one InferenceService: {sum(created.values())} {dict(created)}")
    assert created["deployments:patch"] == 1 and created["services:patch"] == 1, created
    assert created["inferenceservices/status:patch"] == 1, created  # one status write, not a race of two

    resync, owned = writes_on_restart(apiserver, operator, ns)
    print(f"writes on restart: {dict(resync) or 'none'}")
    assert owned == {} and not resync.get("inferenceservices/status:patch"), resync


def test_a_stop_at_once_after_a_start_is_graceful(operator: Operator) -> None:
    """The tier's start returns once the operator serves, so a stop straight after it is kopf's
    graceful one (exit 0), never a kill of a process still importing; the tests after find it
    running again."""
    with operator.stopped() as code:
        assert code == 0
    with operator.stopped() as code:
        assert code == 0, operator.text()[-3000:]


def test_objects_created_by_post_are_taken_over(apiserver: ApiServer, operator: Operator) -> None:
    """What earlier versions left: a Deployment created by POST (its creator's manager owns every
    field, operation Update). The next reconcile must still remove the fields the spec drops."""
    from inference_operator.__main__ import render_documents

    ns = namespace(apiserver)
    with operator.stopped() as code:
        assert code == 0
        apply_cr(apiserver, ns, "resnet", resnet(gpus=2))
        cr = isvc(apiserver, ns, "resnet")
        legacy = [o for o in render_documents([cr]) if o["kind"] == "Deployment"]
        apiserver.kubectl("create", "-f", "-", stdin=yaml.safe_dump(legacy[0]))  # POST, manager kubectl-create
        managers = {m["manager"] for m in deployment(apiserver, ns, "resnet")["metadata"]["managedFields"]}
        assert managers == {"kubectl-create"}
        apply_cr(apiserver, ns, "resnet", resnet(gpus=0, runtime={"executionProviders": ["CPUExecutionProvider"]}))
    wait_for(lambda: observed(apiserver, ns, "resnet"), timeout=120, message="reconciled after restart")
    live = deployment(apiserver, ns, "resnet")
    pod = live["spec"]["template"]["spec"]
    assert "amd.com/gpu" not in (pod["containers"][0].get("resources") or {}).get("limits", {})
    assert not {e["name"] for e in pod["containers"][0].get("env") or []} & {"ROCR_VISIBLE_DEVICES"}
    assert not pod.get("tolerations")
    spec_owners = {m["manager"] for m in live["metadata"]["managedFields"] if "f:spec" in (m.get("fieldsV1") or {})}
    assert spec_owners == {"rocm-inference-operator"}, spec_owners


def canary_spec(version: str) -> dict:
    spec = resnet(gpus=0, runtime={"executionProviders": ["CPUExecutionProvider"]}, replicas=3)
    spec["model"]["version"] = version
    # Prometheus is not reachable here: the analysis has no data, so only a command moves it on.
    spec["rollout"] = {"strategy": "canary", "canary": {"steps": [10, 50], "analysis": {"maxLatencyMs": 50}}}
    return spec


def version_of(obj: dict | None) -> str | None:
    if obj is None:
        return None
    args = container(obj)["args"]
    return str(args[args.index("--model-version") + 1])


def annotations_of(server: ApiServer, ns: str) -> dict:
    return ((isvc(server, ns, "resnet") or {}).get("metadata") or {}).get("annotations") or {}


def rollout_of(server: ApiServer, ns: str) -> dict:
    return ((isvc(server, ns, "resnet") or {}).get("status") or {}).get("rollout") or {}


def test_canary_objects_weights_and_status_at_each_stage(apiserver: ApiServer, operator: Operator) -> None:
    ns = namespace(apiserver)
    apply_cr(apiserver, ns, "resnet", canary_spec("1"))
    wait_for(lambda: rollout_of(apiserver, ns).get("phase") == "Stable", timeout=120, message="stable revision")
    columns = apiserver.kubectl("get", "ris", "resnet", "-n", ns).stdout.splitlines()[0].split()
    assert columns[:5] == ["NAME", "READY", "REASON", "REPLICAS", "ROLLOUT"]

    apply_cr(apiserver, ns, "resnet", canary_spec("2"))
    wait_for(lambda: rollout_of(apiserver, ns).get("stage") == "canary 10%", timeout=120, message="canary at 10%")
    stable, canary = deployment(apiserver, ns, "resnet"), deployment(apiserver, ns, "resnet-canary")
    assert canary is not None and canary["spec"]["replicas"] == 1  # beside 3: 25%, by replica proportion
    assert version_of(stable) == "1" and version_of(canary) == "2"
    assert canary["spec"]["selector"]["matchLabels"]["inference.rocm.dev/track"] == "canary"
    # Shown in `kubectl get` as the API server evaluates the printer column.
    assert "canary 10%" in apiserver.kubectl("get", "ris", "resnet", "-n", ns).stdout

    # No data from Prometheus: no verdict, so it stays; promote by hand.
    apiserver.kubectl("annotate", "ris", "resnet", "-n", ns, "inference.rocm.dev/rollout=promote")
    wait_for(lambda: rollout_of(apiserver, ns).get("phase") == "Promoted", timeout=120, message="promoted")
    wait_for(lambda: deployment(apiserver, ns, "resnet-canary") is None, timeout=60, message="canary removed")
    wait_for(lambda: version_of(deployment(apiserver, ns, "resnet")) == "2", timeout=60, message="stable rolled")
    wait_for(lambda: "inference.rocm.dev/rollout" not in annotations_of(apiserver, ns), timeout=30, message="cleared")

    # The next change starts a new canary; abort it by hand: the stable revision stays.
    apply_cr(apiserver, ns, "resnet", canary_spec("3"))
    wait_for(lambda: deployment(apiserver, ns, "resnet-canary"), timeout=120, message="second canary")
    apiserver.kubectl("annotate", "ris", "resnet", "-n", ns, "inference.rocm.dev/rollout=abort")
    back = wait_for(
        lambda: (r := rollout_of(apiserver, ns)).get("phase") == "RolledBack" and r, timeout=120, message="aborted"
    )
    assert back["stage"] == "rolled back" and "aborted by hand" in back["message"]
    wait_for(lambda: deployment(apiserver, ns, "resnet-canary") is None, timeout=60, message="canary removed")
    assert version_of(deployment(apiserver, ns, "resnet")) == "2"


def route_backends(server: ApiServer, ns: str) -> list[tuple[str, int]] | None:
    route = get(server, f"/apis/gateway.networking.k8s.io/v1/namespaces/{ns}/httproutes/resnet")
    if route is None:
        return None
    return [(ref["name"], ref["weight"]) for ref in route["spec"]["rules"][0]["backendRefs"]]


def test_canary_behind_an_httproute_is_split_by_its_weights(apiserver: ApiServer, operator: Operator) -> None:
    """With the Gateway API served (found by discovery; the tier installs a stand-in of its
    HTTPRoute CRD), the route's weights follow the steps: each arm has a Service of its own,
    and promotion leaves the route on the one Service."""
    ns = namespace(apiserver)

    def routed(version: str) -> dict:
        spec = canary_spec(version)
        spec["routing"] = {"httpRoute": {"parentRefs": [{"name": "inference", "namespace": "gateways"}]}}
        return spec

    apply_cr(apiserver, ns, "resnet", routed("1"))
    wait_for(lambda: route_backends(apiserver, ns) == [("resnet", 1)], timeout=120, message="route to the Service")
    apply_cr(apiserver, ns, "resnet", routed("2"))
    wait_for(
        lambda: route_backends(apiserver, ns) == [("resnet-stable", 90), ("resnet-canary", 10)],
        timeout=120,
        message="route weights 90/10",
    )
    # The status is written after the objects it describes: wait for it rather than race it.
    rollout = wait_for(
        lambda: (r := rollout_of(apiserver, ns)) and r.get("stage") == "canary 10%" and r,
        timeout=30,
        message="status.rollout at canary 10%",
    )
    assert rollout["traffic"] == "httpRoute", rollout
    canary = deployment(apiserver, ns, "resnet-canary")
    assert canary is not None and canary["spec"]["replicas"] == 1  # 10% of what 3 serve
    for track in ("stable", "canary"):
        arm = service_obj(apiserver, ns, f"resnet-{track}")
        assert arm is not None and arm["spec"]["selector"]["inference.rocm.dev/track"] == track
    stable = deployment(apiserver, ns, "resnet")
    assert (
        stable is not None and stable["spec"]["template"]["metadata"]["labels"]["inference.rocm.dev/track"] == "stable"
    )

    apiserver.kubectl("annotate", "ris", "resnet", "-n", ns, "inference.rocm.dev/rollout=promote")
    wait_for(lambda: route_backends(apiserver, ns) == [("resnet", 1)], timeout=120, message="route back to one")
    for name in ("resnet-stable", "resnet-canary"):
        wait_for(lambda name=name: service_obj(apiserver, ns, name) is None, timeout=60, message=f"{name} removed")
    wait_for(lambda: deployment(apiserver, ns, "resnet-canary") is None, timeout=60, message="canary removed")
