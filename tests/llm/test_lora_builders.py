"""spec.adapters rendered: the adapters ConfigMap, the sidecar, vLLM's LoRA flags and guard, and
the CRD's refusals; the pod template never depends on which adapters are listed."""

from __future__ import annotations

import copy
import json

import kubernetes_validate
import pytest

from inference_operator.builders import Owner, build_all
from inference_operator.builders.adapters import CONFIG_KEY, GUARD_MIDDLEWARE, SIDECAR
from inference_operator.config import FetchSettings
from inference_operator.engines.vllm import FRONT
from inference_operator.models import Engine
from inference_operator.settings import Images
from inference_operator.validation import validate_custom_resource
from tests.llm.test_vllm_builders import owner, vllm_spec

ENGINE_PORT = 8081  # vLLM's loopback port behind the front, for runtime.port 8080

ADAPTERS = [{"name": "sql", "uri": "hf://org/sql-lora"}, {"name": "chat", "uri": "s3://adapters/chat"}]


def lora_spec(adapters: list[dict] | None = None, **runtime: object) -> dict:
    return {**vllm_spec(**runtime), "adapters": copy.deepcopy(ADAPTERS if adapters is None else adapters)}


def objects(spec: dict, **kwargs: object) -> dict[str, dict]:
    return {obj["kind"]: obj for obj in build_all(owner(spec, **kwargs))}  # type: ignore[arg-type]


def pod_of(objs: dict[str, dict]) -> dict:
    return objs["Deployment"]["spec"]["template"]["spec"]


def sidecar_of(objs: dict[str, dict]) -> dict:
    return next(c for c in pod_of(objs).get("initContainers", []) if c["name"] == SIDECAR)


def resource(spec: dict) -> dict:
    return {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "llm", "namespace": "ml"},
        "spec": spec,
    }


def test_adapters_render_a_config_map_a_sidecar_and_vllm_with_lora_and_its_guard() -> None:
    objs = objects(lora_spec(lora={"maxLoras": 3, "maxLoraRank": 32}))
    assert list(objs) == ["ConfigMap", "Deployment", "Service"]  # the list before the pods that mount it
    for obj in objs.values():
        kubernetes_validate.validate(obj, "1.33", strict=True)
    listed = json.loads(objs["ConfigMap"]["data"][CONFIG_KEY])
    assert listed == {"adapters": ADAPTERS}
    assert objs["ConfigMap"]["metadata"]["ownerReferences"][0]["uid"] == "u-1"

    pod = pod_of(objs)
    (vllm,) = pod["containers"]
    assert {"--enable-lora", "--max-loras=3", "--max-lora-rank=32", f"--middleware={GUARD_MIDDLEWARE}"} <= set(
        vllm["args"]
    )
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    sidecar = sidecar_of(objs)
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar: vLLM starts after its startup probe
    assert "startupProbe" in sidecar and sidecar["readinessProbe"]["httpGet"]["path"] == "/ready"
    # A native sidecar's readiness is the pod's: one missed check may not take vLLM out of its Service.
    assert sidecar["readinessProbe"]["failureThreshold"] >= 3
    plugins = next(m for m in sidecar["volumeMounts"] if m["mountPath"] == env["PYTHONPATH"])
    assert not plugins.get("readOnly")
    vllm_mounts = {m["name"]: m for m in vllm["volumeMounts"]}
    assert vllm_mounts[plugins["name"]]["readOnly"] is True
    files = next(m for m in sidecar["volumeMounts"] if m["name"] == "adapters")
    assert vllm_mounts["adapters"]["mountPath"] == files["mountPath"]  # vLLM loads the path the sidecar wrote
    assert vllm_mounts["adapters"]["readOnly"] is True
    # The sidecar's port is the metrics port vLLM leaves free (it serves metrics on its API port).
    assert sidecar["ports"][0]["containerPort"] == 9090
    assert f"--engine=http://127.0.0.1:{ENGINE_PORT}" in sidecar["command"]  # straight to vLLM, not the front


