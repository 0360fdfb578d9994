"""runtime.tracing: the endpoint in a CR is its author's, so only the serving container (the
author's own code) is told of it, never a container that holds a credential; the schema bounds
it; the pods render valid with it."""

from __future__ import annotations

import copy
import json

import kubernetes_validate
import pytest

from inference_operator.builders import Owner, build_deployment
from inference_operator.models import parse_spec
from inference_operator.settings import Images
from inference_operator.validation import validate_custom_resource
from testsupport.cluster import inference_service
from testsupport.crd import apply_defaults, crd_schema

ENDPOINT = "http://otel-collector.observability:4318/v1/traces"
SPEC_SCHEMA = crd_schema()["properties"]["spec"]
K8S_VERSION = "1.33"


def owner(spec: dict) -> Owner:
    parsed = parse_spec(apply_defaults(SPEC_SCHEMA, copy.deepcopy(spec)))
    return Owner(name="svc", namespace="ml", uid="u-1", spec=parsed, images=Images())


def model_server_spec(**runtime: object) -> dict:
    return {
        "model": {"uri": "hf://org/resnet", "huggingFace": {"tokenSecret": "hub-token"}},
        "runtime": dict(runtime),
        "resources": {"gpu": {"count": 0}},
    }


def vllm_spec(**runtime: object) -> dict:
    return {
        "model": {"uri": "hf://org/llama", "name": "llama", "huggingFace": {"tokenSecret": "hub-token"}},
        "runtime": {"engine": "vllm", **runtime},
        "resources": {"gpu": {"count": 1}},
        "adapters": [{"name": "sql", "uri": "hf://org/sql-lora"}],
    }


def container_env(deployment: dict, name: str) -> list[dict]:
    return containers(deployment)[name]["env"]


def containers(deployment: dict) -> dict[str, dict]:
    pod = deployment["spec"]["template"]["spec"]
    return {c["name"]: c for c in [*pod.get("initContainers", []), *pod["containers"]]}


def test_the_model_servers_command_line_carries_the_endpoint_and_ratio_and_no_other_container_sees_it():
    deployment = build_deployment(owner(model_server_spec(tracing={"endpoint": ENDPOINT, "samplingRatio": 0.25})))
    kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    found = containers(deployment)
    args = found.pop("model-server")["args"]
    at = args.index("--otlp-traces-endpoint")
    assert args[at : at + 4] == ["--otlp-traces-endpoint", ENDPOINT, "--trace-sample-ratio", "0.25"]
    env = {e["name"]: e for e in container_env(deployment, "model-server")}
    assert env["OTEL_K8S_POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    attributes = env["OTEL_RESOURCE_ATTRIBUTES"]["value"]
    assert attributes == "k8s.pod.name=$(OTEL_K8S_POD_NAME),k8s.namespace.name=ml,inference.service=svc"
    names = [e["name"] for e in container_env(deployment, "model-server")]
    assert names.index("OTEL_K8S_POD_NAME") < names.index("OTEL_RESOURCE_ATTRIBUTES")  # $(...) sees it
    assert found, "the hf:// model is fetched by an init container holding the Hub token"
    for name, container in found.items():
        assert ENDPOINT not in json.dumps(container), name
        assert "OTEL_" not in json.dumps(container), name


def test_vllm_exports_its_own_spans_over_http_and_the_credential_containers_never_see_the_endpoint():
    deployment = build_deployment(owner(vllm_spec(tracing={"endpoint": ENDPOINT, "samplingRatio": 0.5})))
    kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    found = containers(deployment)
    vllm = found.pop("vllm")
    assert f"--otlp-traces-endpoint={ENDPOINT}" in vllm["args"]
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "http/protobuf"
    assert (env["OTEL_TRACES_SAMPLER"], env["OTEL_TRACES_SAMPLER_ARG"]) == ("parentbased_traceidratio", "0.5")
    assert env["OTEL_RESOURCE_ATTRIBUTES"].startswith("k8s.pod.name=$(OTEL_K8S_POD_NAME),")
    assert len(found) >= 2, "the Hub-token fetcher and the adapters sidecar are in the pod"
    for name, container in found.items():
        assert ENDPOINT not in json.dumps(container), name
        assert "OTEL_" not in json.dumps(container), name


@pytest.mark.parametrize("spec", [model_server_spec(), vllm_spec()], ids=["modelServer", "vllm"])
def test_without_runtime_tracing_no_container_is_told_of_any(spec):
    rendered = json.dumps(build_deployment(owner(spec))).lower()
    assert "otlp" not in rendered and "otel_" not in rendered and "trace-sample" not in rendered


def verdict(tracing: object = None, engine: str = "modelServer", **runtime: object) -> list[str]:
    if tracing is not None:
        runtime["tracing"] = tracing
    spec = model_server_spec(engine=engine, **runtime)
    return validate_custom_resource(inference_service("svc", "ml", spec))


@pytest.mark.parametrize(
    "endpoint",
    [
        "ftp://collector:4318/v1/traces",
        "collector:4318",
        "http://user:secret@collector:4318/v1/traces",
        "http://collector:4318/v1/traces?token=x",
        "http://collector:4318/v1/traces#x",
        "http://collector:4318/v1 traces",
        "http://collector/" + "a" * 2048,
    ],
)
def test_the_schema_refuses_an_endpoint_that_is_not_a_plain_http_url(endpoint):
    errors = verdict({"endpoint": endpoint})
    assert errors and all(e.startswith("spec.runtime.tracing.endpoint") for e in errors), errors


def test_the_schema_accepts_http_and_https_and_bounds_the_ratio():
    assert verdict({"endpoint": ENDPOINT}) == []
    assert verdict({"endpoint": "https://collector.example:443/otlp/v1/traces", "samplingRatio": 0}) == []
    assert verdict({"endpoint": ENDPOINT, "samplingRatio": 1.5})
    assert verdict({"endpoint": ENDPOINT, "samplingRatio": -0.1})
    assert verdict({"samplingRatio": 0.5}), "an endpoint is required"


@pytest.mark.parametrize(
    ("engine", "runtime"),
    [
        ("modelServer", {"args": ["--otlp-traces-endpoint", "http://elsewhere/v1/traces"]}),
        ("modelServer", {"args": ["--trace-sample-ratio=1"]}),
        ("vllm", {"args": ["--otlp-traces-endpoint=http://elsewhere/v1/traces"]}),
        ("vllm", {"env": [{"name": "OTEL_TRACES_SAMPLER", "value": "always_on"}]}),
        ("modelServer", {"env": [{"name": "MODEL_SERVER_OTLP_TRACES_ENDPOINT", "value": "http://elsewhere/v1"}]}),
        ("modelServer", {"env": [{"name": "MODEL_SERVER_TRACE_SAMPLE_RATIO", "value": "1"}]}),
    ],
)
def test_args_and_env_cannot_set_what_runtime_tracing_sets(engine, runtime):
    assert verdict(engine="modelServer" if engine == "modelServer" else "vllm") == []
    errors = verdict(engine=engine, **runtime)
    assert errors and all(e.startswith(("spec.runtime.args", "spec.runtime.env")) for e in errors), errors
