"""runtime.grpcPort: the model server's gRPC port on the container, the Service (appProtocol grpc)
and the NetworkPolicy's open ports, the flag on its command line; refused at apply time for vLLM,
which serves no gRPC inference protocol, and where it takes another port of the pod."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from inference_operator.builders import Owner, build_all
from inference_operator.models import SpecError, parse_spec
from inference_operator.settings import NetworkPolicySettings
from inference_operator.validation import validate_custom_resource

NETWORK = NetworkPolicySettings(enabled=True, operator_namespace="inference-system")


def objects(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    owner = Owner(name="resnet", namespace="ml", uid="u-1", spec=parse_spec(spec), network=NETWORK)
    built = {obj["kind"]: obj for obj in build_all(owner)}
    for obj in built.values():
        kubernetes_validate.validate(obj, "1.33", strict=True)
    return built


def cr(runtime: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "m", "namespace": "ml"},
        "spec": {"model": {"uri": "pvc://models/m"}, "runtime": runtime},
    }


def test_grpc_port_reaches_the_flag_the_container_the_service_and_the_network_policy():
    built = objects({"model": {"uri": "pvc://models/m"}, "runtime": {"grpcPort": 8081}})
    container = built["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[args.index("--grpc-port") + 1] == "8081"
    assert {"name": "grpc", "containerPort": 8081, "protocol": "TCP"} in container["ports"]
    service_ports = {p["name"]: p for p in built["Service"]["spec"]["ports"]}
    assert service_ports["grpc"] == {
        "name": "grpc",
        "port": 8081,
        "targetPort": "grpc",
        "protocol": "TCP",
        "appProtocol": "grpc",
    }
    open_to_all = [rule for rule in built["NetworkPolicy"]["spec"]["ingress"] if "from" not in rule]
    assert [p["port"] for rule in open_to_all for p in rule["ports"]] == [8080, 8081]


def test_without_grpc_port_nothing_of_it_is_rendered():
    built = objects({"model": {"uri": "pvc://models/m"}})
    container = built["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert "--grpc-port" not in container["args"]
    assert "grpc" not in {p["name"] for p in container["ports"]}
    assert "grpc" not in {p["name"] for p in built["Service"]["spec"]["ports"]}


@pytest.mark.parametrize(
    ("runtime", "words"),
    [
        ({"engine": "vllm", "grpcPort": 8081}, "runtime.grpcPort applies to engine modelServer only"),
        ({"grpcPort": 8080}, "runtime.grpcPort must differ from runtime.port and runtime.metricsPort"),
        ({"grpcPort": 9090}, "runtime.grpcPort must differ"),
        ({"port": 9000, "grpcPort": 9000}, "runtime.grpcPort must differ"),
    ],
)
def test_grpc_port_is_refused_at_apply_time_where_it_cannot_be_served(runtime, words):
    errors = validate_custom_resource(cr(runtime))
    assert len(errors) == 1 and errors[0].startswith("spec.runtime.grpcPort:") and words in errors[0], errors
    with pytest.raises(SpecError, match=words):
        parse_spec(cr(runtime)["spec"])


def test_grpc_port_may_not_be_set_through_args_or_env():
    errors = validate_custom_resource(cr({"args": ["--grpc-port=1"], "env": [{"name": "MODEL_SERVER_GRPC_PORT"}]}))
    assert len(errors) == 2, errors
    assert validate_custom_resource(cr({"grpcPort": 8081})) == []
