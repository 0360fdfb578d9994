"""The pod invariant (testsupport/pod_invariants.py) over every pod the project renders.

Every workload the operator emits (the Deployment, a LeaderWorkerSet's leader and worker
templates, the canary's Deployment, the endpoint picker's Deployment, a disaggregated service's
prefill and decode Deployments, the router's) for specs drawn from the
CRD's schema and for hand-picked specs that switch every feature on, and the chart's own pods:
no container that holds a credential can be reached by the InferenceService author's code.
The checker itself is shown to catch each kind of violation on hand-made bad pods.
"""

from __future__ import annotations

import copy
import pathlib
from dataclasses import replace
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference_operator.builders import Owner, build_all
from inference_operator.builders.canary import canary_deployment
from inference_operator.builders.endpoint_picker import picker_name
from inference_operator.builders.router import router_name
from inference_operator.builders.storage import S3_USER_ENV
from inference_operator.models import SpecError, parse_spec
from inference_operator.validation import validate_custom_resource
from tests.chart.conftest import helm as chart_helm  # noqa: F401  (the fixture: Helm, or a skip)
from tests.strategies import from_schema
from testsupport.crd import apply_defaults, crd_schema
from testsupport.pod_invariants import TOOL_CONFIG_ENV, Trust, Violation, check_objects, pod_specs, violations

SPEC_SCHEMA = crd_schema()["properties"]["spec"]
CHART = pathlib.Path(__file__).resolve().parents[2] / "charts" / "rocm-inference-operator"
# The operator's programs that may hold a credential in a model pod: the fetcher and the
# adapters sidecar, both of the operator's model-server image.
OPERATOR_PROGRAMS = (("python", "-m", "model_server.storage"), ("python", "-m", "model_server.adapters"))
AWS = [
    {"name": "AWS_ACCESS_KEY_ID", "value": "AKIAEXAMPLE"},
    {"name": "AWS_SECRET_ACCESS_KEY", "value": "secret"},
    {"name": "AWS_ENDPOINT_URL", "value": "https://s3.example"},
]
AUTHOR_ENV = [*AWS, {"name": "PYTHONPATH", "value": "/mnt/models/code"}, {"name": "HF_HUB_CACHE", "value": "/tmp/x"}]
HUB = {"tokenSecret": "hub-token", "endpoint": "https://huggingface.co"}
ADAPTERS = [{"name": "sql", "uri": "hf://org/sql-lora"}, {"name": "chat", "uri": "s3://adapters/chat"}]
ROUTE = {"parentRefs": [{"name": "inference", "namespace": "gateways"}], "hostnames": ["llm.example.com"]}
CANARY = {"strategy": "canary", "canary": {"steps": [10, 50], "analysis": {"maxLatencyMs": 50}}}


def _vllm(**extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"uri": "hf://org/llama", "name": "llama", "huggingFace": HUB, "cachePvc": "model-cache"},
        "runtime": {
            "engine": "vllm",
            "env": copy.deepcopy(AUTHOR_ENV),
            "args": ["--trust-remote-code"],
            "lora": {"maxLoras": 2},
        },
        "adapters": copy.deepcopy(ADAPTERS),
        "resources": {"gpu": {"count": 1}},
    }
    return {**spec, **extra}


