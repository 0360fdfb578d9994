"""routing.inferencePool's endpoint picker: the objects the operator deploys (valid as the API
server and the stand-in InferencePool CRD judge them), the picker's configuration, its RBAC, and
its removal when no picker of ours is wanted any more."""

from __future__ import annotations

import copy
import json

import kubernetes
import kubernetes_validate
import pytest

from inference_operator.builders import Owner, build_all, build_deployment, build_service
from inference_operator.builders.common import Role, selector_labels
from inference_operator.builders.endpoint_picker import (
    CLUSTER_ROLE,
    GRPC_PORT,
    HEALTH_PORT,
    build_endpoint_picker,
    picker_config,
)
from inference_operator.config import OperatorConfig
from inference_operator.k8s import KubeApi, Ref
from inference_operator.models import Engine, SpecError, parse_spec
from inference_operator.reconcile import Action, Change, prune, reconcile
from inference_operator.settings import ENDPOINT_PICKER_IMAGE_ENV, Images
from testsupport.cluster import Cluster
from testsupport.crd import ROOT, addon_errors, apply_defaults, crd_schema, validate_custom_resource
from testsupport.emulator import declare

NS, NAME, PICKER = "ml", "llama", "llama-epp"
K8S_VERSION = "1.33"
SPEC_SCHEMA = crd_schema()["properties"]["spec"]
PICKER_REFS = [
    Ref("v1", "ServiceAccount", NS, PICKER),
    Ref("rbac.authorization.k8s.io/v1", "RoleBinding", NS, PICKER),
    Ref("apps/v1", "Deployment", NS, PICKER),
    Ref("v1", "Service", NS, PICKER),
]
POOL = Ref("inference.networking.k8s.io/v1", "InferencePool", NS, NAME)


def spec(**routing: object) -> dict:
    return {
        "model": {"uri": "pvc://models/llama", "name": "llama"},
        "runtime": {"engine": "vllm"},
        "resources": {"gpu": {"count": 2}},
        "routing": {"inferencePool": True, **routing},
    }


def owner(raw: dict, name: str = NAME, images: Images | None = None) -> Owner:
    parsed = parse_spec(apply_defaults(SPEC_SCHEMA, copy.deepcopy(raw)))
    return Owner(name=name, namespace=NS, uid="u-1", spec=parsed, images=images or Images())


def by_kind(objects: list[dict]) -> dict[str, dict]:
    return {o["kind"]: o for o in objects}


def picker_objects(raw: dict) -> dict[str, dict]:
    return by_kind(build_endpoint_picker(owner(raw)))


def args_of(deployment: dict) -> dict[str, str]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(arg.removeprefix("--").split("=", 1) for arg in container["args"])


def test_every_object_is_valid_and_the_pool_names_the_pickers_service() -> None:
    objects = build_all(owner(spec()))
    kinds = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert kinds == [
        ("Deployment", NAME),
        ("Service", NAME),
        ("ServiceAccount", PICKER),
        ("RoleBinding", PICKER),
        ("Deployment", PICKER),
        ("Service", PICKER),
        ("InferencePool", NAME),
    ]
    for obj in objects:
        if obj["kind"] == "InferencePool":
            assert addon_errors(obj) == []
        else:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "u-1"
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "rocm-inference-operator"
    pool = objects[-1]
    service = picker_objects(spec())["Service"]
    grpc = next(p for p in service["spec"]["ports"] if p["name"] == "grpc-ext-proc")
    assert pool["spec"]["endpointPickerRef"] == {
        "group": "",
        "kind": "Service",
        "name": PICKER,
        "port": {"number": grpc["port"]},
        "failureMode": "FailClose",
    }
    assert grpc == {"name": "grpc-ext-proc", "port": GRPC_PORT, "targetPort": "grpc", "protocol": "TCP"}


def test_the_service_port_follows_the_spec_and_targets_the_pickers_grpc_port() -> None:
    objects = build_all(owner(spec(endpointPicker={"port": 9102, "failureMode": "FailOpen"})))
    pool = objects[-1]
    assert pool["spec"]["endpointPickerRef"]["port"] == {"number": 9102}
    assert addon_errors(pool) == []
    service = by_kind([o for o in objects if o["metadata"]["name"] == PICKER])["Service"]
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        "grpc-ext-proc": (9102, "grpc"),
        "http-metrics": (9090, "metrics"),
    }


