"""`kubectl explain` answers for every field of the shipped CRD: each property, at every level
(objects, list items' fields, map values), has a description, taken from the pydantic models
(a field's own, else its model's docstring), with the default and range the schema gives.

The root's `metadata` is the one exception: a structural schema may give it nothing but its
type, and the API server publishes it as ObjectMeta with ObjectMeta's own description."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest

from inference_operator import crd as crdgen
from inference_operator.models import BatchingSpec, InferenceServiceSpec, InferenceServiceStatus, ModelSpec
from testsupport.crd import crd_schema


def properties(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, schema) of every property under `node`: `a.b`, `a[].c` for a list item's field,
    `a{}.c` for a map value's."""
    for name, sub in (node.get("properties") or {}).items():
        here = f"{path}.{name}" if path else name
        yield here, sub
        yield from properties(sub, here)
    if isinstance(node.get("items"), dict):
        yield from properties(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from properties(node["additionalProperties"], f"{path}{{}}")


def node_at(path: str) -> dict[str, Any]:
    node = crd_schema()
    for part in path.split("."):
        node = node["properties"][part]
    return node


def test_every_property_of_the_shipped_crd_is_described() -> None:
    found = list(properties(crd_schema()))
    paths = {path for path, _ in found}
    # The walk reached the spec's and the status's depths, list items included.
    assert {"spec.runtime.batching.maxBatchSize", "spec.runtime.env[].name", "status.conditions[].reason"} <= paths
    assert len(found) > 150
    undescribed = [
        path for path, node in found if path != "metadata" and not str(node.get("description") or "").strip()
    ]
    assert undescribed == [], f"properties without a description: {undescribed}"


@pytest.mark.parametrize(
    ("path", "model"),
    [("spec", InferenceServiceSpec), ("status", InferenceServiceStatus), ("spec.model", ModelSpec)],
)
def test_an_object_field_without_its_own_description_has_its_models_docstring(path: str, model: type) -> None:
    docstring = " ".join(inspect.getdoc(model).split())  # type: ignore[union-attr]
    assert node_at(path)["description"] == docstring


def test_a_fields_own_description_wins_over_its_models_docstring() -> None:
    """spec.runtime.batching has no description of its own, its model's docstring; a field that
    names a model and says how it is used there keeps its own words."""
    assert node_at("spec.runtime.batching")["description"] == " ".join(inspect.getdoc(BatchingSpec).split())  # type: ignore[union-attr]
    field = InferenceServiceSpec.model_fields["autoscaling"].description
    assert field and node_at("spec.autoscaling")["description"] == field


def test_defaults_and_ranges_come_from_the_schema() -> None:
    """Every property with a non-empty default says it, and every bounded number its range, in the
    words the generator writes: the text cannot drift from the model's values."""
    checked = 0
    for path, node in properties(crd_schema()):
        default = node.get("default")
        if default not in (None, {}, [], ""):
            assert f"Default: {crdgen.shown(default)}." in node["description"], path
            checked += 1
        if node.get("type") == "integer" and "minimum" in node and "maximum" in node:
            assert f"Range: {node['minimum']} to {node['maximum']}." in node["description"], path
    assert checked > 40
    assert node_at("spec.runtime.batching.maxBatchSize")["description"].endswith("Range: 1 to 1024. Default: 16.")


@pytest.mark.parametrize(
    ("node", "facts"),
    [
        ({"type": "number", "minimum": 0, "exclusiveMinimum": True}, "Range: above 0."),
        ({"type": "number", "minimum": 0, "maximum": 1, "exclusiveMaximum": True}, "Range: at least 0, below 1."),
        ({"type": "integer", "minimum": 1}, "Range: at least 1."),
        ({"type": "number", "minimum": 0, "maximum": 1, "default": 1.0}, "Range: 0 to 1. Default: 1."),
        ({"type": "boolean", "default": False}, "Default: false."),
        ({"type": "array", "default": ["a", "b"]}, "Default: [a, b]."),
        ({"type": "object", "default": {}}, ""),
        ({"type": "string", "default": ""}, ""),
    ],
)
def test_the_facts_appended_to_a_description(node: dict[str, Any], facts: str) -> None:
    assert crdgen.described({**node, "description": "What it is,\n   on one line."}) == (
        "What it is, on one line." + (f" {facts}" if facts else "")
    )