# Specs that switch every feature on, each in the combinations the CRD allows.
FEATURES: dict[str, dict[str, Any]] = {
    "vllm-adapters-hf-cache-pool": _vllm(routing={"inferencePool": True}),
    "vllm-adapters-canary-route": _vllm(routing={"httpRoute": ROUTE}, rollout=CANARY),
    "vllm-adapters-router-route": _vllm(routing={"router": {}, "httpRoute": ROUTE}),
    "vllm-adapters-no-cache": _vllm(
        model={"uri": "hf://org/llama", "huggingFace": HUB},
        scheduling={"automountServiceAccountToken": True},
    ),
    # A multi-node group takes no adapters (yet): its fetchers hold the credentials.
    "vllm-multi-node": _vllm(resources={"gpu": {"count": 2, "nodes": 2}}, adapters=[], routing={"inferencePool": True}),
    "vllm-multi-node-s3": _vllm(
        model={"uri": "s3://bucket/llama", "cachePvc": "model-cache"},
        resources={"gpu": {"count": 1, "nodes": 3}},
        adapters=[],
    ),
    "vllm-s3-adapters-only": _vllm(model={"uri": "s3://bucket/llama"}, adapters=[ADAPTERS[1]]),
    # Prefill/decode disaggregation: both roles' pods fetch with the author's credentials beside
    # them, and carry the connector's env and ports (no adapters: the CRD refuses them there).
    "vllm-disaggregated-hf-cache": _vllm(
        adapters=[],
        runtime={"engine": "vllm", "env": copy.deepcopy(AUTHOR_ENV), "args": ["--trust-remote-code"]},
        routing={"router": {}, "httpRoute": ROUTE},
        disaggregation={
            "prefill": {"replicas": 2, "resources": {"gpu": {"count": 2}}},
            "decode": {"resources": {"gpu": {"count": 4, "allocation": "dra"}}},
        },
    ),
    "vllm-disaggregated-s3-cpu": _vllm(
        model={"uri": "s3://bucket/llama"},
        adapters=[],
        runtime={"engine": "vllm", "env": copy.deepcopy(AUTHOR_ENV)},
        resources={"gpu": {"count": 0}},
        routing={"router": {}},
        disaggregation={"kvTransfer": {"connector": "nixl"}},
    ),
    "model-server-s3-cache": {
        "model": {"uri": "s3://bucket/resnet.onnx", "cachePvc": "model-cache"},
        "runtime": {"env": copy.deepcopy(AUTHOR_ENV), "args": ["--log-level=debug"]},
        "resources": {"gpu": {"count": 0}},
        "rollout": CANARY,
        "routing": {"httpRoute": ROUTE},
    },
    "model-server-hf": {
        "model": {"uri": "hf://org/resnet", "huggingFace": HUB},
        "runtime": {"env": copy.deepcopy(AUTHOR_ENV)},
        "resources": {"gpu": {"count": 0}},
        "routing": {"inferencePool": True},
    },
    "model-server-https": {"model": {"uri": "https://models.example/m.onnx"}, "resources": {"gpu": {"count": 0}}},
    "model-server-oci": {"model": {"uri": "oci://ghcr.io/rocm-inference/models/resnet:1"}},
}


def trust_for(owner: Owner) -> Trust:
    spec = owner.spec
    return Trust(
        operator_images=frozenset({owner.fetcher_image}),
        operator_commands=OPERATOR_PROGRAMS,
        author_env=frozenset((e.name, e.value) for e in spec.runtime.env),
        author_args=tuple(spec.runtime.args),
        allowed_author_env=S3_USER_ENV,
        token_is_authors=bool(spec.scheduling.automount_service_account_token),
    )


def picker_trust(owner: Owner) -> Trust:
    return Trust(operator_images=frozenset({owner.images.endpoint_picker}))


def router_trust(owner: Owner) -> Trust:
    return Trust(operator_images=frozenset({owner.images.router}))


def workloads(owner: Owner) -> list[dict[str, Any]]:
    """Every object with a pod template the operator may emit for `owner`, the canary's too."""
    objects = [o for o in build_all(owner) if any(True for _ in pod_specs(o))]
    objects += [
        canary_deployment(o, 1) for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == owner.name
    ]
    return objects


def problems(owner: Owner) -> list[str]:
    found = []
    for obj in workloads(owner):
        name = obj["metadata"]["name"]
        if name == picker_name(owner):
            found += check_objects([obj], picker_trust(owner))
        elif name == router_name(owner):
            found += check_objects([obj], router_trust(owner))
        else:
            found += check_objects([obj], trust_for(owner))
    return found


def owner_of(spec: dict[str, Any]) -> Owner:
    return Owner(name="llm", namespace="ml", uid="u-1", spec=parse_spec(apply_defaults(SPEC_SCHEMA, spec)))


