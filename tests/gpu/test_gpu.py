"""AMD GPU wiring in every allocation mode: what a spec becomes, and that Kubernetes accepts it.

Modes: the device plugin with `single` naming (amd.com/gpu + labeller node labels), with `mixed`
naming (amd.com/<partition>), and DRA (a resource.k8s.io/v1 ResourceClaimTemplate the pod
references). Every object is validated with kubernetes-validate (strict) for Kubernetes 1.34, the
first release serving resource.k8s.io/v1, and the newest release kubernetes-validate knows.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from decimal import Decimal
from typing import Any

import celpy
import celpy.celtypes
import kmock
import kubernetes
import kubernetes_validate
import pytest
import yaml
from kubernetes.utils import parse_quantity

from inference_operator.builders import Owner, build_all
from inference_operator.builders.gpu import CLAIM_HASH_ANNOTATION, dra_selectors
from inference_operator.k8s import KubeApi, Ref
from inference_operator.models import GpuAllocation, ResourceNaming, SpecError, parse_spec
from inference_operator.reconcile import Action, Change, reconcile
from inference_operator.settings import GpuDefaults, SettingsError
from inference_operator.validation import evaluate_rule, validate_custom_resource
from testsupport.cluster import Cluster
from testsupport.crd import ROOT, crd_schema

KUBERNETES_VERSIONS = sorted({"1.34", kubernetes_validate.latest_version()})
PLUGIN = GpuDefaults()
MIXED = GpuDefaults(resource_naming=ResourceNaming.MIXED)
DRA = GpuDefaults(allocation=GpuAllocation.DRA)
MI300X = "AMD_Instinct_MI300X_OAM"


def render(gpu: dict, defaults: GpuDefaults = PLUGIN, **spec: Any) -> list[dict]:
    spec = {"model": {"uri": "pvc://models/m"}, "resources": {"gpu": gpu}, **spec}
    return build_all(Owner(name="m", namespace="ml", uid="u-1", spec=parse_spec(spec), gpu_defaults=defaults))


def one(objects: list[dict], kind: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def pod_of(objects: list[dict]) -> dict:
    return one(objects, "Deployment")["spec"]["template"]["spec"]


def what_the_pod_gets(objects: list[dict]) -> dict:
    """The GPU-relevant parts of the pod, in a shape a table row can state."""
    pod = pod_of(objects)
    container = pod["containers"][0]
    limits = container["resources"]["limits"]
    terms = (pod.get("affinity") or {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    templates = [o for o in objects if o["kind"] == "ResourceClaimTemplate"]
    return {
        "resources": {k: v for k, v in limits.items() if k.startswith("amd.com/")},
        "claims": [c["name"] for c in container["resources"].get("claims", [])],
        "claim_count": templates[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"]
        if templates
        else None,
        "env": {e["name"]: e["value"] for e in container["env"] if e["name"].endswith("VISIBLE_DEVICES")},
        "affinity": [
            {e["key"]: e["values"][0] for e in term["matchExpressions"]}
            for term in (terms or {}).get("nodeSelectorTerms", [])
        ],
        "groups": pod["securityContext"].get("supplementalGroups"),
    }


ENV_2 = {"ROCR_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "0,1"}
PARTITION_TERMS = [
    {"amd.com/gpu.product-name": MI300X, "amd.com/gpu.compute-memory-partition": "cpx_nps4"},
    {"amd.com/gpu.product-name": MI300X, "amd.com/compute-memory-partition": "cpx_nps4"},
]

TABLE = [
    pytest.param(
        {"count": 2},
        PLUGIN,
        {"resources": {"amd.com/gpu": "2"}, "claims": [], "claim_count": None, "env": ENV_2, "affinity": []},
        id="single-plain",
    ),
    pytest.param(
        {"count": 2, "productName": MI300X, "partition": "cpx_nps4"},
        PLUGIN,
        {
            "resources": {"amd.com/gpu": "2"},
            "claims": [],
            "claim_count": None,
            "env": ENV_2,
            "affinity": PARTITION_TERMS,
        },
        id="single-partition-both-label-spellings",
    ),
    pytest.param(
        {"count": 2, "productName": MI300X, "partition": "cpx_nps4"},
        MIXED,
        {
            "resources": {"amd.com/cpx_nps4": "2"},
            "claims": [],
            "claim_count": None,
            "env": ENV_2,
            "affinity": [{"amd.com/gpu.product-name": MI300X}],
        },
        id="mixed-partition-is-the-resource",
    ),
    pytest.param(
        {"count": 2, "partition": "cpx_nps4", "resourceNaming": "mixed"},
        PLUGIN,
        {"resources": {"amd.com/cpx_nps4": "2"}, "claims": [], "claim_count": None, "env": ENV_2, "affinity": []},
        id="mixed-from-the-spec",
    ),
    pytest.param(
        {"count": 2, "partition": "cpx_nps4", "resourceNaming": "single"},
        MIXED,
        {
            "resources": {"amd.com/gpu": "2"},
            "claims": [],
            "claim_count": None,
            "env": ENV_2,
            "affinity": [{k: v for k, v in t.items() if "partition" in k} for t in PARTITION_TERMS],
        },
        id="spec-naming-wins-over-the-operator",
    ),
    pytest.param(
        {"count": 1, "family": "AI"},
        MIXED,
        {
            "resources": {"amd.com/gpu": "1"},
            "claims": [],
            "claim_count": None,
            "env": {"ROCR_VISIBLE_DEVICES": "0", "HIP_VISIBLE_DEVICES": "0"},
            "affinity": [{"amd.com/gpu.family": "AI"}],
        },
        id="mixed-without-partition-is-amd-gpu",
    ),
    pytest.param(
        {"count": 2, "allocation": "dra", "productName": MI300X, "partition": "cpx_nps4"},
        PLUGIN,
        {"resources": {}, "claims": ["gpu"], "claim_count": 2, "env": ENV_2, "affinity": []},
        id="dra-from-the-spec",
    ),
    pytest.param(
        {"count": 3, "visibleDevices": "2,0,1"},
        DRA,
        {
            "resources": {},
            "claims": ["gpu"],
            "claim_count": 3,
            "env": {"ROCR_VISIBLE_DEVICES": "2,0,1", "HIP_VISIBLE_DEVICES": "0,1,2"},
            "affinity": [],
        },
        id="dra-from-the-operator-with-visible-devices",
    ),
    pytest.param(
        {"count": 2, "allocation": "devicePlugin"},
        DRA,
        {"resources": {"amd.com/gpu": "2"}, "claims": [], "claim_count": None, "env": ENV_2, "affinity": []},
        id="spec-allocation-wins-over-the-operator",
    ),
]


@pytest.mark.parametrize(("gpu", "defaults", "expected"), TABLE)
def test_spec_to_resource_claim_env_and_affinity(gpu: dict, defaults: GpuDefaults, expected: dict) -> None:
    got = what_the_pod_gets(render(gpu, defaults))
    got.pop("groups")
    assert got == expected


@pytest.mark.parametrize(("gpu", "defaults", "_expected"), TABLE)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_mode_is_valid_kubernetes(gpu: dict, defaults: GpuDefaults, _expected: dict, version: str) -> None:
    for obj in render(gpu, defaults):
        kubernetes_validate.validate(obj, version, strict=True)


def test_mixed_naming_asks_for_the_partition_resource_and_nothing_else() -> None:
    objects = render({"count": 4, "partition": "cpx_nps4"}, MIXED)
    resources = pod_of(objects)["containers"][0]["resources"]
    assert resources["requests"]["amd.com/cpx_nps4"] == resources["limits"]["amd.com/cpx_nps4"] == "4"
    assert "amd.com/gpu" not in resources["requests"] and "amd.com/gpu" not in resources["limits"]


def test_dra_makes_a_claim_template_the_pod_references_and_no_extended_resource() -> None:
    objects = render({"count": 2, "productName": MI300X, "family": "AI", "vram": "192G", "partition": "spx_nps1"}, DRA)
    assert [o["kind"] for o in objects][:2] == ["ResourceClaimTemplate", "Deployment"]  # applied before its users
    template = one(objects, "ResourceClaimTemplate")
    assert template["apiVersion"] == "resource.k8s.io/v1"
    assert template["metadata"]["name"] == "m" and template["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    exactly = request["exactly"]
    assert (exactly["deviceClassName"], exactly["allocationMode"], exactly["count"]) == ("gpu.amd.com", "ExactCount", 2)
    assert len(exactly["selectors"]) == 4
    pod = pod_of(objects)
    assert pod["resourceClaims"] == [{"name": request["name"], "resourceClaimTemplateName": "m"}]
    container = pod["containers"][0]
    assert container["resources"]["claims"] == [{"name": request["name"]}]
    requested = {**container["resources"]["requests"], **container["resources"]["limits"]}
    assert not [name for name in requested if name.startswith("amd.com/")]
    assert "affinity" not in pod  # the scheduler places claims; no labeller labels involved
    for init in pod.get("initContainers", []):
        assert "claims" not in init["resources"]
    # The generated claims carry the service's labels, so they can be found.
    assert template["spec"]["metadata"]["labels"]["inference.rocm.dev/inference-service"] == "m"


def test_a_claim_change_rolls_the_pods_and_nothing_else_does() -> None:
    """A template's spec is immutable; the pods must pick up a replaced one."""

    def annotation(gpu: dict, **spec: Any) -> str:
        return one(render(gpu, DRA, **spec), "Deployment")["spec"]["template"]["metadata"]["annotations"][
            CLAIM_HASH_ANNOTATION
        ]

    base = annotation({"count": 2, "productName": MI300X})
    assert annotation({"count": 2, "productName": MI300X}, replicas=3) == base
    assert annotation({"count": 2, "productName": "AMD_Instinct_MI325X_OAM"}) != base
    assert annotation({"count": 2, "productName": MI300X, "deviceClassName": "mi300x.example.com"}) != base
    assert (
        CLAIM_HASH_ANNOTATION
        not in one(render({"count": 2}), "Deployment")["spec"]["template"]["metadata"]["annotations"]
    )


