"""The vllm engine's objects: Deployment, Service, model fetch, InferencePool, default images."""

from __future__ import annotations

import copy
import io
import re
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from inference_operator.builders import Owner, build_all, build_deployment, build_inference_pool, build_service
from inference_operator.builders.common import selector_labels
from inference_operator.builders.storage import MODEL_DIR, cache_key
from inference_operator.engines.vllm import FRONT, pre_stop_command, under_init
from inference_operator.models import ENGINES, Engine, SpecError, parse_spec
from inference_operator.settings import Images
from testsupport.crd import ROOT, addon_errors, apply_defaults, crd_schema

K8S_VERSION = "1.33"
MODEL_SERVER_IMAGE = ENGINES[Engine.MODEL_SERVER].image
VLLM_IMAGE = ENGINES[Engine.VLLM].image
EXAMPLE = ROOT / "examples" / "llm-vllm-8gpu.yaml"
SPEC_SCHEMA = crd_schema()["properties"]["spec"]


def owner(spec: dict, name: str = "llm", images: Images | None = None) -> Owner:
    parsed = parse_spec(apply_defaults(SPEC_SCHEMA, copy.deepcopy(spec)))
    return Owner(name=name, namespace="ml", uid="u-1", spec=parsed, images=images or Images())


def vllm_spec(**runtime: object) -> dict:
    return {
        "model": {"uri": "pvc://models/llama", "name": "llama"},
        "runtime": {"engine": "vllm", **runtime},
        "resources": {"gpu": {"count": 4, "productName": "AMD_Instinct_MI300X_OAM"}},
    }


def container_of(deployment: dict) -> dict:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def test_render_of_the_vllm_example_is_a_valid_tp8_deployment() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "inference_operator", "render", "-f", str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    rendered = list(yaml.safe_load_all(result.stdout))
    # The service's own objects; its endpoint picker (NAME-epp) is tested in tests/llm/test_endpoint_picker.py.
    objects = {o["kind"]: o for o in rendered if o["metadata"]["name"] == "llama-70b"}
    assert set(objects) == {"Deployment", "Service", "InferencePool"}
    assert {o["kind"] for o in rendered if o["metadata"]["name"] == "llama-70b-epp"} == {
        "ServiceAccount",
        "RoleBinding",
        "Deployment",
        "Service",
    }
    for kind in ("Deployment", "Service"):
        kubernetes_validate.validate(objects[kind], K8S_VERSION, strict=True)
    container = container_of(objects["Deployment"])
    assert "--tensor-parallel-size=8" in container["args"]
    assert container["resources"]["limits"]["amd.com/gpu"] == "8"
    assert container["resources"]["requests"]["amd.com/gpu"] == "8"
    assert {"name": "ROCR_VISIBLE_DEVICES", "value": "0,1,2,3,4,5,6,7"} in container["env"]
    assert inference_pool_errors(objects["InferencePool"]) == []


def test_vllm_command_line_is_operator_flags_then_engine_args_each_one_token() -> None:
    spec = vllm_spec(maxModelLen=8192, port=8000, args=["--max-num-seqs=64", "--enable-prefix-caching"])
    container = container_of(build_deployment(owner(spec)))
    assert container["name"] == "vllm"
    assert container["command"] == under_init(["python3", "-m", "vllm.entrypoints.openai.api_server"])
    assert container["args"] == [
        f"--model={MODEL_DIR}",
        "--served-model-name=llama",
        "--tensor-parallel-size=4",
        "--host=127.0.0.1",  # behind the front, the pod's way in
        "--port=8001",
        "--shutdown-timeout=50",  # what it streams at SIGTERM ends whole (DRAIN_SECONDS)
        "--max-model-len=8192",
        "--max-num-seqs=64",
        "--enable-prefix-caching",
    ]
    # No value stands alone where a parser could take it for a flag.
    assert all(arg.startswith("--") for arg in container["args"])
    assert front_of(build_deployment(owner(spec)))["ports"] == [
        {"name": "http", "containerPort": 8000, "protocol": "TCP"}
    ]


def test_an_engine_argument_value_that_looks_like_a_flag_stays_in_its_token() -> None:
    args = ['--override-generation-config={"temperature": 0.5}', "--chat-template-content-format=--port"]
    rendered = container_of(build_deployment(owner(vllm_spec(args=args))))["args"]
    assert rendered[-2:] == args
    assert "--port" not in rendered and sum(a.startswith("--port") for a in rendered) == 1


