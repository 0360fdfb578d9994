"""runtime.tracing as a real kube-apiserver takes it: the CRD's pattern and bounds on the
endpoint, its default sampling ratio, and the CEL rules that keep runtime.args and runtime.env
off what it sets."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from testsupport.envtest import ApiServer

pytestmark = [pytest.mark.realapi, pytest.mark.slow, pytest.mark.integration]

ENDPOINT = "http://otel-collector.observability:4318/v1/traces"


def apply(server: ApiServer, ns: str, name: str, runtime: dict, check: bool = False):  # noqa: ANN201
    doc = {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"model": {"uri": "pvc://models/m", "name": "m"}, "runtime": runtime},
    }
    return server.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(doc), check=check)


def test_the_api_server_takes_a_tracing_endpoint_and_refuses_what_is_not_one(apiserver: ApiServer) -> None:
    ns = f"tracing-{int(time.time() * 1000) % 100000}"
    apiserver.kubectl("create", "namespace", ns)
    apply(apiserver, ns, "traced", {"tracing": {"endpoint": ENDPOINT}}, check=True)
    stored = json.loads(apiserver.kubectl("get", "inferenceservice", "traced", "-n", ns, "-o", "json").stdout)
    assert stored["spec"]["runtime"]["tracing"] == {"endpoint": ENDPOINT, "samplingRatio": 1}
    refused = {
        "scheme": ({"tracing": {"endpoint": "grpc://collector:4317"}}, "spec.runtime.tracing.endpoint"),
        "userinfo": ({"tracing": {"endpoint": "http://u:p@collector/v1/traces"}}, "spec.runtime.tracing.endpoint"),
        "long": ({"tracing": {"endpoint": "http://c/" + "a" * 2048}}, "spec.runtime.tracing.endpoint"),
        "ratio": ({"tracing": {"endpoint": ENDPOINT, "samplingRatio": 2}}, "spec.runtime.tracing.samplingRatio"),
        "msargs": ({"args": ["--otlp-traces-endpoint", "http://elsewhere/v1/traces"]}, "runtime.args"),
        "vllmargs": ({"engine": "vllm", "args": ["--otlp-traces-endpoint=http://elsewhere/x"]}, "runtime.args"),
        "vllmenv": ({"engine": "vllm", "env": [{"name": "OTEL_TRACES_SAMPLER", "value": "always_on"}]}, "runtime.env"),
        # The pod itself or its node: vLLM's loopback port, the metadata service, the pod's own port.
        "loopback": (
            {"engine": "vllm", "tracing": {"endpoint": "http://127.0.0.1:8081/v1/load_lora_adapter"}},
            "runtime.tracing.endpoint must not name the pod or its node",
        ),
        "decimal": ({"tracing": {"endpoint": "http://2130706433:8081/"}}, "must not name the pod or its node"),
        "metadata": ({"tracing": {"endpoint": "http://169.254.169.254/"}}, "must not name the pod or its node"),
        "mapped": ({"tracing": {"endpoint": "http://[::ffff:127.0.0.1]/"}}, "must not name the pod or its node"),
        "own-port": ({"tracing": {"endpoint": "http://otel:8080/v1/traces"}}, "a port of the pod's own"),
    }
    for name, (runtime, words) in refused.items():
        result = apply(apiserver, ns, name, runtime)
        assert result.returncode != 0, f"{name} was accepted"
        assert words in result.stderr, (name, result.stderr)