def test_cpu_only_gets_no_gpu_wiring_in_any_mode() -> None:
    for defaults in (PLUGIN, MIXED, DRA):
        objects = render({"count": 0}, defaults, runtime={"executionProviders": ["CPUExecutionProvider"]})
        assert [o["kind"] for o in objects] == ["Deployment", "Service"]
        got = what_the_pod_gets(objects)
        assert got == {"resources": {}, "claims": [], "claim_count": None, "env": {}, "affinity": [], "groups": None}
        assert "tolerations" not in pod_of(objects) and "resourceClaims" not in pod_of(objects)


@pytest.mark.parametrize(
    ("gpu", "defaults", "groups"),
    [
        ({"count": 1}, PLUGIN, [44, 109]),
        ({"count": 1}, GpuDefaults(supplemental_groups=(44, 992)), [44, 992]),
        ({"count": 1, "supplementalGroups": [110]}, GpuDefaults(supplemental_groups=(44, 992)), [110]),
        ({"count": 1, "allocation": "dra", "supplementalGroups": [991]}, PLUGIN, [991]),
        ({"count": 1, "supplementalGroups": []}, PLUGIN, None),
        ({"count": 1}, GpuDefaults(supplemental_groups=()), None),
    ],
)
def test_device_groups_come_from_the_spec_else_the_operator(gpu: dict, defaults: GpuDefaults, groups: Any) -> None:
    assert what_the_pod_gets(render(gpu, defaults))["groups"] == groups