def test_the_picker_is_not_one_of_the_pools_pods() -> None:
    o = owner(spec())
    objects = picker_objects(spec())
    pod_labels = objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert objects["Service"]["spec"]["selector"] == objects["Deployment"]["spec"]["selector"]["matchLabels"]
    assert objects["Service"]["spec"]["selector"].items() <= pod_labels.items()
    # Neither the pool nor the model's Service selects it; it selects no model pod.
    assert not selector_labels(o).items() <= pod_labels.items()
    assert not build_service(o)["spec"]["selector"].items() <= pod_labels.items()
    model_pods = build_deployment(o)["spec"]["template"]["metadata"]["labels"]
    assert not objects["Service"]["spec"]["selector"].items() <= model_pods.items()


def test_the_picker_serves_the_pool_with_the_scorers_and_their_default_weights() -> None:
    deployment = picker_objects(spec())["Deployment"]
    args = args_of(deployment)
    assert (args["pool-name"], args["pool-namespace"], args["pool-group"]) == (
        NAME,
        NS,
        "inference.networking.k8s.io",
    )
    assert (args["grpc-port"], args["grpc-health-port"], args["metrics-port"]) == ("9002", "9003", "9090")
    assert args["metrics-endpoint-auth"] == "false"  # it would need cluster-wide tokenreviews
    config = json.loads(args["config-text"])
    assert config["kind"] == "EndpointPickerConfig"
    assert config["apiVersion"] == "inference.networking.x-k8s.io/v1alpha1"
    types = [p["type"] for p in config["plugins"]]
    assert types == [
        "prefix-cache-scorer",
        "queue-scorer",
        "kv-cache-utilization-scorer",
        "lora-affinity-scorer",
        "max-score-picker",
    ]
    (profile,) = config["schedulingProfiles"]
    weights = {p["pluginRef"]: p.get("weight") for p in profile["plugins"]}
    assert weights == {
        "prefix-cache-scorer": 3,
        "queue-scorer": 2,
        "kv-cache-utilization-scorer": 2,
        "lora-affinity-scorer": 1,
        "max-score-picker": None,
    }
    # Every profile entry names a declared plugin.
    assert set(weights) == set(types)


def test_weights_come_from_the_spec_and_zero_leaves_a_scorer_out() -> None:
    raw = spec(endpointPicker={"weights": {"prefixCache": 10, "queue": 0, "loraAffinity": 5}})
    config = picker_config(owner(raw))
    (profile,) = config["schedulingProfiles"]
    assert [(p["pluginRef"], p.get("weight")) for p in profile["plugins"]] == [
        ("prefix-cache-scorer", 10),
        ("kv-cache-utilization-scorer", 2),
        ("lora-affinity-scorer", 5),
        ("max-score-picker", None),
    ]
    assert "queue-scorer" not in [p["type"] for p in config["plugins"]]
    # The config text on the Deployment is this config; a change rolls the picker.
    assert json.loads(args_of(picker_objects(raw)["Deployment"])["config-text"]) == config


@pytest.mark.parametrize(
    ("picker", "words"),
    [
        ({"weights": {"queue": 101}}, "queue"),
        ({"weights": {"prefixCache": -1}}, "prefixCache"),
        ({"name": "gw-epp", "weights": {"queue": 1}}, "not an external one"),
        ({"port": 9090}, "metrics port"),
    ],
)
def test_the_crd_and_the_model_refuse_bad_picker_settings(picker: dict, words: str) -> None:
    doc = {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": spec(endpointPicker=picker),
    }
    errors = validate_custom_resource(doc)
    assert any(words in e for e in errors), errors
    with pytest.raises(SpecError):
        parse_spec(doc["spec"])


def test_rbac_binds_only_the_charts_cluster_role_to_the_pickers_account() -> None:
    objects = picker_objects(spec())
    binding = objects["RoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CLUSTER_ROLE}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": PICKER, "namespace": NS}]
    assert binding["metadata"]["namespace"] == NS
    assert objects["ServiceAccount"]["metadata"]["name"] == PICKER
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == PICKER and pod["automountServiceAccountToken"] is True
    chart_role = (ROOT / "charts" / "rocm-inference-operator" / "templates" / "endpoint-picker-rbac.yaml").read_text()
    assert f"name: {CLUSTER_ROLE}\n" in chart_role