@pytest.mark.parametrize("spec", FEATURES.values(), ids=FEATURES.keys())
def test_every_feature_keeps_credentials_from_the_authors_code(spec: dict[str, Any]) -> None:
    resource = {"apiVersion": "inference.rocm.dev/v1alpha1", "kind": "InferenceService"}
    assert validate_custom_resource({**resource, "metadata": {"name": "llm", "namespace": "ml"}, "spec": spec}) == []
    owner = owner_of(spec)
    kinds = [o["kind"] for o in workloads(owner)]
    assert kinds, "the spec renders no pods: the test would check nothing"
    assert problems(owner) == []


def test_the_feature_table_has_credential_holders_beside_the_authors_code() -> None:
    """Not vacuous: the table renders a fetcher, a sidecar, a picker, a router, a group and a canary."""
    containers: set[str] = set()
    kinds: set[str] = set()
    names: set[str] = set()
    for spec in FEATURES.values():
        for obj in workloads(owner_of(spec)):
            names.add(obj["metadata"]["name"])
            for where, pod in pod_specs(obj):
                kinds.add(where.split()[0] + ("-canary" if where.endswith("-canary") else ""))
                containers |= {c["name"] for c in [*pod.get("initContainers", []), *pod["containers"]]}
    assert {"model-fetch", "adapters", "vllm", "model-server", "epp", "router"} <= containers
    assert {"Deployment", "Deployment-canary", "LeaderWorkerSet"} <= kinds
    assert {"llm-prefill", "llm-decode"} <= names


def merged(drawn: Any, feature: Any) -> Any:
    """`drawn` with `feature`'s fields over it (objects merged, anything else the feature's)."""
    if isinstance(drawn, dict) and isinstance(feature, dict):
        return {**drawn, **{k: merged(drawn.get(k), v) for k, v in feature.items()}}
    return copy.deepcopy(feature)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(from_schema(SPEC_SCHEMA), st.sampled_from([{}, *FEATURES.values()]))
def test_specs_drawn_from_the_schema_keep_the_invariant(drawn: dict[str, Any], feature: dict[str, Any]) -> None:
    """Specs of the schema's strategy, alone and with each feature's fields laid over them."""
    try:
        owner = owner_of(merged(drawn, feature))
    except SpecError:
        return  # refused: nothing is rendered
    assert problems(owner) == []


@pytest.mark.slow
@pytest.mark.parametrize("values_file", sorted((CHART / "ci").glob("*-values.yaml")), ids=lambda p: p.stem)
def test_the_charts_own_pods_keep_the_invariant(chart_helm: Any, values_file: pathlib.Path) -> None:  # noqa: F811
    values = yaml.safe_load(values_file.read_text()) or {}
    objects = chart_helm.render(values)
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    image = values.get("image", {})
    repository = image.get("repository", "ghcr.io/rocm-inference/operator")
    operator_image = (
        f"{repository}@{image['digest']}" if image.get("digest") else f"{repository}:{image.get('tag') or app_version}"
    )
    # The platform's model-server image (images.modelServer) runs the activator, as it runs the
    # fetcher: the chart's values choose it, never an InferenceService.
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    model_server = values.get("images", {}).get("modelServer") or defaults["images"]["modelServer"]
    pods = [where for obj in objects for where, _ in pod_specs(obj)]
    assert pods, "the chart renders no pods: the test would check nothing"
    assert check_objects(objects, Trust(operator_images=frozenset({operator_image, model_server}))) == []


# --- The checker catches each kind of violation ------------------------------------------------

OPERATOR_IMAGE = "ghcr.io/rocm-inference/model-server:0.1.0"
TRUST = Trust(
    operator_images=frozenset({OPERATOR_IMAGE}),
    operator_commands=OPERATOR_PROGRAMS,
    author_env=frozenset({("PYTHONPATH", "/mnt/models/code"), ("MODEL_HOOK", "1"), ("AWS_ACCESS_KEY_ID", "AKIA")}),
    author_args=("--trust-remote-code",),
    allowed_author_env=frozenset({"AWS_ACCESS_KEY_ID"}),
)
HOME_ENV = [{"name": name, "value": f"/home/fetch/{name.lower()}"} for name in TOOL_CONFIG_ENV]
TOKEN = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hub", "key": "token"}}}