# --- DRA selectors, evaluated as the scheduler would, against devices as the AMD driver publishes them


def _quantity(text: Any) -> celpy.celtypes.Value:
    return celpy.celtypes.DoubleType(float(parse_quantity(str(text))))


def _compare_to(left: Any, right: Any) -> celpy.celtypes.Value:
    return celpy.celtypes.IntType((left > right) - (left < right))


def selects(gpu: dict, device: dict) -> bool:
    """Whether every CEL selector of `gpu`'s claim accepts `device` (attributes and capacity)."""
    spec = parse_spec({"model": {"uri": "pvc://m"}, "resources": {"gpu": gpu}}).resources.gpu
    environment = celpy.Environment()
    activation = {
        "device": celpy.json_to_cel(
            {
                "driver": "gpu.amd.com",
                "attributes": {"gpu.amd.com": device["attributes"]},
                "capacity": {"gpu.amd.com": {"memory": float(parse_quantity(device["memory"]))}},
            }
        )
    }
    functions = {"quantity": _quantity, "compareTo": _compare_to}
    results = [
        environment.program(environment.compile(e), functions=functions).evaluate(activation)
        for e in dra_selectors(spec)
    ]
    return all(bool(r) for r in results)


def _device(profile: str, memory: str, product: str = MI300X, family: str = "AI") -> dict:
    kind = "amdgpu" if profile.startswith("spx") else "amdgpu-partition"
    attributes = {"type": kind, "productName": product, "family": family, "partitionProfile": profile}
    return {"attributes": attributes, "memory": memory}


