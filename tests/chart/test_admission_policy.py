"""The chart's ValidatingAdmissionPolicy is the operator's pod policy, refused at admission.

Rendered by Helm from the same values that set the operator's environment, its CEL is run
(testsupport/admission.py) over a table of specs and must refuse exactly what
`policy.violations` refuses, with the same messages, under each set of values; the objects pass
kubernetes-validate (strict). tests/security/test_admission_realapi.py has a real API server
enforce it.
"""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from inference_operator import policy, settings
from inference_operator.builders.activator import WAKE_ANNOTATION
from inference_operator.config import OperatorConfig
from inference_operator.models import parse_spec
from inference_operator.models import runtime as runtime_model
from inference_operator.models.base import cel_string
from inference_operator.validation import cel_errors, validate_custom_resource
from tests.chart import helm as h
from tests.chart.test_helm import KUBERNETES_VERSIONS
from tests.crd.test_crd_cel import COLLECTOR_ENDPOINTS, LOCAL_TRACING_ENDPOINTS
from testsupport.admission import evaluate
from testsupport.cluster import Cluster
from testsupport.crd import apply_defaults, crd_schema

FULLNAME = f"{h.RELEASE}-{h.CHART.name}"
VAP_KEY = "admissionregistration.k8s.io/v1/validatingadmissionpolicies"
DIGEST = "sha256:" + "0" * 64

VALUE_SETS = {
    "defaults": None,
    "wide": {
        "policy": {
            "serviceAccounts": ["default", "inference"],
            "priorityClasses": ["*"],
            "imageRegistries": ["*"],
            "allowServiceAccountToken": True,
        }
    },
    "lists": {
        "policy": {
            "serviceAccounts": ["ml-runner"],
            "priorityClasses": ["high", "low"],
            "imageRegistries": [
                "registry.internal:5000/ml",
                "docker.io/library/",
                "ghcr.io/example//",
                "localhost/dev/",
                "mirror.example",  # a bare host: every image it serves
            ],
        }
    },
    # Empty imageRegistries: the repository prefixes of the operator's own images.
    "own-images": {"images": {"modelServer": f"localhost:5000/rio/model-server@{DIGEST}", "vllm": "vllm/openai:v1"}},
    # An own image directly under a host: that whole host is allowed (registry.example.com/).
    "own-images-hub": {"images": {"modelServer": "model-server:0.1", "vllm": "registry.example.com/vllm-rocm:1"}},
    # GIDs as numbers and ranges; Gateways by name and by namespace; host names and patterns.
    "groups-routes": {
        "policy": {
            "supplementalGroups": [44, "1000-1999", "1500-1500"],
            "httpRoute": {
                "gateways": ["gateways/inference", "team-a/*", "ml/local"],
                "hostnames": ["*.team-a.example.com", "llm.example.com"],
            },
        }
    },
    # Empty policy.supplementalGroups: none; "*" in each list: any.
    "no-groups": {"policy": {"supplementalGroups": []}},
    "any-group": {"policy": {"supplementalGroups": ["*"], "httpRoute": {"gateways": ["*"], "hostnames": ["*"]}}},
}


def _route(parents: list[dict[str, str]], hostnames: list[str] | None = None) -> dict[str, Any]:
    route: dict[str, Any] = {"parentRefs": parents}
    if hostnames is not None:
        route["hostnames"] = hostnames
    return {"model": {"uri": "pvc://m"}, "routing": {"httpRoute": route}}


GATEWAY = {"name": "inference", "namespace": "gateways"}

