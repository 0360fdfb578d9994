"""`validate_custom_resource`: the API server's verdict on an InferenceService, field by field."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

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