WHOLE_MI300X = _device("spx_nps1", "192Gi")
CPX_NPS4 = _device("cpx_nps4", "24Gi")  # one of 64 partitions of eight MI300X


@pytest.mark.parametrize(
    ("gpu", "device", "selected"),
    [
        ({"partition": "cpx_nps4"}, CPX_NPS4, True),
        ({"partition": "cpx_nps4"}, WHOLE_MI300X, False),
        ({"partition": "spx_nps1", "vram": "192G"}, WHOLE_MI300X, True),
        ({"vram": "192G"}, _device("spx_nps1", "191.6Gi"), True),  # the labeller's rounding
        ({"vram": "192G"}, _device("spx_nps1", "191Gi"), False),
        ({"vram": "192G"}, _device("spx_nps1", "256Gi"), False),
        ({"vram": "24G", "productName": MI300X}, CPX_NPS4, True),
        ({"productName": "AMD_Instinct_MI325X_OAM"}, WHOLE_MI300X, False),
        ({"family": "AI", "productName": MI300X}, WHOLE_MI300X, True),
        ({"family": "HPC"}, WHOLE_MI300X, False),
    ],
)
def test_dra_selectors_pick_the_devices_the_spec_describes(gpu: dict, device: dict, selected: bool) -> None:
    assert selects({"count": 1, "allocation": "dra", **gpu}, device) is selected


# --- Bad GPU specs: refused by the CRD's CEL rules and by the model, naming the field


def verdict(spec: dict) -> list[str]:
    """The API server's refusals of an InferenceService with `spec` (schema, defaults, CEL)."""
    document = {"apiVersion": "inference.rocm.dev/v1alpha1", "kind": "InferenceService"}
    return validate_custom_resource({**document, "metadata": {"name": "m"}, "spec": spec})


@pytest.mark.parametrize(
    ("visible", "count", "problem"),
    [("0,2", 2, "0 to resources.gpu.count-1"), ("0,0", 2, "twice"), ("1,01", 2, "twice"), ("0", 2, "exactly")],
)
def test_bad_visible_devices_are_refused_naming_the_field(visible: str, count: int, problem: str) -> None:
    spec = {"model": {"uri": "pvc://m"}, "resources": {"gpu": {"count": count, "visibleDevices": visible}}}
    refusals = verdict(spec)
    assert refusals and all(r.startswith("spec.resources.gpu.visibleDevices: ") for r in refusals), refusals
    assert any(problem in r for r in refusals)
    with pytest.raises(SpecError, match=f"resources.gpu.visibleDevices.*{problem}"):
        parse_spec(spec)


@pytest.mark.parametrize(
    "gpu", [{}, {"count": 1}, {"count": 3, "visibleDevices": "2,0,1"}, {"visibleDevices": "0"}, {"count": 0}]
)
def test_gpu_rules_hold_on_defaults_and_partial_objects(gpu: dict) -> None:
    node = crd_schema()["properties"]["spec"]["properties"]["resources"]["properties"]["gpu"]
    for rule in node["x-kubernetes-validations"]:
        assert evaluate_rule(rule, gpu, node) is None, (rule, gpu)  # as written: no defaults applied
    spec = {"model": {"uri": "pvc://m"}, "resources": {"gpu": gpu}}
    if gpu.get("count") == 0:
        spec["runtime"] = {"executionProviders": ["CPUExecutionProvider"]}
    assert verdict(spec) == []


@pytest.mark.parametrize("partition", ["cpx_nps4", "spx_nps1", "dpx_nps2", "qpx_nps1", "tpx_nps1"])
def test_partition_names_as_the_device_plugin_advertises_them(partition: str) -> None:
    assert parse_spec({"model": {"uri": "pvc://m"}, "resources": {"gpu": {"partition": partition}}})


