"""`validate_custom_resource`: the API server's verdict on an InferenceService, field by field."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from inference_operator.models import NAME_MESSAGE
from inference_operator.validation import default_custom_resource, validate_custom_resource
from testsupport.crd import ROOT

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


NAMED = {"name": "resnet", "namespace": "ml"}


def cr(spec: dict[str, Any], metadata: Any = NAMED) -> dict[str, Any]:
    return {"apiVersion": "inference.rocm.dev/v1alpha1", "kind": "InferenceService", "metadata": metadata, "spec": spec}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_accepted(path: Any) -> None:
    assert validate_custom_resource(yaml.safe_load(path.read_text())) == []


def test_defaults_are_filled_as_the_api_server_stores_them() -> None:
    obj = cr({"model": {"uri": "pvc://m"}})
    before = copy.deepcopy(obj)
    stored = default_custom_resource(obj)
    assert obj == before
    assert stored["spec"]["runtime"]["batching"] == {"maxBatchSize": 16, "maxDelayMs": 5, "maxQueue": 256}
    assert stored["spec"]["resources"]["gpu"]["count"] == 1
    assert "autoscaling" not in stored["spec"]


def test_stored_defaults_are_copies_not_the_schemas_own() -> None:
    first = default_custom_resource(cr({"model": {"uri": "pvc://m"}}))
    first["spec"]["runtime"]["env"].append({"name": "A", "value": "b"})
    first["spec"]["runtime"]["executionProviders"].clear()
    second = default_custom_resource(cr({"model": {"uri": "pvc://m"}}))
    assert second["spec"]["runtime"]["env"] == []
    assert second["spec"]["runtime"]["executionProviders"] == ["MIGraphXExecutionProvider", "CPUExecutionProvider"]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"model": {"uri": "pvc://m"}, "replicas": True}, "spec.replicas: True is not of type 'integer'"),
        ({"model": {"uri": "pvc://m"}, "runtime": {"max_batch": 1}}, "spec.runtime.max_batch: unknown field"),
        ({"model": {"uri": "pvc://m"}, "runtime": {"port": 9090}}, "spec.runtime: runtime.port and runtime.metrics"),
        ({}, "spec: 'model' is a required property"),
    ],
)
def test_each_refusal_names_the_field(spec: dict[str, Any], expected: str) -> None:
    errors = validate_custom_resource(cr(spec))
    assert any(e.startswith(expected) for e in errors), errors


def test_cel_rules_run_on_the_defaulted_object() -> None:
    """`port: 9090` alone collides with the default metricsPort only once defaults are filled."""
    assert validate_custom_resource(cr({"model": {"uri": "pvc://m"}, "runtime": {"port": 9091}})) == []
    assert validate_custom_resource(cr({"model": {"uri": "pvc://m"}, "runtime": {"port": 9090}})) != []


def test_snake_case_gets_a_hint() -> None:
    errors = validate_custom_resource(cr({"model": {"uri": "pvc://m"}, "runtime": {"metrics_port": 1}}))
    assert errors == ["spec.runtime.metrics_port: unknown field (fields are camelCase: metricsPort)"]


def test_status_is_not_refused_for_unknown_fields() -> None:
    obj = cr({"model": {"uri": "pvc://m"}}) | {"status": {"somethingNew": 1}}
    assert validate_custom_resource(obj) == []


@pytest.mark.parametrize("value", ["hello", [1], None, 3])
def test_metadata_must_be_a_mapping(value: Any) -> None:
    errors = validate_custom_resource(cr({"model": {"uri": "pvc://m"}}, metadata=value))
    assert any(e.startswith("metadata: ") for e in errors), errors


@pytest.mark.parametrize("metadata", [{}, {"namespace": "ml"}, {"name": ""}])
def test_a_name_is_required(metadata: dict[str, Any]) -> None:
    errors = validate_custom_resource(cr({"model": {"uri": "pvc://m"}}, metadata=metadata))
    assert errors == ["metadata.name: a name is required"]


def test_not_a_mapping() -> None:
    assert validate_custom_resource([1]) == ["<root>: expected a mapping, got list"]


# Each verdict below was first taken from kube-apiserver v1.36.2 with the generated CRD installed
# (`kubectl apply --dry-run=server --validate=strict`): accepted, or refused naming this field.
# The examples/ and these cases, 47 in all, agreed with validate_custom_resource.
API_SERVER_VERDICTS: list[tuple[dict[str, Any], str | None]] = [
    ({"replicas": True}, "spec.replicas"),
    ({"replicas": "3"}, "spec.replicas"),
    ({"resources": {"gpu": {"count": "2"}}}, "spec.resources.gpu.count"),
    ({"resources": {"cpu": 0.5}}, "spec.resources.cpu"),
    ({"resources": {"cpu": 8, "memory": "64Gi"}}, None),
    ({"runtime": {"batching": {"max_batch_size": 4}}}, "spec.runtime.batching.max_batch_size"),
    ({"runtime": {"batching": {"maxDelayMs": 2.5}}}, None),
    ({"surprise": 1}, "spec.surprise"),
    ({"model": {"uri": "pvc://models/../../etc"}}, "spec.model.uri"),
    ({"model": {"uri": "pvc://m", "name": "-x"}}, "spec.model.name"),
    ({"model": {"uri": "pvc://m", "version": "--host=0.0.0.0"}}, "spec.model.version"),
    ({"model": {"uri": "pvc://m", "version": 3}}, "spec.model.version"),
    ({"runtime": {"port": 9090}}, "spec.runtime"),
    ({"runtime": {"port": 9091}}, None),
    ({"runtime": {"args": ["--po", "1"]}}, "spec.runtime.args"),
    ({"runtime": {"args": ["--intra-op-threads=4", "--io-binding", "on"]}}, None),
    ({"runtime": {"env": [{"name": "ROCR_VISIBLE_DEVICES", "value": "3"}]}}, "spec.runtime.env"),
    ({"runtime": {"env": [{"name": "OMP_NUM_THREADS", "value": "3"}]}}, None),
    (
        {
            "resources": {"gpu": {"count": 0, "productName": "X"}},
            "runtime": {"executionProviders": ["CPUExecutionProvider"]},
        },
        "spec.resources.gpu",
    ),
    ({"resources": {"gpu": {"count": 2, "visibleDevices": "0"}}}, "spec.resources.gpu.visibleDevices"),
    ({"resources": {"gpu": {"count": 2, "visibleDevices": "0,1"}}}, None),
    (
        {"resources": {"gpu": {"count": 0}}, "runtime": {"executionProviders": ["ROCMExecutionProvider"]}},
        "spec.runtime.executionProviders",
    ),
    ({"autoscaling": {"minReplicas": 5, "maxReplicas": 2, "target": 1}}, "spec.autoscaling.minReplicas"),
    ({"autoscaling": {"maxReplicas": 2, "target": 1}}, None),
    ({"scheduling": {"nodeSelector": {"bad key!": "x"}}}, "spec.scheduling.nodeSelector"),
    ({"scheduling": {"nodeSelector": {"a" * 64: "x"}}}, "spec.scheduling.nodeSelector"),
    ({"scheduling": {"nodeSelector": {"example.com/pool": "gpu"}}}, None),
    ({"runtime": {"engine": "vllm", "args": ["--tensor-parallel=2"]}}, "spec.runtime.args"),
    ({"runtime": {"engine": "vllm", "args": ["--served_model_name=x"]}}, "spec.runtime.args"),
    ({"runtime": {"engine": "vllm", "args": ["x"]}}, "spec.runtime.args"),
    ({"runtime": {"engine": "vllm", "args": ["--max-num-seqs=8"]}}, None),
    ({"runtime": {"maxModelLen": 4096}}, "spec.runtime.maxModelLen"),
    ({"runtime": {"engine": "vllm", "maxModelLen": 4096}}, None),
    ({"model": {"uri": "s3://b/m", "sha256": "a" * 64}}, "spec.model.sha256"),
    ({"model": {"uri": "https://h/m.onnx", "sha256": "a" * 64}}, None),
]


@pytest.mark.parametrize(("patch", "field"), API_SERVER_VERDICTS)
def test_same_verdict_as_a_real_api_server(patch: dict[str, Any], field: str | None) -> None:
    spec = {"model": {"uri": "pvc://models/m"}} | patch
    errors = validate_custom_resource(cr(spec))
    if field is None:
        assert errors == []
    else:
        assert len(errors) == 1 and errors[0].startswith(field + ":"), errors


@pytest.mark.parametrize("name", ["1model", "a.b", "x" * 64])
def test_names_refused_as_by_a_real_api_server(name: str) -> None:
    errors = validate_custom_resource(cr({"model": {"uri": "pvc://m"}}, metadata={"name": name}))
    assert errors == [NAME_MESSAGE]


def test_runtime_env_values_are_bounded() -> None:
    """64 values of 200 kB each rendered a 25.6 MB Deployment (in 11 s): refused by the schema."""
    from inference_operator.models import SpecError, parse_spec

    base = {"model": {"uri": "pvc://m/x"}, "resources": {"gpu": {"count": 0}}}
    parse_spec({**base, "runtime": {"env": [{"name": "A", "value": "x" * 4096}]}})
    with pytest.raises(SpecError, match="runtime.env"):
        parse_spec({**base, "runtime": {"env": [{"name": "A", "value": "x" * 4097}]}})


def test_repeated_list_map_keys_and_set_entries_are_refused_as_the_api_server_does() -> None:
    """The API server answers `Duplicate value` for a list-map entry whose keys repeat (and a
    repeated set entry) before any CEL rule runs; the schema alone does not say it."""
    spec = {
        "model": {"uri": "pvc://m"},
        "runtime": {"executionProviders": ["CPUExecutionProvider", "CPUExecutionProvider"]},
        "autoscaling": {"maxReplicas": 2, "target": 100},
    }
    errors = validate_custom_resource({"metadata": {"name": "m"}, "spec": spec})
    assert errors == ['spec.runtime.executionProviders[1]: Duplicate value: "CPUExecutionProvider"']
    spec = {"model": {"uri": "pvc://m"}, "scheduling": {"nodeSelector": {"a": "1"}}}
    assert validate_custom_resource({"metadata": {"name": "m"}, "spec": spec}) == []