def test_the_pickers_pod_is_restricted_probed_on_grpc_health_and_runs_the_platforms_image() -> None:
    images = Images(endpoint_picker="registry.example/epp:v1")
    deployment = by_kind(build_endpoint_picker(owner(spec(), images=images)))["Deployment"]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    assert container["image"] == "registry.example/epp:v1"
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False and security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert {"cpu", "memory"} <= set(container["resources"]["limits"])
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["grpc"] == {"port": HEALTH_PORT, "service": "inference-extension"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": 9002, "grpc-health": 9003, "metrics": 9090}


def test_the_image_comes_from_the_operators_environment() -> None:
    config = OperatorConfig.from_environ({ENDPOINT_PICKER_IMAGE_ENV: "mirror.example/epp:v2"}, {Engine.VLLM: "v/llm:1"})
    assert config.images.endpoint_picker == "mirror.example/epp:v2" and config.images.serving(Engine.VLLM) == "v/llm:1"
    assert OperatorConfig.from_environ({}).images.endpoint_picker == Images().endpoint_picker


def test_an_external_picker_deploys_nothing_and_no_pool_no_picker() -> None:
    external = build_all(owner(spec(endpointPicker={"name": "gw-epp"})))
    assert [o["kind"] for o in external] == ["Deployment", "Service", "InferencePool"]
    assert external[-1]["spec"]["endpointPickerRef"]["name"] == "gw-epp"
    plain = spec()
    plain["routing"] = {}
    assert [o["kind"] for o in build_all(owner(plain))] == ["Deployment", "Service"]


def test_a_name_too_long_for_the_pickers_service_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="routing.endpointPicker"):
        build_all(owner(spec(), name="l" * 60))
    assert build_all(owner(spec(endpointPicker={"name": "gw-epp"}), name="l" * 60))  # nothing of ours to name


@pytest.fixture
def api(cluster: Cluster) -> KubeApi:
    declare(cluster.emulator, "inference.networking.k8s.io/v1/inferencepools", "InferencePool")
    return KubeApi(kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig)), timeout=10)


def deleted(result_changes: list[Change]) -> set[tuple[str, str]]:
    return {(c.kind, c.name) for c in result_changes if c.action == Action.DELETED}


def test_the_picker_is_created_then_pruned_when_the_pool_goes_or_an_external_picker_is_named(api: KubeApi) -> None:
    result = reconcile(api, owner(spec()))
    assert {(c.kind, c.name) for c in result.changes if c.action == Action.CREATED} >= {
        (r.kind, r.name) for r in PICKER_REFS
    }
    assert all(api.get(ref) is not None for ref in [*PICKER_REFS, POOL])
    assert result.workloads[Role.PREDICTOR]["metadata"]["name"] == NAME
    again = reconcile(api, owner(spec()))
    assert again.writes == []

    # An external picker: the pool stays and names it, ours goes.
    result = reconcile(api, owner(spec(endpointPicker={"name": "gw-epp"})))
    assert deleted(result.changes) == {(r.kind, r.name) for r in PICKER_REFS}
    assert all(api.get(ref) is None for ref in PICKER_REFS)
    assert api.get(POOL)["spec"]["endpointPickerRef"]["name"] == "gw-epp"

    # Ours again, then the pool off: both go, the service's own Deployment and Service stay.
    reconcile(api, owner(spec()))
    assert all(api.get(ref) is not None for ref in PICKER_REFS)
    off = spec()
    off["routing"] = {}
    result = reconcile(api, owner(off))
    assert deleted(result.changes) == {(r.kind, r.name) for r in PICKER_REFS} | {("InferencePool", NAME)}
    assert all(api.get(ref) is None for ref in [*PICKER_REFS, POOL])
    assert api.get(Ref("apps/v1", "Deployment", NS, NAME)) is not None
    assert api.get(Ref("v1", "Service", NS, NAME)) is not None


def test_another_services_picker_is_never_pruned(api: KubeApi) -> None:
    reconcile(api, owner(spec()))
    off = spec()
    off["routing"] = {}
    other = Owner(name=NAME, namespace=NS, uid="u-2", spec=owner(off).spec)  # same name, not the owner
    assert prune(api, other, build_all(other)) == []
    assert all(api.get(ref) is not None for ref in PICKER_REFS)