@pytest.mark.parametrize("partition", ["CPX_NPS4", "cpx", "cpx-nps4", "xpx_nps1", "cpx_nps3", "gpu"])
def test_unknown_partition_names_are_refused(partition: str) -> None:
    with pytest.raises(SpecError, match="spec.resources.gpu.partition"):
        parse_spec({"model": {"uri": "pvc://m"}, "resources": {"gpu": {"partition": partition}}})


# --- Operator-level defaults


def test_operator_defaults_come_from_its_environment() -> None:
    assert GpuDefaults.from_env({}) == GpuDefaults()
    assert GpuDefaults.from_env(
        {
            "INFERENCE_OPERATOR_GPU_ALLOCATION": "dra",
            "INFERENCE_OPERATOR_GPU_RESOURCE_NAMING": "mixed",
            "INFERENCE_OPERATOR_GPU_SUPPLEMENTAL_GROUPS": "44, 992",
        }
    ) == GpuDefaults(allocation=GpuAllocation.DRA, resource_naming=ResourceNaming.MIXED, supplemental_groups=(44, 992))
    assert GpuDefaults.from_env({"INFERENCE_OPERATOR_GPU_SUPPLEMENTAL_GROUPS": ""}).supplemental_groups == ()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("INFERENCE_OPERATOR_GPU_ALLOCATION", "plugin"),
        ("INFERENCE_OPERATOR_GPU_RESOURCE_NAMING", "Mixed"),
        ("INFERENCE_OPERATOR_GPU_SUPPLEMENTAL_GROUPS", "video,render"),
        ("INFERENCE_OPERATOR_GPU_SUPPLEMENTAL_GROUPS", "-1"),
        ("INFERENCE_OPERATOR_GPU_SUPPLEMENTAL_GROUPS", "44,0"),  # root's group, in every container
    ],
)
def test_bad_operator_settings_are_named(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=name):
        GpuDefaults.from_env({name: value})


# --- The examples for each mode


def test_the_mode_examples_render_what_they_promise() -> None:
    def rendered(path: str) -> list[dict]:
        doc = yaml.safe_load((ROOT / "examples" / path).read_text())
        owner = Owner(doc["metadata"]["name"], "ml", "u-1", parse_spec(doc["spec"]), gpu_defaults=PLUGIN)
        return build_all(owner)

    dra = rendered("resnet-dra.yaml")
    assert one(dra, "ResourceClaimTemplate")["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 2
    assert "amd.com/gpu" not in json.dumps(pod_of(dra)["containers"][0]["resources"])
    mixed = rendered("bert-cpx-mixed.yaml")
    assert pod_of(mixed)["containers"][0]["resources"]["limits"]["amd.com/cpx_nps4"] == "1"
    assert pod_of(mixed)["securityContext"]["supplementalGroups"] == [44, 992]
    for version in KUBERNETES_VERSIONS:
        for obj in [*dra, *mixed]:
            kubernetes_validate.validate(copy.deepcopy(obj), version, strict=True)


def test_vram_bounds_are_exact_decimals() -> None:
    (expression,) = dra_selectors(
        parse_spec({"model": {"uri": "pvc://m"}, "resources": {"gpu": {"vram": "192G"}}}).resources.gpu
    )
    assert 'quantity("191.5Gi")' in expression and 'quantity("192.5Gi")' in expression
    assert Decimal(parse_quantity("191.5Gi")) == Decimal(191.5) * 2**30


# --- render: the operator's GPU settings as flags, and the per-pod GPU view docs/gpu-allocation.md shows


def run_render(*args: str, stdin: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("INFERENCE_OPERATOR_GPU_")}
    return subprocess.run(
        [sys.executable, "-m", "inference_operator", "render", *args],
        capture_output=True,
        text=True,
        input=stdin,
        env={**clean, **(env or {})},
        timeout=60,
        check=False,
    )


PARTITIONED = yaml.safe_dump(
    {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": {"model": {"uri": "pvc://m"}, "resources": {"gpu": {"count": 2, "partition": "cpx_nps4"}}},
    }
)


def test_render_takes_the_operator_settings_as_flags_or_environment() -> None:
    plain = yaml.safe_load(run_render("--gpu-view", "-f", "-", stdin=PARTITIONED).stdout)
    assert plain["resources"]["limits"] == {"amd.com/gpu": "2"}
    mixed = yaml.safe_load(
        run_render("--gpu-view", "--gpu-resource-naming", "mixed", "-f", "-", stdin=PARTITIONED).stdout
    )
    assert mixed["resources"]["limits"] == {"amd.com/cpx_nps4": "2"}
    from_env = run_render("-f", "-", stdin=PARTITIONED, env={"INFERENCE_OPERATOR_GPU_ALLOCATION": "dra"})
    kinds = [o["kind"] for o in yaml.safe_load_all(from_env.stdout)]
    assert kinds[0] == "ResourceClaimTemplate"
    groups = run_render("--gpu-view", "--gpu-supplemental-groups", "44,992", "-f", "-", stdin=PARTITIONED)
    assert yaml.safe_load(groups.stdout)["supplementalGroups"] == [44, 992]


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--gpu-supplemental-groups", "video"], {}, "--gpu-supplemental-groups='video': must be comma-separated"),
        ([], {"INFERENCE_OPERATOR_GPU_RESOURCE_NAMING": "both"}, "INFERENCE_OPERATOR_GPU_RESOURCE_NAMING='both'"),
    ],
)
def test_render_refuses_bad_gpu_settings_by_name(args: list[str], env: dict, message: str) -> None:
    result = run_render(*args, "-f", "-", stdin=PARTITIONED, env=env)
    assert result.returncode == 2 and message in result.stderr and result.stdout == ""