SPECS: dict[str, dict[str, Any]] = {
    "minimal": {"model": {"uri": "pvc://models/m"}},
    "account-default": {"model": {"uri": "pvc://m"}, "scheduling": {"serviceAccountName": "default"}},
    "account-inference": {"model": {"uri": "pvc://m"}, "scheduling": {"serviceAccountName": "inference"}},
    "account-ml-runner": {"model": {"uri": "pvc://m"}, "scheduling": {"serviceAccountName": "ml-runner"}},
    "account-admin": {"model": {"uri": "pvc://m"}, "scheduling": {"serviceAccountName": "cluster-admin"}},
    "priority-high": {"model": {"uri": "pvc://m"}, "scheduling": {"priorityClassName": "high"}},
    "priority-system": {"model": {"uri": "pvc://m"}, "scheduling": {"priorityClassName": "system-node-critical"}},
    "token-on": {"model": {"uri": "pvc://m"}, "scheduling": {"automountServiceAccountToken": True}},
    "token-off": {"model": {"uri": "pvc://m"}, "scheduling": {"automountServiceAccountToken": False}},
    "scheduling-nodes-only": {"model": {"uri": "pvc://m"}, "scheduling": {"nodeSelector": {"gpu": "mi300x"}}},
    "runtime-without-image": {"model": {"uri": "pvc://m"}, "runtime": {"engine": "vllm"}},
    **{
        f"image {image}": {"model": {"uri": "pvc://m"}, "runtime": {"image": image}}
        for image in (
            "ghcr.io/rocm-inference/model-server:0.2.0",
            f"ghcr.io/rocm-inference/model-server@{DIGEST}",
            "ghcr.io/rocm-inference-evil/model-server:1",
            "ghcr.io/rocm-inference",
            "ghcr.io/example/custom:1",
            "docker.io/vllm/vllm-openai-rocm:v0.32.1",
            "vllm/vllm-openai-rocm:v0.32.1",
            "vllm/openai:v2",
            "docker.io/vllm-evil/x:1",
            "ubuntu",
            "ubuntu:24.04",
            "library/ubuntu:24.04",
            "docker.io/library/ubuntu",
            "model-server:0.2",
            "attacker/steal",
            "docker.io/attacker/steal:1",
            "localhost:5000/rio/model-server:2",
            "localhost:5000/other/x:1",
            "localhost/dev/x:1",
            "localhost/x",
            "registry.internal:5000/ml/x:1",
            "registry.internal:5000/mlx/y:1",
            "registry.example.com/vllm-rocm:2",
            "registry.example.com/team/vllm-rocm:2",
            "mirror.example/team/x:1",
            "mirror.example.evil/x:1",
        )
    },
    **{
        f"model {uri}": {"model": {"uri": uri}}
        for uri in (
            "oci://ghcr.io/example/modelcar:1",
            "oci://ghcr.io/rocm-inference/models/resnet:1",
            "oci://attacker/steal:latest",
            "oci://ubuntu",
            "oci://localhost:5000/rio/m:1",
            "oci://registry.internal:5000/ml/m:1",
            "hf://org/name",
            "s3://bucket/attacker/steal",
            "https://attacker.example/steal.onnx",
        )
    },
    **{
        f"groups {groups}": {"model": {"uri": "pvc://m"}, "resources": {"gpu": {"supplementalGroups": groups}}}
        for groups in ([], [44], [109], [44, 992], [999], [1000], [1500], [1999], [2000], [44, 5], [4294967295])
    },
    **{
        f"{role} groups {groups}": {
            "model": {"uri": "pvc://m"},
            "runtime": {"engine": "vllm"},
            "routing": {"router": {}},
            "disaggregation": {role: {"resources": {"gpu": {"supplementalGroups": groups}}}},
        }
        for role in ("prefill", "decode")
        for groups in ([44], [999], [1500], [2000], [44, 5])
    },
    "roles-groups-and-pod-groups": {
        "model": {"uri": "pvc://m"},
        "runtime": {"engine": "vllm"},
        "resources": {"gpu": {"supplementalGroups": [5]}},
        "routing": {"router": {}},
        "disaggregation": {"prefill": {"resources": {"gpu": {"supplementalGroups": [6]}}}, "decode": {}},
    },
    "route-gateway": _route([GATEWAY], ["llm.example.com"]),
    "route-own-namespace": _route([{"name": "local"}], ["llm.example.com"]),
    "route-own-namespace-other": _route([{"name": "inference"}], ["llm.example.com"]),
    "route-team-a": _route([{"name": "any", "namespace": "team-a", "sectionName": "https"}], ["llm.example.com"]),
    "route-second-parent": _route([GATEWAY, {"name": "evil", "namespace": "gateways"}], ["llm.example.com"]),
    **{
        f"route-hosts {hosts}": _route([GATEWAY], hosts)
        for hosts in (
            None,
            ["a.team-a.example.com"],
            ["*.team-a.example.com"],
            ["x.y.team-a.example.com"],
            ["team-a.example.com"],
            ["evilteam-a.example.com"],
            ["*.example.com"],
            ["llm.example.com", "other.example.com"],
        )
    },
    "everything-wrong": {
        "model": {"uri": "oci://attacker/model:1"},
        "runtime": {"image": "attacker/steal"},
        "scheduling": {
            "serviceAccountName": "cluster-admin",
            "priorityClassName": "system-cluster-critical",
            "automountServiceAccountToken": True,
        },
    },
}


