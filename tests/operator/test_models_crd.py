"""The CRD schema and the pydantic spec model must describe the same thing, with equal defaults."""

from __future__ import annotations

import copy

import pytest

from inference_operator.models import InferenceServiceSpec, SpecError, parse_spec
from tests.crd import apply_defaults, crd, crd_schema, schema_errors

SPEC_SCHEMA = crd_schema()["properties"]["spec"]
MODEL_SCHEMA = InferenceServiceSpec.model_json_schema(by_alias=True, mode="validation")
CONSTRAINTS = ("minimum", "maximum", "pattern", "enum", "minItems", "maxItems", "maxLength", "minLength")


def _resolve(node: dict) -> dict:
    """Follow $ref and unwrap Optional (anyOf [X, null]) in pydantic's JSON schema."""
    while True:
        if "$ref" in node:
            node = {
                **MODEL_SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[1]],
                **{k: v for k, v in node.items() if k != "$ref"},
            }
        elif "anyOf" in node and any(s.get("type") == "null" for s in node["anyOf"]):
            inner = [s for s in node["anyOf"] if s.get("type") != "null"]
            node = {**inner[0], **{k: v for k, v in node.items() if k not in ("anyOf", "default")}}
        elif "allOf" in node and len(node["allOf"]) == 1:
            node = {**node["allOf"][0], **{k: v for k, v in node.items() if k != "allOf"}}
        else:
            return node


def _walk(crd_node: dict, model_node: dict, path: str, found: list[str]) -> None:
    model_node = _resolve(model_node)
    if "items" in crd_node:
        assert crd_node.get("minItems") == model_node.get("minItems"), f"{path}: minItems"
        _walk(crd_node["items"], model_node.get("items", {}), path + "[]", found)
        return
    if isinstance(crd_node.get("additionalProperties"), dict):
        _walk(crd_node["additionalProperties"], model_node.get("additionalProperties", {}), path + "{}", found)
        return
    crd_props = crd_node.get("properties") or {}
    model_props = model_node.get("properties") or {}
    if crd_props or model_props:
        assert set(crd_props) == set(model_props), (
            f"{path}: only in CRD {sorted(set(crd_props) - set(model_props))}, "
            f"only in model {sorted(set(model_props) - set(crd_props))}"
        )
        assert set(crd_node.get("required", [])) == set(model_node.get("required", [])), path
        for name in crd_props:
            _walk(crd_props[name], model_props[name], f"{path}.{name}", found)
        return
    found.append(path)
    model_leaf = _resolve(model_node)
    for key in CONSTRAINTS:
        crd_value = crd_node.get(key)
        model_value = model_leaf.get(key)
        if key == "enum" and model_value is None and "items" in model_leaf:
            model_value = _resolve(model_leaf["items"]).get("enum")
        if key == "minimum" and crd_node.get("exclusiveMinimum"):
            model_value = model_leaf.get("exclusiveMinimum")
        if key == "maximum" and crd_node.get("exclusiveMaximum"):
            model_value = model_leaf.get("exclusiveMaximum")
        if key in ("maxItems", "maxLength") and model_value is None:
            continue  # API-server cost bounds for CEL; the model has no such limits to mirror
        assert crd_value == model_value, f"{path}: {key} CRD={crd_value!r} model={model_value!r}"


def test_every_field_and_constraint_agrees() -> None:
    leaves: list[str] = []
    _walk(SPEC_SCHEMA, MODEL_SCHEMA, "spec", leaves)
    assert len(leaves) > 40  # the walk reached the leaves, it did not stop at the top


MINIMAL = {"model": {"uri": "pvc://models/m"}}
WITH_AUTOSCALING = {"model": {"uri": "s3://b/m"}, "autoscaling": {"maxReplicas": 4, "target": 50}}


@pytest.mark.parametrize("spec", [MINIMAL, WITH_AUTOSCALING], ids=["minimal", "autoscaling"])
def test_defaults_are_equal(spec: dict) -> None:
    from_crd = apply_defaults(SPEC_SCHEMA, copy.deepcopy(spec))
    from_model = parse_spec(spec).model_dump(by_alias=True, mode="json", exclude_none=True)
    assert from_crd == from_model