def test_cpu_only_vllm_runs_tensor_parallel_one_and_no_max_model_len_unless_set() -> None:
    spec = vllm_spec()
    spec["resources"] = {"gpu": {"count": 0}}
    args = container_of(build_deployment(owner(spec)))["args"]
    assert "--tensor-parallel-size=1" in args
    assert not any(a.startswith("--max-model-len") for a in args)


@pytest.mark.parametrize(
    "arg",
    ["--port=9000", "--served=x", "--max_model_len=4", "--model", "--config=/etc/x.yaml", "-tp", "8", "--uds=/s"],
)
def test_engine_args_that_would_override_the_operator_or_split_a_value_are_refused(arg: str) -> None:
    with pytest.raises(SpecError) as err:
        owner(vllm_spec(args=[arg]))
    assert err.value.field.startswith("spec.runtime")


def test_vllm_gets_the_same_gpu_wiring_as_the_model_server() -> None:
    gpu = {"count": 2, "productName": "AMD_Instinct_MI300X_OAM", "partition": "cpx_nps4", "visibleDevices": "1,0"}
    model_server = {"model": {"uri": "pvc://models/m"}, "resources": {"gpu": gpu}}
    vllm = {"model": {"uri": "pvc://models/m"}, "runtime": {"engine": "vllm"}, "resources": {"gpu": gpu}}
    a, b = build_deployment(owner(model_server)), build_deployment(owner(vllm))
    pod_a, pod_b = a["spec"]["template"]["spec"], b["spec"]["template"]["spec"]
    for key in ("tolerations", "affinity", "securityContext", "volumes"):
        assert pod_a[key] == pod_b[key], key
    ca, cb = container_of(a), container_of(b)
    assert ca["resources"] == cb["resources"] and cb["resources"]["limits"]["amd.com/gpu"] == "2"
    devices = [e for e in cb["env"] if e["name"].endswith("VISIBLE_DEVICES")]
    assert devices == [e for e in ca["env"] if e["name"].endswith("VISIBLE_DEVICES")]
    assert {"name": "ROCR_VISIBLE_DEVICES", "value": "1,0"} in devices
    assert {"name": "dshm", "mountPath": "/dev/shm"} in cb["volumeMounts"]
    assert cb["securityContext"]["readOnlyRootFilesystem"] is True
    # A read-only root needs a writable HOME for vLLM's caches; the model is local, so no Hub.
    env = {e["name"]: e.get("value") for e in cb["env"]}
    assert env["HOME"] == "/tmp" and env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_HTTP_TIMEOUT_KEEP_ALIVE"] == "75"  # outlasts the proxies' idle timeouts
    kubernetes_validate.validate(b, K8S_VERSION, strict=True)


def front_of(deployment: dict) -> dict:
    front: dict = next(c for c in deployment["spec"]["template"]["spec"]["initContainers"] if c["name"] == FRONT)
    return front


def test_probes_and_scraping_reach_vllm_through_the_front_on_the_api_port() -> None:
    o = owner(vllm_spec(startupTimeoutSeconds=1800))
    deployment = build_deployment(o)
    container = container_of(deployment)
    assert container["ports"] == []  # vLLM listens on loopback: the kubelet reaches it through the front
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": 8080}
    # The front drains its kept-alive connections, then vLLM answers on while endpoints drop it.
    assert container["lifecycle"]["preStop"]["exec"]["command"] == pre_stop_command(8080)
    script = pre_stop_command(8080)[-1]
    assert '"127.0.0.1", 8080' in script and "time.sleep(4.0)" in script and "time.sleep(1.0)" in script
    front = front_of(deployment)
    assert front["restartPolicy"] == "Always"  # starts before vLLM, stops after it
    assert front["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert "--upstream=http://127.0.0.1:8081" in front["args"] and "--host=127.0.0.1" in container["args"]
    assert front["readinessProbe"]["httpGet"] == {"path": "/health/ready", "port": "http"}
    assert "env" not in front and "volumeMounts" not in front  # nothing of the author's
    assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] >= 1800
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == "8080"
    service = build_service(o)
    kubernetes_validate.validate(service, K8S_VERSION, strict=True)
    assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]} == {"http": "http", "metrics": "http"}