def good_pod() -> dict[str, Any]:
    """A fetcher with its own HOME beside vLLM, sharing only what vLLM reads."""
    return {
        "automountServiceAccountToken": False,
        "volumes": [
            {"name": "model", "emptyDir": {}},
            {"name": "tmp", "emptyDir": {}},
            {"name": "fetch-home", "emptyDir": {}},
            {"name": "list", "configMap": {"name": "m"}},
        ],
        "initContainers": [
            {
                "name": "fetch",
                "image": OPERATOR_IMAGE,
                "command": ["python", "-m", "model_server.storage", "hf://org/m", "/mnt/models"],
                "env": [*HOME_ENV, TOKEN, {"name": "AWS_ACCESS_KEY_ID", "value": "AKIA"}],
                "volumeMounts": [
                    {"name": "model", "mountPath": "/mnt/models"},
                    {"name": "fetch-home", "mountPath": "/home/fetch"},
                    {"name": "list", "mountPath": "/etc/list", "readOnly": True},
                ],
            }
        ],
        "containers": [
            {
                "name": "vllm",
                "image": "docker.io/vllm/vllm-openai-rocm:v0.32.0",
                "args": ["--model=/mnt/models", "--trust-remote-code"],
                "env": [{"name": "PYTHONPATH", "value": "/mnt/models/code"}, {"name": "HOME", "value": "/tmp"}],
                "volumeMounts": [
                    {"name": "model", "mountPath": "/mnt/models", "readOnly": True},
                    {"name": "tmp", "mountPath": "/tmp"},
                    {"name": "list", "mountPath": "/etc/list", "readOnly": True},
                ],
            }
        ],
    }