def test_crd_has_subresources_and_columns() -> None:
    version = crd()["spec"]["versions"][0]
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    columns = [c["name"].upper() for c in version["additionalPrinterColumns"]]
    assert columns == ["READY", "REPLICAS", "GPUS", "LATENCY", "URL", "AGE"]
    names = crd()["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == ("InferenceService", "inferenceservices", ["ris"])


def test_every_printer_column_points_at_a_schema_field() -> None:
    version = crd()["spec"]["versions"][0]
    schema = crd_schema()
    for column in version["additionalPrinterColumns"]:
        path = column["jsonPath"].split("[")[0].strip(".").split(".")
        if path[0] == "metadata":
            continue
        node = schema
        for part in path:
            assert part in node.get("properties", {}), f"{column['name']}: {column['jsonPath']}"
            node = node["properties"][part]


CEL_CASES = [
    ({"autoscaling": {"minReplicas": 5, "maxReplicas": 2, "target": 1}}, "minReplicas"),
    ({"resources": {"gpu": {"count": 0, "productName": "X"}}}, "count is 0"),
    ({"resources": {"gpu": {"count": 2, "visibleDevices": "0"}}}, "visibleDevices"),
    ({"runtime": {"port": 9090, "metricsPort": 9090}}, "must differ"),
    (
        {"resources": {"gpu": {"count": 0}}, "runtime": {"executionProviders": ["ROCMExecutionProvider"]}},
        "CPUExecutionProvider",
    ),
    ({"scheduling": {"nodeSelector": {"bad key!": "x"}}}, "valid label key"),
]


@pytest.mark.parametrize(("patch", "message"), CEL_CASES)
def test_model_enforces_what_cel_rules_say(patch: dict, message: str) -> None:
    """Every cross-field CEL rule in the CRD has the same rule in the model, same message."""
    rules = [r["message"] for r in _cel_rules(crd_schema())]
    assert any(message in r for r in rules), f"no CEL rule mentions {message!r}"
    with pytest.raises(SpecError) as err:
        parse_spec({**MINIMAL, **patch})
    assert message in str(err.value)


def _cel_rules(node: dict) -> list[dict]:
    rules = list(node.get("x-kubernetes-validations", []))
    for child in (node.get("properties") or {}).values():
        rules += _cel_rules(child)
    if isinstance(node.get("items"), dict):
        rules += _cel_rules(node["items"])
    return rules


def test_every_cel_rule_has_a_case() -> None:
    messages = [r["message"] for r in _cel_rules(crd_schema())]
    covered = [m for m in messages if any(case_msg in m for _, case_msg in CEL_CASES)]
    assert covered == messages


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"model": {"uri": "ftp://x"}}, "spec.model.uri"),
        ({"model": {"uri": "pvc://Not_A_Claim/m"}}, "spec.model.uri"),
        (
            {"model": {"uri": "pvc://m"}, "scheduling": {"nodeSelector": {"pool": "no spaces"}}},
            "spec.scheduling.nodeSelector.pool",
        ),
        ({"model": {"uri": "pvc://m", "format": "tensorflow"}}, "spec.model.format"),
        ({"model": {"uri": "pvc://m"}, "resources": {"gpu": {"count": 17}}}, "spec.resources.gpu.count"),
        ({"model": {"uri": "pvc://m"}, "resources": {"memory": "lots"}}, "spec.resources.memory"),
        (
            {"model": {"uri": "pvc://m"}, "runtime": {"batching": {"maxBatchSize": 0}}},
            "spec.runtime.batching.maxBatchSize",
        ),
        ({"model": {"uri": "pvc://m"}, "autoscaling": {"maxReplicas": 2, "target": 0}}, "spec.autoscaling.target"),
        (
            {"model": {"uri": "pvc://m"}, "autoscaling": {"maxReplicas": 2, "target": 5, "metric": "cpu"}},
            "spec.autoscaling.metric",
        ),
    ],
)
def test_schema_and_model_reject_the_same_field(spec: dict, field: str) -> None:
    errors = schema_errors(
        {
            "apiVersion": "inference.rocm.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": "x"},
            "spec": spec,
        }
    )
    assert errors and errors[0].startswith(field.removeprefix("") + ":") or any(e.startswith(field) for e in errors), (
        errors
    )
    with pytest.raises(SpecError) as err:
        parse_spec(spec)
    assert err.value.field == field


def test_unknown_fields_are_named() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({"model": {"uri": "pvc://m"}, "resources": {"gpus": 2}})
    assert err.value.field == "spec.resources.gpus"
    assert "not permitted" in err.value.message


def test_quantities_accept_numbers() -> None:
    spec = parse_spec({"model": {"uri": "pvc://m"}, "resources": {"cpu": 8, "memory": "64Gi"}})
    assert spec.resources.cpu == "8"