def test_the_docs_gpu_snippets_are_the_render_output() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "docs_gpu_view.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    page = (ROOT / "docs" / "gpu-allocation.md").read_text()
    for example in ("llama-torch-8gpu", "bert-cpx-mixed", "resnet-dra"):
        assert f"<!-- render: --gpu-view -f examples/{example}.yaml -->" in page


def test_the_operator_refuses_to_start_on_a_bad_gpu_setting() -> None:
    """A bad chart value stops `run` at once, named, instead of failing every reconcile."""
    result = subprocess.run(
        [sys.executable, "-m", "inference_operator", "run", "--all-namespaces", "--metrics-port", "0"],
        capture_output=True,
        text=True,
        env={**os.environ, "INFERENCE_OPERATOR_GPU_SUPPLEMENTAL_GROUPS": "44,render"},
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "INFERENCE_OPERATOR_GPU_SUPPLEMENTAL_GROUPS='44,render'" in result.stderr


# --- The claim template in a cluster: replaced when it changes (its spec is immutable)


def test_a_changed_claim_template_is_replaced_and_the_pods_roll(cluster: Cluster) -> None:
    api = KubeApi(kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig)), timeout=10)
    template_ref = Ref("resource.k8s.io/v1", "ResourceClaimTemplate", "ml", "m")
    deployment_ref = Ref("apps/v1", "Deployment", "ml", "m")

    def reconciled(gpu: dict) -> list[Change]:
        spec = parse_spec({"model": {"uri": "pvc://models/m"}, "resources": {"gpu": {"allocation": "dra", **gpu}}})
        return reconcile(api, Owner(name="m", namespace="ml", uid="u-1", spec=spec)).changes

    assert Change(Action.CREATED, "ResourceClaimTemplate", "m") in reconciled({"count": 1})
    first = api.get(deployment_ref)["spec"]["template"]["metadata"]["annotations"][CLAIM_HASH_ANNOTATION]
    assert Change(Action.UNCHANGED, "ResourceClaimTemplate", "m") in reconciled({"count": 1})
    deletes_before = len([r for r in cluster.emulator if r.method == kmock.method.DELETE])

    assert Change(Action.REPLACED, "ResourceClaimTemplate", "m") in reconciled({"count": 2})
    deletes = [r for r in list(cluster.emulator) if r.method == kmock.method.DELETE][deletes_before:]
    assert [(r.resource.plural, r.name) for r in deletes] == [("resourceclaimtemplates", "m")]
    template = api.get(template_ref)
    assert template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 2
    second = api.get(deployment_ref)["spec"]["template"]["metadata"]["annotations"][CLAIM_HASH_ANNOTATION]
    assert second != first  # a new pod template: the Deployment rolls onto claims from the new template

    changes = reconciled({"count": 2, "allocation": "devicePlugin"})
    assert Change(Action.DELETED, "ResourceClaimTemplate", "m") in changes
    assert api.get(template_ref) is None