def fetch_of(pod: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = pod["initContainers"][0]
    return container


def vllm_of(pod: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = pod["containers"][0]
    return container


def set_env(container: dict[str, Any], name: str, value: str) -> None:
    container["env"] = [e for e in container["env"] if e["name"] != name] + [{"name": name, "value": value}]


def rules(pod: dict[str, Any], trust: Trust = TRUST) -> list[tuple[str, str]]:
    found: list[Violation] = violations(pod, trust)
    for v in found:
        assert v.container in str(v) and len(v.message) > 20  # readable: names the container and what
    return sorted({(v.rule, v.container) for v in found})


def test_the_good_pod_passes() -> None:
    assert rules(good_pod()) == []


def _share_tmp(pod: dict[str, Any]) -> None:  # the adapters sidecar's HOME on vLLM's /tmp, as in issue 25
    fetch_of(pod)["volumeMounts"].append({"name": "tmp", "mountPath": "/tmp"})


def _tool_config_on_read_only_share(pod: dict[str, Any]) -> None:
    set_env(fetch_of(pod), "AWS_CONFIG_FILE", "/mnt/models/.aws/config")


def _python_path_on_share(pod: dict[str, Any]) -> None:
    set_env(fetch_of(pod), "PYTHONPATH", "/mnt/models/lib")


def _author_writes_the_output(pod: dict[str, Any]) -> None:
    vllm_of(pod)["volumeMounts"][0]["readOnly"] = False


def _authors_image(pod: dict[str, Any]) -> None:
    fetch_of(pod)["image"] = "ghcr.io/attacker/fetch:1"


def _authors_program(pod: dict[str, Any]) -> None:
    fetch_of(pod)["command"] = ["python", "-m", "model_server"]


def _authors_args(pod: dict[str, Any]) -> None:
    fetch_of(pod)["command"] += ["--trust-remote-code"]
    fetch_of(pod)["args"] = ["--trust-remote-code"]


def _authors_env(pod: dict[str, Any]) -> None:
    set_env(fetch_of(pod), "MODEL_HOOK", "1")


def _image_default_home(pod: dict[str, Any]) -> None:
    fetch_of(pod)["env"] = [e for e in fetch_of(pod)["env"] if e["name"] != "XDG_CONFIG_HOME"]


def _secret_volume_in_vllm(pod: dict[str, Any]) -> None:
    pod["volumes"].append({"name": "creds", "secret": {"secretName": "s3"}})
    vllm_of(pod)["volumeMounts"].append({"name": "creds", "mountPath": "/creds", "readOnly": True})


def _projected_token_in_vllm(pod: dict[str, Any]) -> None:
    pod["volumes"].append({"name": "tok", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}})
    vllm_of(pod)["volumeMounts"].append({"name": "tok", "mountPath": "/var/run/tok", "readOnly": True})


def _secret_env_from_in_vllm(pod: dict[str, Any]) -> None:
    vllm_of(pod)["envFrom"] = [{"secretRef": {"name": "s3"}}]


def _platform_token_automounted(pod: dict[str, Any]) -> None:
    del pod["automountServiceAccountToken"]  # the ServiceAccount's default: mounted everywhere


def _overlapping_sub_paths(pod: dict[str, Any]) -> None:
    pod["volumes"][0] = {"name": "model", "persistentVolumeClaim": {"claimName": "cache"}}
    fetch_of(pod)["volumeMounts"][0]["subPath"] = "hf/org/m"
    vllm_of(pod)["volumeMounts"].append({"name": "model", "mountPath": "/var/cache/vllm", "subPath": "hf"})


BAD_PODS = {
    "shares a writable volume": (_share_tmp, [("shared-writable", "fetch")]),
    "tool config on a shared volume": (_tool_config_on_read_only_share, [("config-on-shared", "fetch")]),
    "imports from a shared volume": (_python_path_on_share, [("config-on-shared", "fetch")]),
    "the author can write the output": (_author_writes_the_output, [("shared-writable", "fetch")]),
    "the author's image": (_authors_image, [("runs-author-code", "fetch")]),
    "an author program": (_authors_program, [("runs-author-code", "fetch")]),
    "the author's args": (_authors_args, [("runs-author-code", "fetch")]),
    "the author's env": (_authors_env, [("author-env", "fetch"), ("runs-author-code", "fetch")]),
    "a default of the image's": (_image_default_home, [("implicit-config", "fetch")]),
    "a Secret volume with the author": (_secret_volume_in_vllm, [("runs-author-code", "vllm")]),
    "a projected token with the author": (_projected_token_in_vllm, [("runs-author-code", "vllm")]),
    "envFrom a Secret with the author": (_secret_env_from_in_vllm, [("runs-author-code", "vllm")]),
    "the platform's token everywhere": (_platform_token_automounted, [("runs-author-code", "vllm")]),
    "overlapping subPaths of a claim": (_overlapping_sub_paths, [("shared-writable", "fetch")]),
}


@pytest.mark.parametrize(("break_it", "expected"), BAD_PODS.values(), ids=BAD_PODS.keys())
def test_the_checker_catches_each_kind_of_violation(break_it: Any, expected: list[tuple[str, str]]) -> None:
    pod = good_pod()
    break_it(pod)
    found = rules(pod)
    assert set(expected) <= set(found), found
    # A credential in the author's container breaks the rules for credential holders too; any
    # other break is only what was broken.
    if ("runs-author-code", "vllm") not in expected:
        assert found == expected


def test_the_authors_own_token_is_theirs_and_disjoint_sub_paths_do_not_meet() -> None:
    pod = good_pod()
    _platform_token_automounted(pod)
    assert rules(pod, replace(TRUST, token_is_authors=True)) == []
    pod = good_pod()
    pod["volumes"][0] = {"name": "model", "persistentVolumeClaim": {"claimName": "cache"}}
    fetch_of(pod)["volumeMounts"][0]["subPath"] = "hf/org/m"
    vllm_of(pod)["volumeMounts"].append({"name": "model", "mountPath": "/var/cache/vllm", "subPath": "vllm-cache/m"})
    assert rules(pod) == []


def test_a_container_that_holds_nothing_may_share_anything() -> None:
    pod = good_pod()
    fetch_of(pod)["env"] = [e for e in fetch_of(pod)["env"] if e is not TOKEN and "valueFrom" not in e]
    _share_tmp(pod)
    _author_writes_the_output(pod)
    assert rules(pod) == []