def test_default_images_per_engine_and_the_spec_image_wins() -> None:
    images = Images({Engine.MODEL_SERVER: "reg/ms:1", Engine.VLLM: "reg/vllm:2"})
    assert container_of(build_deployment(owner(vllm_spec(), images=images)))["image"] == "reg/vllm:2"
    chosen = owner(vllm_spec(image="reg/custom-vllm:3"), images=images)
    assert container_of(build_deployment(chosen))["image"] == "reg/custom-vllm:3"
    plain = owner({"model": {"uri": "pvc://models/m"}}, images=images)
    assert container_of(build_deployment(plain))["image"] == "reg/ms:1"


def test_default_images_come_from_the_operators_environment() -> None:
    defaults = Images({Engine.MODEL_SERVER: MODEL_SERVER_IMAGE.default, Engine.VLLM: VLLM_IMAGE.default})
    assert Images.from_environment({}) == defaults == Images()
    env = {VLLM_IMAGE.env: "mirror/vllm:x", MODEL_SERVER_IMAGE.env: "mirror/ms:y"}
    assert Images.from_environment(env) == Images({Engine.MODEL_SERVER: "mirror/ms:y", Engine.VLLM: "mirror/vllm:x"})


def hf_spec(**model: object) -> dict:
    return {
        "model": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct@v1.0", "name": "llama", **model},
        "runtime": {"engine": "vllm", "env": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}]},
        "resources": {"gpu": {"count": 1}},
    }


def test_hf_models_are_fetched_by_the_model_server_image_with_token_and_endpoint() -> None:
    spec = hf_spec(huggingFace={"tokenSecret": "hf-token", "endpoint": "https://hf-mirror.example"})
    deployment = build_deployment(
        owner(spec, images=Images({Engine.MODEL_SERVER: "reg/ms:1", Engine.VLLM: "reg/vllm:2"}))
    )
    pod = deployment["spec"]["template"]["spec"]
    init, front = pod["initContainers"]
    assert front["name"] == FRONT and front["image"] == "reg/ms:1"
    assert init["image"] == "reg/ms:1"  # the one with the fetcher, not the vLLM image
    assert init["command"] == [
        "python",
        "-m",
        "model_server.storage",
        "hf://meta-llama/Llama-3.1-8B-Instruct@v1.0",
        MODEL_DIR,
    ]
    env = {e["name"]: e for e in init["env"]}
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}
    assert env["HF_ENDPOINT"]["value"] == "https://hf-mirror.example"
    assert "HTTPS_PROXY" not in env  # the author's proxy would see the token: only the platform's reaches it
    assert not any(name.endswith("VISIBLE_DEVICES") for name in env)
    # The token never reaches the serving container.
    assert "HF_TOKEN" not in {e["name"] for e in container_of(deployment)["env"]}
    assert {"name": "model-store", "emptyDir": {}} in pod["volumes"]
    kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def test_a_cache_claim_holds_the_fetched_model_under_a_per_uri_directory() -> None:
    deployment = build_deployment(owner(hf_spec(cachePvc="model-cache")))
    pod = deployment["spec"]["template"]["spec"]
    assert {"name": "model-store", "persistentVolumeClaim": {"claimName": "model-cache"}} in pod["volumes"]
    init = pod["initContainers"][0]
    fetch_mount = next(m for m in init["volumeMounts"] if m["name"] == "model-store")
    serve_mount = next(m for m in container_of(deployment)["volumeMounts"] if m["name"] == "model-store")
    assert fetch_mount["subPath"] == serve_mount["subPath"]
    assert re.fullmatch(r"hf/meta-llama_Llama-3\.1-8B-Instruct@v1\.0-[0-9a-f]{32}", serve_mount["subPath"])
    assert serve_mount["readOnly"] is True and "readOnly" not in fetch_mount
    kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


@pytest.mark.parametrize(
    ("uri", "readable"),
    [
        ("hf://org/name", "hf/org_name-"),
        ("s3://bucket/models/../x/", "s3/bucket_models_.._x-"),
        ("https://host:8443/a b/./m.onnx?x=1", "https/host_8443_a_b_._m.onnx_x_1-"),
        ("s3://../..", "s3/_-"),
    ],
)
def test_cache_keys_are_relative_paths_without_dot_dot(uri: str, readable: str) -> None:
    key = cache_key(uri)
    assert key.startswith(readable) and re.fullmatch(r"[0-9a-f]{32}", key[len(readable) :])
    assert ".." not in key.split("/") and not key.startswith("/") and key.count("/") == 1


def inference_pool_errors(pool: dict) -> list[str]:
    """The pool as an API server with the Inference Extension's CRD (its stand-in) judges it."""
    errors = addon_errors(pool)
    assert errors is not None, "no stand-in InferencePool CRD"
    return errors