def test_the_pod_template_does_not_change_with_the_adapters_listed() -> None:
    """Adding or removing an adapter must not restart a pod: only the ConfigMap changes."""
    lora = {"maxLoras": 2}
    templates = [
        objects(lora_spec(adapters, lora=lora))["Deployment"]["spec"]["template"]
        for adapters in ([], ADAPTERS[:1], ADAPTERS, ADAPTERS[::-1])
    ]
    assert all(t == templates[0] for t in templates)
    lists = {objects(lora_spec(a, lora=lora))["ConfigMap"]["data"][CONFIG_KEY] for a in ([], ADAPTERS[:1], ADAPTERS)}
    assert len(lists) == 3


def test_a_vllm_service_without_adapters_renders_no_lora() -> None:
    objs = objects(vllm_spec())
    assert "ConfigMap" not in objs and [c["name"] for c in pod_of(objs)["initContainers"]] == [FRONT]
    (vllm,) = pod_of(objs)["containers"]
    assert not any("lora" in arg or "middleware" in arg for arg in vllm["args"])
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in {e["name"] for e in vllm["env"]}


def test_the_sidecar_runs_the_operators_image_with_the_fetchers_credentials_only() -> None:
    """The sidecar may hold the Hub token: never the author's image, never their proxy or CA."""
    spec = lora_spec(image="ghcr.io/attacker/steal:1")
    spec["model"] = {"uri": "pvc://models/llama", "huggingFace": {"tokenSecret": "hub", "endpoint": "https://hf.co"}}
    spec["runtime"]["env"] = [
        {"name": "HTTPS_PROXY", "value": "http://attacker:3128"},
        {"name": "SSL_CERT_FILE", "value": "/tmp/evil.pem"},
        {"name": "PYTHONSTARTUP", "value": "/tmp/x.py"},
        {"name": "AWS_ACCESS_KEY_ID", "value": "AKIA"},
    ]
    assert validate_custom_resource(resource(copy.deepcopy(spec))) == []  # a pvc:// model, hf:// adapters
    images = Images({Engine.MODEL_SERVER: "ghcr.io/rocm-inference/model-server:9"})
    fetch = FetchSettings(https_proxy="http://proxy.platform:3128", ca_bundle="PEM")
    built = owner(spec, images=images)
    built = Owner(built.name, built.namespace, built.uid, built.spec, images=images, fetch=fetch)
    objs = {obj["kind"]: obj for obj in build_all(built)}
    sidecar = sidecar_of(objs)
    assert sidecar["image"] == "ghcr.io/rocm-inference/model-server:9"
    assert pod_of(objs)["containers"][0]["image"] == "ghcr.io/attacker/steal:1"
    env = {e["name"]: e for e in sidecar["env"]}
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "hub"
    assert env["HF_ENDPOINT"]["value"] == "https://hf.co"
    assert env["HTTPS_PROXY"]["value"] == "http://proxy.platform:3128"  # the platform's, not the author's
    assert "AWS_ACCESS_KEY_ID" in env  # S3's own variables, for s3:// adapters
    assert not {"SSL_CERT_FILE", "PYTHONSTARTUP"} & set(env)
    # The vLLM container, the author's image, gets no token.
    assert "HF_TOKEN" not in {e["name"] for e in pod_of(objs)["containers"][0]["env"]}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s["runtime"].update(engine="modelServer"), "spec.adapters needs runtime.engine vllm"),
        (lambda s: s["adapters"].append({"name": "sql", "uri": "hf://org/other"}), "Duplicate value"),
        (lambda s: s["adapters"].append({"name": "web", "uri": "https://host/a"}), "adapters[2].uri"),
        (lambda s: s["adapters"].append({"name": "-x", "uri": "hf://org/x"}), "adapters[2].name"),
        (lambda s: s["runtime"].update(lora={"maxLoraRank": 7}), "maxLoraRank"),
        (lambda s: s["runtime"].update(args=["--enable-lora"]), "runtime.args for engine vllm"),
        (lambda s: s["runtime"].update(args=["--max-loras=8"]), "runtime.args for engine vllm"),
        (lambda s: s["runtime"].update(args=["--middleware=evil.Pass"]), "runtime.args for engine vllm"),
        (
            lambda s: s["runtime"].update(env=[{"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "1"}]),
            "runtime.env",
        ),
    ],
)
def test_the_crd_refuses_what_would_break_or_bypass_the_adapters(change, message: str) -> None:
    spec = lora_spec()
    assert validate_custom_resource(resource(copy.deepcopy(spec))) == []
    change(spec)
    errors = validate_custom_resource(resource(spec))
    assert any(message in error for error in errors), errors


def test_the_guard_comes_first_on_the_specs_pythonpath() -> None:
    spec = lora_spec(env=[{"name": "PYTHONPATH", "value": "/opt/plugins"}, {"name": "A", "value": "1"}])
    (vllm,) = pod_of(objects(spec))["containers"]
    paths = [e["value"] for e in vllm["env"] if e["name"] == "PYTHONPATH"]
    assert paths == ["/var/run/vllm-plugins:/opt/plugins"]
    assert {"name": "A", "value": "1"} in vllm["env"]


def test_runtime_lora_alone_is_only_for_vllm() -> None:
    spec = vllm_spec(lora={"maxLoras": 2})
    spec["runtime"]["engine"] = "modelServer"
    spec["resources"] = {"gpu": {"count": 0}}
    assert any("runtime.lora applies to engine vllm only" in e for e in validate_custom_resource(resource(spec)))


def _mounts(container: dict) -> dict[str, dict]:
    return {m["name"]: m for m in container.get("volumeMounts", [])}


@pytest.mark.parametrize(
    ("container", "shared_read_only"),
    [("adapters", {"adapters", "vllm-plugins"}), ("model-fetch", {"model-store"})],
)
def test_a_credential_container_shares_nothing_writable_with_vllm_and_keeps_its_tool_configuration_to_itself(
    container: str, shared_read_only: set[str]
) -> None:
    """The adapters sidecar and the model's fetcher hold the Hub token and S3 keys; vLLM runs the
    author's code (their image, env, model). Whatever vLLM can write, neither may read its
    configuration from."""
    spec = lora_spec()
    spec["model"] = {"uri": "hf://org/llama", "huggingFace": {"tokenSecret": "hub"}}
    pod = pod_of(objects(spec))
    holder = next(c for c in pod["initContainers"] if c["name"] == container)
    others = [c for c in pod["containers"] + pod["initContainers"] if c is not holder]
    (vllm,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in holder["env"]}
    assert "HF_TOKEN" in env
    shared = {name for c in others for name in _mounts(c)} & set(_mounts(holder))
    # Shared: only what the holder writes for vLLM to read, and vLLM mounts read-only.
    assert shared == shared_read_only
    for name in shared:
        assert _mounts(vllm)[name]["readOnly"] is True
    # Every tool's configuration (and HOME, which is where they look otherwise) under a mount
    # of a volume no other container mounts.
    private = [m["mountPath"] for name, m in _mounts(holder).items() if not any(name in _mounts(c) for c in others)]
    tools = ["HOME", "TMPDIR", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "HF_HOME", "NETRC"]
    tools += ["XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"]
    for name in tools:
        value = env.get(name)
        assert value and any(value == p or value.startswith(p.rstrip("/") + "/") for p in private), (name, value)
    assert env["PYTHONNOUSERSITE"] == "1"  # no site-packages from HOME either
    assert len([e for e in holder["env"] if e["name"] == "HF_HOME"]) == 1
    # What it writes for vLLM is not a place it reads its configuration from.
    for name in shared:
        written = _mounts(holder)[name]["mountPath"]
        assert not any(str(v).startswith(written) for v in env.values())