def inference_service(spec: dict[str, Any], name: str = "m", namespace: str = "ml") -> dict[str, Any]:
    return {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def installed(cluster: Cluster, values: dict | None) -> tuple[list[dict], settings.PodPolicy]:
    """The chart's objects, and the pod policy its operator reads from the environment it sets."""
    h.install(cluster, values)
    objects = h.installed_objects(cluster)
    (container,) = h.one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    return objects, OperatorConfig.from_environ(env).pod_policy


def operator_messages(spec: dict[str, Any], pod_policy: settings.PodPolicy) -> tuple[str, ...]:
    return tuple(policy.violations(parse_spec(spec), pod_policy, "ml"))


def admission_messages(vap: dict, spec: dict[str, Any]) -> tuple[str, ...]:
    """The policy's messages for a create of `spec`, as written and as the API server defaults it."""
    obj = inference_service(copy.deepcopy(spec))
    verdict = evaluate(vap, obj)
    assert verdict.matched
    assert evaluate(vap, apply_defaults(crd_schema(), obj)) == verdict, "CRD defaults change the verdict"
    return verdict.messages


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_admission_refuses_exactly_what_the_operator_refuses(chart_cluster: Cluster, values: dict | None) -> None:
    objects, pod_policy = installed(chart_cluster, values)
    vap = h.one(objects, "ValidatingAdmissionPolicy")
    verdicts = {}
    for name, spec in SPECS.items():
        expected = operator_messages(spec, pod_policy)
        assert admission_messages(vap, spec) == expected, name
        verdicts[name] = expected
    # Not a vacuous table: under every value set some specs pass and some are refused.
    assert any(verdicts.values()) and not all(verdicts.values())


def test_the_table_refuses_every_field_somewhere(chart_cluster: Cluster) -> None:
    """Each rule is exercised by the table under the default values, the routes' under values
    that restrict them (the defaults allow any Gateway and host)."""
    _, pod_policy = installed(chart_cluster, None)
    refused = {m.split(" ", 1)[0] for spec in SPECS.values() for m in operator_messages(spec, pod_policy)}
    assert refused == {
        "scheduling.serviceAccountName",
        "scheduling.priorityClassName",
        "scheduling.automountServiceAccountToken",
        "runtime.image",
        "model.uri",
        "resources.gpu.supplementalGroups",
        "disaggregation.prefill.resources.gpu.supplementalGroups",
        "disaggregation.decode.resources.gpu.supplementalGroups",
    }
    _, pod_policy = installed(chart_cluster, VALUE_SETS["groups-routes"])
    messages = [m for spec in SPECS.values() for m in operator_messages(spec, pod_policy)]
    routes = {" ".join(m.split()[:2]) for m in messages if m.startswith("routing.") and "empty" in m.split()[:2]}
    routes |= {m.split()[0] for m in messages if m.startswith("routing.")}
    assert routes == {
        "routing.httpRoute.parentRefs",
        "routing.httpRoute.hostnames",
        "routing.httpRoute.hostnames empty",
    }


def test_gid_0_is_refused_by_the_schema_and_by_both_policies(chart_cluster: Cluster) -> None:
    """The CRD refuses GID 0 first; an object from before that is refused by the admission policy
    and by the operator's check, even where the platform allows any GID."""
    spec = {"model": {"uri": "pvc://m"}, "resources": {"gpu": {"supplementalGroups": [44, 0]}}}
    assert any("supplementalGroups" in e for e in validate_custom_resource(inference_service(spec)))
    objects, pod_policy = installed(chart_cluster, VALUE_SETS["any-group"])
    message = "resources.gpu.supplementalGroups 0 is not allowed (allowed: *; never 0)"
    assert evaluate(h.one(objects, "ValidatingAdmissionPolicy"), inference_service(spec)).messages == (message,)
    old = parse_spec({"model": {"uri": "pvc://m"}})
    gpu = old.resources.gpu.model_copy(update={"supplemental_groups": [44, 0]})  # stored before the bound
    old = old.model_copy(update={"resources": old.resources.model_copy(update={"gpu": gpu})})
    assert policy.violations(old, pod_policy) == [message]


def test_the_parity_check_would_catch_a_policy_without_docker_hub_normalisation(chart_cluster: Cluster) -> None:
    objects, pod_policy = installed(chart_cluster, None)
    vap = copy.deepcopy(h.one(objects, "ValidatingAdmissionPolicy"))
    for variable in vap["spec"]["variables"]:
        if variable["name"] == "runtimeImageName":
            variable["expression"] = "variables.runtimeImage"
    differing = [n for n, s in SPECS.items() if admission_messages(vap, s) != operator_messages(s, pod_policy)]
    assert "image vllm/vllm-openai-rocm:v0.32.1" in differing


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_partial_objects_pass_without_errors(chart_cluster: Cluster, values: dict | None) -> None:
    """An object missing any part the rules read is no error (which failurePolicy Fail would refuse)."""
    objects, _ = installed(chart_cluster, values)
    vap = h.one(objects, "ValidatingAdmissionPolicy")
    for spec in (None, {}, {"scheduling": {}}, {"runtime": {}}, {"model": {}}, {"model": {"format": "onnx"}}):
        obj = inference_service(spec or {}) if spec is not None else {"metadata": {"name": "m"}}
        assert evaluate(vap, obj).allowed, spec


def test_an_update_is_judged_only_when_it_writes_the_spec(chart_cluster: Cluster) -> None:
    """Objects from before the policy keep their finalizer and annotations and can be deleted."""
    objects, _ = installed(chart_cluster, None)
    vap = h.one(objects, "ValidatingAdmissionPolicy")
    old = inference_service(SPECS["account-admin"])
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["finalizers"] = ["kopf.zalando.org/KopfFinalizerMarker"]
    assert not evaluate(vap, relabelled, old, "UPDATE").matched
    rescaled = copy.deepcopy(old)
    rescaled["spec"]["replicas"] = 3
    assert evaluate(vap, rescaled, old, "UPDATE").messages == (
        "scheduling.serviceAccountName 'cluster-admin' is not allowed (allowed: default)",
    )
    fixed = inference_service(SPECS["minimal"])
    assert evaluate(vap, fixed, old, "UPDATE").allowed
    assert not evaluate(vap, old, None, "CREATE").allowed


def test_default_install_has_a_cluster_wide_deny_policy(chart_cluster: Cluster) -> None:
    objects, _ = installed(chart_cluster, None)
    vap = h.one(objects, "ValidatingAdmissionPolicy")
    binding = h.one(objects, "ValidatingAdmissionPolicyBinding")
    assert vap["metadata"]["name"] == binding["metadata"]["name"] == f"{FULLNAME}-pod-policy"
    assert vap["spec"]["failurePolicy"] == "Fail"
    assert vap["spec"]["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": ["inference.rocm.dev"],
            "apiVersions": ["v1alpha1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["inferenceservices"],
        }
    ]
    assert binding["spec"] == {"policyName": vap["metadata"]["name"], "validationActions": ["Deny"]}
    for obj in (vap, binding):
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize(
    ("watch", "namespaces"),
    [
        ({"allNamespaces": False, "namespaces": ["ml-team-a", "ml-team-b"]}, ["ml-team-a", "ml-team-b"]),
        ({"allNamespaces": False, "namespaces": []}, [h.RELEASE_NAMESPACE]),
    ],
    ids=["listed", "release-namespace"],
)
def test_a_namespaced_install_binds_the_policy_to_the_watched_namespaces(
    chart_cluster: Cluster, watch: dict, namespaces: list[str]
) -> None:
    objects, _ = installed(chart_cluster, {"watch": watch, "replicaCount": 1, "ha": {"enabled": False}})
    binding = h.one(objects, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["matchResources"] == {
        "namespaceSelector": {
            "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}]
        }
    }
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(binding, version, strict=True)


def test_the_policy_can_be_turned_off(chart_cluster: Cluster) -> None:
    objects, pod_policy = installed(chart_cluster, {"policy": {"admission": {"enabled": False}}})
    assert not h.by_kind(objects, "ValidatingAdmissionPolicy")
    assert not h.by_kind(objects, "ValidatingAdmissionPolicyBinding")
    assert pod_policy.service_accounts == ("default",)  # the operator's check stays


def test_a_cluster_without_the_api_gets_no_policy(chart_cluster: Cluster) -> None:
    """Before Kubernetes 1.30 (no admissionregistration.k8s.io/v1 policies) the install still works."""
    del chart_cluster.emulator.resources[VAP_KEY]
    objects, _ = installed(chart_cluster, None)
    assert h.one(objects, "Deployment")
    assert not h.by_kind(objects, "ValidatingAdmissionPolicy")
    assert not h.by_kind(objects, "ValidatingAdmissionPolicyBinding")


# The activator's right to patch every InferenceService, narrowed to the wake annotation.
ACTIVATOR = f"{FULLNAME}-activator"
ACTIVATOR_USER = f"system:serviceaccount:{h.RELEASE_NAMESPACE}:{ACTIVATOR}"
WAKE_ONLY = f"{ACTIVATOR}-wake-only"
STAMP = "2026-12-07T08:30:00Z"


def _stored() -> dict[str, Any]:
    """An InferenceService as the activator finds it: the operator's finalizer, a tenant's labels
    and annotations, an owner."""
    scaling = {"minReplicas": 0, "maxReplicas": 2, "target": 50, "scaleToZero": {}}
    obj = inference_service({"model": {"uri": "pvc://m"}, "autoscaling": scaling})
    assert validate_custom_resource(obj) == []
    obj["metadata"].update(
        labels={"team": "a"},
        annotations={"team.example.com/cost-centre": "42", WAKE_ANNOTATION: "2026-12-07T08:00:00Z"},
        finalizers=["kopf.zalando.org/KopfFinalizerMarker"],
        ownerReferences=[{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": "u1"}],
    )
    obj["status"] = {"replicas": 0}
    return obj


def _changed(edit: Any) -> dict[str, Any]:
    obj = _stored()
    edit(obj)
    return obj


WAKES = {
    "wake set": lambda o: o["metadata"]["annotations"].update({WAKE_ANNOTATION: STAMP}),
    "wake with fraction and offset": lambda o: o["metadata"]["annotations"].update(
        {WAKE_ANNOTATION: "2026-12-07T08:30:00.123456+01:00"}
    ),
    "wake cleared": lambda o: o["metadata"]["annotations"].pop(WAKE_ANNOTATION),
    "nothing": lambda o: None,
}
NOT_WAKES = {
    "spec": lambda o: o["spec"].update({"runtime": {"image": "attacker/steal"}}),
    "spec and wake": lambda o: (
        o["spec"].update({"replicas": 5}),
        o["metadata"]["annotations"].update({WAKE_ANNOTATION: STAMP}),
    ),
    "spec removed": lambda o: o.pop("spec"),
    "status": lambda o: o["status"].update({"replicas": 3}),
    "label changed": lambda o: o["metadata"]["labels"].update({"team": "b"}),
    "label added": lambda o: o["metadata"]["labels"].update({"x": "y"}),
    "labels removed": lambda o: o["metadata"].pop("labels"),
    "annotation changed": lambda o: o["metadata"]["annotations"].update({"team.example.com/cost-centre": "0"}),
    "annotation added": lambda o: o["metadata"]["annotations"].update({"inference.rocm.dev/activator": "x"}),
    "annotation removed": lambda o: o["metadata"]["annotations"].pop("team.example.com/cost-centre"),
    "wake not a timestamp": lambda o: o["metadata"]["annotations"].update({WAKE_ANNOTATION: "x" * 4096}),
    "finalizer removed": lambda o: o["metadata"].pop("finalizers"),
    "finalizer added": lambda o: o["metadata"]["finalizers"].append("evil/hold"),
    "owner added": lambda o: o["metadata"]["ownerReferences"].append(
        {"apiVersion": "v1", "kind": "Secret", "name": "s", "uid": "u2"}
    ),
    "owners removed": lambda o: o["metadata"].pop("ownerReferences"),
}


def _wake_only(chart_cluster: Cluster, values: dict | None = None) -> dict:
    objects, _ = installed(chart_cluster, values)
    return h.one(objects, "ValidatingAdmissionPolicy", WAKE_ONLY)


@pytest.mark.parametrize("change", WAKES, ids=WAKES.keys())
def test_the_activator_may_write_the_wake_annotation(chart_cluster: Cluster, change: str) -> None:
    vap = _wake_only(chart_cluster)
    verdict = evaluate(vap, _changed(WAKES[change]), _stored(), "UPDATE", user=ACTIVATOR_USER)
    assert verdict.matched and verdict.allowed, verdict.messages


@pytest.mark.parametrize("change", NOT_WAKES, ids=NOT_WAKES.keys())
def test_the_activator_may_change_nothing_but_the_wake_annotation(chart_cluster: Cluster, change: str) -> None:
    vap = _wake_only(chart_cluster)
    verdict = evaluate(vap, _changed(NOT_WAKES[change]), _stored(), "UPDATE", user=ACTIVATOR_USER)
    assert verdict.matched and not verdict.allowed
    assert all(m.startswith(("the activator may not", "the activator's")) for m in verdict.messages)
    # The same write by anyone else is not this policy's business.
    for user in ("admin", f"system:serviceaccount:{h.RELEASE_NAMESPACE}:{FULLNAME}", ACTIVATOR_USER + "x"):
        assert not evaluate(vap, _changed(NOT_WAKES[change]), _stored(), "UPDATE", user=user).matched


def test_the_wake_only_policy_holds_for_objects_without_metadata_maps(chart_cluster: Cluster) -> None:
    """An object with no labels, annotations, finalizers or owners: the first wake passes, no error."""
    vap = _wake_only(chart_cluster)
    bare = inference_service({"model": {"uri": "pvc://m"}})
    woken = copy.deepcopy(bare)
    woken["metadata"]["annotations"] = {WAKE_ANNOTATION: STAMP}
    assert evaluate(vap, woken, bare, "UPDATE", user=ACTIVATOR_USER).allowed
    labelled = copy.deepcopy(woken)
    labelled["metadata"]["labels"] = {"a": "b"}
    assert not evaluate(vap, labelled, bare, "UPDATE", user=ACTIVATOR_USER).allowed


def test_the_wake_only_policy_binds_cluster_wide_and_names_the_activator(chart_cluster: Cluster) -> None:
    objects, _ = installed(chart_cluster, None)
    vap = h.one(objects, "ValidatingAdmissionPolicy", WAKE_ONLY)
    binding = h.one(objects, "ValidatingAdmissionPolicyBinding", WAKE_ONLY)
    account = h.one(objects, "ServiceAccount", ACTIVATOR)
    assert account["metadata"]["namespace"] == h.RELEASE_NAMESPACE
    role = h.one(objects, "ClusterRole", ACTIVATOR)
    assert [r["verbs"] for r in role["rules"] if "inferenceservices" in r["resources"]] == [["patch"]]
    assert vap["spec"]["failurePolicy"] == "Fail"
    assert vap["spec"]["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": ["inference.rocm.dev"],
            "apiVersions": ["*"],
            "operations": ["UPDATE"],
            "resources": ["inferenceservices"],
        }
    ]
    assert binding["spec"] == {"policyName": WAKE_ONLY, "validationActions": ["Deny"]}
    for obj in (vap, binding):
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize(
    "values",
    [
        {"activator": {"enabled": False}},
        {"policy": {"admission": {"enabled": False}}},
        {"watch": {"allNamespaces": False, "namespaces": ["ml"]}, "replicaCount": 1, "ha": {"enabled": False}},
    ],
    ids=["no-activator", "no-admission-policies", "namespaced"],
)
def test_no_wake_only_policy_without_an_activator_or_admission_policies(chart_cluster: Cluster, values: dict) -> None:
    objects, _ = installed(chart_cluster, values)
    assert not [o for o in objects if o["metadata"]["name"] == WAKE_ONLY]


# runtime.tracing.endpoint: refused at admission as the CRD refuses it (a cluster may keep a CRD
# from before the rule: Helm never upgrades one).
TRACING_CASES = [
    *[({}, endpoint) for endpoint in LOCAL_TRACING_ENDPOINTS + COLLECTOR_ENDPOINTS],
    *[({}, f"http://otel.observability:{port}/v1/traces") for port in (8080, 8081, 9090, 4318)],
    *[({"port": 8000}, f"http://otel.observability:{port}/v1/traces") for port in (8000, 8080)],
    *[({"metricsPort": 9100}, f"http://10.0.0.5:{port}/") for port in (9100, 9090)],
    *[({"grpcPort": 8500}, f"http://[2001:db8::1]:{port}/") for port in (8500, 8501)],
    ({"engine": "vllm"}, "http://127.0.0.1:8081/v1/load_lora_adapter"),
]


def _crd_messages(spec: dict[str, Any]) -> tuple[str, ...]:
    schema = crd_schema()
    errors = cel_errors(schema, apply_defaults(schema, inference_service(spec)))
    return tuple(e.split(": ", 1)[1] for e in errors)


def test_admission_refuses_the_tracing_endpoints_the_crd_refuses(chart_cluster: Cluster) -> None:
    objects, _ = installed(chart_cluster, None)
    vap = h.one(objects, "ValidatingAdmissionPolicy")
    refused = 0
    for runtime, endpoint in TRACING_CASES:
        spec = {"model": {"uri": "pvc://m"}, "runtime": {**runtime, "tracing": {"endpoint": endpoint}}}
        expected = _crd_messages(spec)
        assert admission_messages(vap, spec) == expected, (runtime, endpoint)
        refused += bool(expected)
    # Not vacuous: both rules refuse, and collectors pass.
    assert len(LOCAL_TRACING_ENDPOINTS) + 5 <= refused < len(TRACING_CASES)


def test_the_admission_policy_carries_the_crds_tracing_expressions(chart_cluster: Cluster) -> None:
    objects, _ = installed(chart_cluster, None)
    variables = {v["name"]: v["expression"] for v in h.one(objects, "ValidatingAdmissionPolicy")["spec"]["variables"]}
    assert variables["localHost"] == cel_string(runtime_model.TRACING_LOCAL_HOST)
    assert variables["numericHost"] == cel_string(runtime_model.TRACING_NUMERIC_HOST)
    assert variables["dottedHost"] == cel_string(runtime_model.TRACING_DOTTED_HOST)