def test_inference_pool_selects_the_pods_on_their_serving_port() -> None:
    spec = vllm_spec(port=8000)
    spec["routing"] = {"inferencePool": True}
    o = owner(spec, name="llama-70b")
    pool = build_inference_pool(o)
    assert inference_pool_errors(pool) == []
    deployment = build_deployment(o)
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"] == selector_labels(o)
    assert pool["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pool["spec"]["targetPorts"] == [{"number": front_of(deployment)["ports"][0]["containerPort"]}]
    assert pool["spec"]["endpointPickerRef"] == {
        "group": "",
        "kind": "Service",
        "name": "llama-70b-epp",
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }
    assert pool["metadata"]["ownerReferences"][0]["uid"] == "u-1"


def test_inference_pool_names_the_endpoint_picker_the_spec_gives_and_only_when_asked() -> None:
    spec = vllm_spec()
    spec["routing"] = {"inferencePool": True, "endpointPicker": {"name": "gw-epp", "port": 9102}}
    pool = build_inference_pool(owner(spec))
    assert pool["spec"]["endpointPickerRef"]["name"] == "gw-epp"
    assert pool["spec"]["endpointPickerRef"]["port"] == {"number": 9102}
    assert [o["kind"] for o in build_all(owner(spec))][-1] == "InferencePool"
    assert "InferencePool" not in [o["kind"] for o in build_all(owner(vllm_spec()))]


def test_render_takes_the_default_images_from_flags_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from inference_operator.__main__ import main

    monkeypatch.setenv(VLLM_IMAGE.env, "env/vllm:1")
    for argv, expected in [([], "env/vllm:1"), (["--vllm-image", "flag/vllm:2"], "flag/vllm:2")]:
        buffer = io.StringIO()
        with monkeypatch.context() as m:
            m.setattr(sys, "stdout", buffer)
            assert main(["render", "-f", str(EXAMPLE), *argv]) == 0
        deployment = next(yaml.safe_load_all(buffer.getvalue()))
        assert container_of(deployment)["image"] == expected, argv


def env_of(container: dict) -> dict:
    return {e["name"]: e.get("value") for e in container["env"]}


def test_the_compile_cache_is_on_the_cache_claim_per_service_else_on_the_pods_tmp() -> None:
    """vLLM's compiled graphs on the model cache claim: the second replica and each restart skip
    compilation. A directory per InferenceService, apart from every model's (the cache holds
    code vLLM runs); without a claim, the pod's /tmp volume (it outlives container restarts)."""
    spec = vllm_spec()
    spec["model"] = {"uri": "hf://org/llama", "name": "llama", "cachePvc": "model-cache"}
    deployment = build_deployment(owner(spec))
    container = container_of(deployment)
    assert env_of(container)["VLLM_CACHE_ROOT"] == "/var/cache/vllm"
    cache = next(m for m in container["volumeMounts"] if m["mountPath"] == "/var/cache/vllm")
    assert cache == {"name": "model-store", "mountPath": "/var/cache/vllm", "subPath": "vllm-cache/llm"}
    model = next(m for m in container["volumeMounts"] if m["mountPath"] == MODEL_DIR)
    assert (
        model["readOnly"] is True
        and model["subPath"].startswith("hf/org_llama-")
        and model["subPath"] != cache["subPath"]
    )
    claims = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v]
    assert claims == [{"name": "model-store", "persistentVolumeClaim": {"claimName": "model-cache"}}]
    kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)

    for uncached in (vllm_spec(), {**vllm_spec(), "model": {"uri": "hf://org/llama", "name": "llama"}}):
        container = container_of(build_deployment(owner(uncached)))
        assert env_of(container)["VLLM_CACHE_ROOT"] == "/tmp/vllm-cache"  # the tmp emptyDir
        assert not any(m["mountPath"] == "/var/cache/vllm" for m in container["volumeMounts"])


@pytest.mark.parametrize(
    ("cpu", "front"),
    [("1500m", "200m"), ("4", "500m"), ("16", "2000m"), ("1e999999999", "2000m"), ("0.001", "200m")],
)
def test_the_fronts_cpu_is_an_eighth_of_vllms_within_bounds(cpu: str, front: str) -> None:
    """The schema takes any exponent a quantity's digits allow: the largest must render too."""
    spec = vllm_spec()
    spec["resources"]["cpu"] = cpu
    deployment = build_deployment(owner(spec))
    assert front_of(deployment)["resources"]["limits"]["cpu"] == front
    kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
