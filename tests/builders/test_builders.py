"""Spec → manifests: the AMD GPU wiring, storage, probes and schema validity of every object."""

from __future__ import annotations

import kubernetes_validate
import pytest

from inference_operator.builders import Owner, build_all, build_deployment, build_service
from inference_operator.builders.common import selector_string
from inference_operator.builders.compile_cache import MIGRAPHX, MIOPEN
from inference_operator.builders.deployment import service_values
from inference_operator.builders.storage import MODEL_DIR
from inference_operator.engines.model_server import server_args
from inference_operator.models import OPERATOR_ENV, OPERATOR_FLAGS, SpecError, parse_spec

UID = "7f1c3f9e-0000-4000-8000-000000000001"


def owner(**spec) -> Owner:
    spec.setdefault("model", {"uri": "pvc://models/resnet50"})
    return Owner(name="resnet", namespace="ml", uid=UID, spec=parse_spec(spec))


def pod(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def container(obj: dict) -> dict:
    return pod(obj)["containers"][0]


def env(obj: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(obj)["env"]}


@pytest.mark.parametrize("count", [1, 2, 8])
def test_gpu_count_becomes_limit_request_and_visible_devices(count: int) -> None:
    d = build_deployment(owner(resources={"gpu": {"count": count}}))
    resources = container(d)["resources"]
    assert resources["limits"]["amd.com/gpu"] == str(count)
    assert resources["requests"]["amd.com/gpu"] == str(count)
    devices = ",".join(str(i) for i in range(count))
    assert env(d)["ROCR_VISIBLE_DEVICES"] == devices
    assert env(d)["HIP_VISIBLE_DEVICES"] == devices
    assert pod(d)["tolerations"] == [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod(d)["securityContext"]["supplementalGroups"] == [44, 109]


def test_visible_devices_order_rocr_and_user_env_is_kept() -> None:
    d = build_deployment(
        owner(
            resources={"gpu": {"count": 2, "visibleDevices": "1,0"}},
            runtime={"env": [{"name": "X", "value": "y"}]},
        )
    )
    # ROCr exposes the pod's devices in this order; HIP indexes what ROCr exposes.
    assert env(d)["ROCR_VISIBLE_DEVICES"] == "1,0"
    assert env(d)["HIP_VISIBLE_DEVICES"] == "0,1"
    assert env(d)["X"] == "y"


@pytest.mark.parametrize("name", ["HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "MODEL_SERVER_PORT"])
def test_env_the_operator_sets_is_refused_not_half_overridden(name: str) -> None:
    """ROCR_VISIBLE_DEVICES=3 from runtime.env once left HIP_VISIBLE_DEVICES=0,1: now InvalidSpec."""
    with pytest.raises(SpecError) as err:
        owner(resources={"gpu": {"count": 2}}, runtime={"env": [{"name": name, "value": "3"}]})
    assert err.value.field == "spec.runtime" and name in err.value.message


def test_cpu_only_asks_for_no_gpu() -> None:
    d = build_deployment(
        owner(resources={"gpu": {"count": 0}}, runtime={"executionProviders": ["CPUExecutionProvider"]})
    )
    assert "amd.com/gpu" not in container(d)["resources"]["limits"]
    assert "ROCR_VISIBLE_DEVICES" not in env(d)
    assert "tolerations" not in pod(d)
    assert "supplementalGroups" not in pod(d)["securityContext"]


def test_gpu_placement_becomes_required_node_affinity() -> None:
    d = build_deployment(
        owner(
            resources={
                "gpu": {
                    "count": 8,
                    "productName": "AMD_Instinct_MI300X_OAM",
                    "family": "AI",
                    "vram": "192G",
                    "partition": "cpx_nps4",
                }
            }
        )
    )
    terms = pod(d)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    # Two alternatives (terms are ORed): the partition label in each of its two spellings,
    # each with every other label (expressions within a term are ANDed).
    alternatives = [{e["key"]: e["values"] for e in t["matchExpressions"]} for t in terms["nodeSelectorTerms"]]
    others = {
        "amd.com/gpu.product-name": ["AMD_Instinct_MI300X_OAM"],
        "amd.com/gpu.family": ["AI"],
        "amd.com/gpu.vram": ["192G"],
    }
    assert alternatives == [
        {**others, "amd.com/gpu.compute-memory-partition": ["cpx_nps4"]},
        {**others, "amd.com/compute-memory-partition": ["cpx_nps4"]},
    ]
    assert "affinity" not in pod(build_deployment(owner()))


def test_shm_probes_and_scrape_annotations() -> None:
    d = build_deployment(owner(resources={"shmSize": "32Gi"}, runtime={"startupTimeoutSeconds": 1200}))
    shm = next(v for v in pod(d)["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
    c = container(d)
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/health/live"
    assert c["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1200
    annotations = d["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9090"


def test_server_args_follow_the_spec() -> None:
    d = build_deployment(
        owner(
            model={"uri": "pvc://models/llm", "format": "torchscript", "version": "7", "name": "llm"},
            runtime={
                "executionProviders": ["ROCMExecutionProvider", "CPUExecutionProvider"],
                "batching": {"maxBatchSize": 4, "maxDelayMs": 2.5, "maxQueue": 9},
                "args": ["--x"],
            },
        )
    )
    args = container(d)["args"]
    flags = dict(zip(args[1::2], args[2::2], strict=False))
    assert args[0] == "serve"
    assert flags["--model-name"] == "llm"
    assert flags["--format"] == "torchscript"
    assert flags["--providers"] == "ROCMExecutionProvider,CPUExecutionProvider"
    assert (flags["--max-batch-size"], flags["--max-delay-ms"], flags["--max-queue"]) == ("4", "2.5", "9")
    assert args[args.index("--model-version") + 1] == "7"
    assert args[-1] == "--x"
    # The server's SIGTERM delay and drain fit in the pod's grace period.
    grace = pod(d)["terminationGracePeriodSeconds"]
    assert float(flags["--shutdown-delay"]) + float(flags["--drain-timeout"]) < grace


def test_pvc_model_is_mounted_read_only_with_sub_path() -> None:
    d = build_deployment(owner(model={"uri": "pvc://models/resnet/v3"}))
    volume = next(v for v in pod(d)["volumes"] if v["name"] == "model-store")
    assert volume["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    mount = next(m for m in container(d)["volumeMounts"] if m["name"] == "model-store")
    assert mount == {"name": "model-store", "mountPath": "/mnt/models", "readOnly": True, "subPath": "resnet/v3"}
    assert "initContainers" not in pod(d)


@pytest.mark.parametrize("uri", ["s3://bucket/resnet/", "https://example.com/m.onnx"])
def test_remote_models_are_fetched_by_an_init_container(uri: str) -> None:
    d = build_deployment(owner(model={"uri": uri}))
    init = pod(d)["initContainers"][0]
    assert init["command"][-2:] == [uri, "/mnt/models"]
    assert init["image"] == container(d)["image"]
    volume = next(v for v in pod(d)["volumes"] if v["name"] == "model-store")
    assert volume == {"name": "model-store", "emptyDir": {}}


def test_oci_model_is_copied_from_its_image() -> None:
    d = build_deployment(owner(model={"uri": "oci://registry.example.com/models/resnet:3"}))
    init = pod(d)["initContainers"][0]
    assert init["image"] == "registry.example.com/models/resnet:3"


@pytest.mark.parametrize(
    ("spec", "replicas"),
    [
        ({"replicas": 3}, 3),
        ({"replicas": 0}, 0),
        ({"replicas": 1, "autoscaling": {"minReplicas": 2, "maxReplicas": 5, "target": 50}}, 2),
        ({"replicas": 9, "autoscaling": {"minReplicas": 2, "maxReplicas": 5, "target": 50}}, 5),
        ({"replicas": 9, "autoscaling": {"maxReplicas": 5, "target": 50, "mode": "hpa"}}, None),
    ],
)
def test_replicas(spec: dict, replicas: int | None) -> None:
    d = build_deployment(owner(**spec))
    assert d["spec"].get("replicas") == replicas


@pytest.mark.parametrize(
    ("spec", "has_pdb"),
    [
        ({"replicas": 1}, False),
        ({"replicas": 2}, True),
        ({"autoscaling": {"minReplicas": 2, "maxReplicas": 4, "target": 5}}, True),
        ({"autoscaling": {"minReplicas": 1, "maxReplicas": 4, "target": 5}}, False),
    ],
)
def test_pdb_only_with_a_replica_to_spare(spec: dict, has_pdb: bool) -> None:
    kinds = [o["kind"] for o in build_all(owner(**spec))]
    assert ("PodDisruptionBudget" in kinds) == has_pdb


def test_labels_selector_and_owner_reference() -> None:
    o = owner()
    d, s = build_deployment(o), build_service(o)
    assert d["spec"]["selector"]["matchLabels"] == s["spec"]["selector"]
    labels = d["spec"]["template"]["metadata"]["labels"]
    assert all(labels[k] == v for k, v in d["spec"]["selector"]["matchLabels"].items())
    assert labels["app.kubernetes.io/managed-by"] == "rocm-inference-operator"
    assert d["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "inference.rocm.dev/v1alpha1",
            "kind": "InferenceService",
            "name": "resnet",
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert selector_string(o) == ",".join(f"{k}={v}" for k, v in sorted(s["spec"]["selector"].items()))
    assert [p["name"] for p in s["spec"]["ports"]] == ["http", "metrics"]


def test_builders_are_pure() -> None:
    o = owner(replicas=2, resources={"gpu": {"count": 2, "productName": "MI300X"}})
    assert build_all(o) == build_all(o)


SPECS = [
    {},
    {
        "replicas": 3,
        "resources": {
            "gpu": {
                "count": 8,
                "productName": "AMD_Instinct_MI300X_OAM",
                "family": "AI",
                "vram": "192G",
                "partition": "spx_nps1",
            },
            "cpu": 64,
            "memory": "512Gi",
            "shmSize": "64Gi",
        },
    },
    {"model": {"uri": "s3://b/m", "format": "torchscript"}, "runtime": {"env": [{"name": "A", "value": "1"}]}},
    {
        "model": {"uri": "oci://r.example.com/m:1"},
        "resources": {"gpu": {"count": 0}},
        "runtime": {"executionProviders": ["CPUExecutionProvider"]},
    },
    {"autoscaling": {"mode": "hpa", "minReplicas": 2, "maxReplicas": 6, "target": 40}},
    {"scheduling": {"nodeSelector": {"pool": "gpu"}, "priorityClassName": "high", "serviceAccountName": "models"}},
]


@pytest.mark.parametrize("spec", SPECS)
def test_every_object_passes_kubernetes_validate(spec: dict) -> None:
    for obj in build_all(owner(**spec)):
        kubernetes_validate.validate(obj, "1.33", strict=True)


def test_an_autoscaler_owned_replica_count_is_sent_back_unchanged() -> None:
    from inference_operator.reconcile import keep_foreign_replicas

    hpa_mode = build_deployment(owner(autoscaling={"mode": "hpa", "maxReplicas": 9, "target": 5}))
    assert "replicas" not in hpa_mode["spec"]
    live = {"spec": {"replicas": 6}}
    assert keep_foreign_replicas(hpa_mode, live)["spec"]["replicas"] == 6
    assert "replicas" not in hpa_mode["spec"]  # the desired manifest itself is left alone
    assert keep_foreign_replicas(hpa_mode, {"spec": {}}) is hpa_mode
    fixed = build_deployment(owner(replicas=2))
    assert keep_foreign_replicas(fixed, live)["spec"]["replicas"] == 2
    service = build_service(owner())
    assert keep_foreign_replicas(service, live) is service


@pytest.mark.parametrize("name", ["1model", "a.b", "x" * 64])
def test_no_objects_for_a_name_a_service_cannot_take(name: str) -> None:
    with pytest.raises(SpecError) as err:
        Owner(name=name, namespace="ml", uid=UID, spec=parse_spec({"model": {"uri": "pvc://models/m"}}))
    assert err.value.field == "metadata.name"


def test_every_flag_and_variable_the_builder_sets_is_protected() -> None:
    """runtime.args/env may not override what the operator sets: the lists cover the builder."""
    spec = {
        "model": {"uri": "pvc://models/m", "version": "3", "name": "m"},
        "resources": {"gpu": {"count": 2}},
        "autoscaling": {"maxReplicas": 2, "target": 50},
    }
    owner = Owner(name="resnet", namespace="ml", uid=UID, spec=parse_spec(spec))
    flags = {arg.split("=")[0] for arg in server_args(service_values(owner), MODEL_DIR) if arg.startswith("--")}
    assert flags and flags <= set(OPERATOR_FLAGS), flags - set(OPERATOR_FLAGS)
    container = build_deployment(owner)["spec"]["template"]["spec"]["containers"][0]
    # The compile caches' places are defaults the author may move: theirs replaces ours.
    names = {var["name"] for var in container["env"]} - set(MIGRAPHX | MIOPEN)
    assert names and names <= set(OPERATOR_ENV), names - set(OPERATOR_ENV)


def test_an_authors_cache_variable_replaces_the_operators_and_is_not_doubled() -> None:
    """env is a list-map keyed by name: the same name twice makes the apply fail."""
    spec = {"model": {"uri": "pvc://models/m"}, "runtime": {"env": [{"name": "MIOPEN_USER_DB_PATH", "value": "/x"}]}}
    owner = Owner(name="resnet", namespace="ml", uid=UID, spec=parse_spec(spec))
    env = build_deployment(owner)["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e["value"] for e in env if e["name"] == "MIOPEN_USER_DB_PATH"] == ["/x"]
    assert len({e["name"] for e in env}) == len(env)


def test_protected_flags_are_the_servers_and_so_are_their_env_names() -> None:
    from model_server.__main__ import build_parser

    parser = build_parser()
    serve = next(a for a in parser._subparsers._group_actions if a.choices).choices["serve"]  # type: ignore[union-attr]
    options = {opt: action for action in serve._actions for opt in action.option_strings}
    assert set(OPERATOR_FLAGS) <= set(options)
    for flag in OPERATOR_FLAGS:
        env = f"MODEL_SERVER_{options[flag].dest.upper()}"
        assert env in OPERATOR_ENV and env in (options[flag].help or ""), flag
