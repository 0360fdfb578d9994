"""The InferenceService CustomResourceDefinition, generated from the pydantic models.

    python -m inference_operator.crd            # rewrite crds/ and the chart's crds/ copy
    python -m inference_operator.crd --check    # exit 1 naming each stale file (CI runs this as a test)

models/ is the one source of the schema; the two YAML files are build output, never edited by
hand. To add a spec field: declare it on the right model in models/ with its type, default and
bounds (`Field(ge=..., le=..., pattern=..., max_length=..., description=...)`; the description
becomes `kubectl explain` text: what the field is, its units, what its values mean and how it
interacts with other fields; the generator appends its default and numeric range from the model,
so the text never restates them), put any cross-field check next to it as a CEL rule with
`cel(...)` in that model's `model_config` `json_schema_extra` (or the field's own
`json_schema_extra`), guarding every field the rule reads with `has()`: the API server evaluates
rules against defaults and partial objects, and the model runs the same rules itself (no Python
copy of a rule). Then run `python -m inference_operator.crd` and `python -m
inference_operator.reference` (docs/reference.md), add the field to the spec table of
docs/inferenceservice.md, and commit the regenerated files with the model;
tests/crd/test_crd_cel.py runs every rule on the defaults, on partial and on full objects.

Every property of the CRD has a description (tests/crd/test_crd_descriptions.py): a field's
own, or, for a field whose type is a model and that has none, that model's docstring, so a
model's docstring is written for the cluster user who reads `kubectl explain` (notes for the
code's readers go in comments).
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import pathlib
import sys
from collections.abc import Sequence
from typing import Any

import pydantic_core
import yaml
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from .kinds import CUSTOM_RESOURCE_DEFINITION
from .models import (
    GROUP,
    KIND,
    PLURAL,
    RESOURCE_VALIDATIONS,
    SHORT_NAME,
    VERSION,
    InferenceServiceSpec,
    InferenceServiceStatus,
)

NAME = f"{PLURAL}.{GROUP}"
FILE_NAME = f"{NAME}.yaml"
# Where the generated CRD lives, relative to the repository root: the project's and the chart's.
OUTPUTS = (pathlib.Path("crds") / FILE_NAME, pathlib.Path("charts/rocm-inference-operator/crds") / FILE_NAME)
HEADER = "# Generated from operator/inference_operator/models/ by `python -m inference_operator.crd`; do not edit.\n"
DESCRIPTION = "An InferenceService serves one model on AMD GPUs, autoscaled on latency."
# The type fields of every object, in Kubernetes' own words (its API types' field docs). The root's
# `metadata` may carry nothing but its type in a structural schema: the API server publishes it as
# ObjectMeta, with ObjectMeta's description.
TYPE_META_DESCRIPTIONS = {
    "apiVersion": "APIVersion defines the versioned schema of this representation of an object. Servers should "
    "convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: "
    "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources",
    "kind": "Kind is a string value representing the REST resource this object represents. Servers may infer this "
    "from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: "
    "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds",
}

PRINTER_COLUMNS: list[dict[str, str | int]] = [
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {
        "name": "Reason",
        "type": "string",
        "description": "why it is (not) ready: MinimumReplicasAvailable, ReplicasNotReady, ModelFetchFailed, "
        "ModelLoadFailed, CrashLoopBackOff, ImagePullBackOff, OOMKilled, Unschedulable, ...",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
    },
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas"},
    {
        "name": "Rollout",
        "type": "string",
        "description": "stage of a canary rollout: canary 10%, promoted, rolled back",
        "jsonPath": ".status.rollout.stage",
    },
    {
        "name": "GPUs",
        "type": "integer",
        "description": "AMD GPUs per replica",
        "jsonPath": ".spec.resources.gpu.count",
    },
    {
        "name": "Latency",
        "type": "number",
        "description": "p95 request latency in milliseconds, as last observed by the autoscaler",
        "jsonPath": ".status.autoscaler.latencyP95Ms",
    },
    {
        "name": "Metric",
        "type": "string",
        "description": "the autoscaling metric",
        "jsonPath": ".status.autoscaler.metric",
        "priority": 1,
    },
    {
        "name": "Value",
        "type": "number",
        "description": "the autoscaling metric's value, as last observed (e.g. TTFT p95 ms for ttftP95Ms)",
        "jsonPath": ".status.autoscaler.currentValue",
    },
    {"name": "URL", "type": "string", "jsonPath": ".status.url"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

# Key order in the output, so that a node reads type first and its children last.
_KEY_ORDER = [
    "type",
    "x-kubernetes-int-or-string",
    "anyOf",
    "description",
    "format",
    "enum",
    "required",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "maxProperties",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "default",
    "x-kubernetes-validations",
    "items",
    "additionalProperties",
    "properties",
]
# What pydantic writes that a structural schema has no place for.
_DROPPED = {"title", "$defs"}


class _CrdJsonSchema(GenerateJsonSchema):
    """pydantic's JSON schema, plus the defaults of `default_factory` fields (`{}` for a model:
    the API server then fills the nested defaults itself)."""

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        factory = schema.get("default_factory")
        if factory is None or schema.get("default_factory_takes_data"):
            return super().default_schema(schema)
        json_schema = self.generate_inner(schema["schema"])
        value = factory()  # type: ignore[call-arg]
        default = {} if isinstance(value, BaseModel) else pydantic_core.to_jsonable_python(value)
        return {**json_schema, "default": default}


def _json_schema(model: type[BaseModel]) -> dict[str, Any]:
    return model.model_json_schema(by_alias=True, mode="validation", schema_generator=_CrdJsonSchema)


def _structural(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """One pydantic JSON-schema node as an OpenAPI v3 structural-schema node: references
    inlined, Optional unwrapped, draft-2020 exclusive bounds in OpenAPI's boolean form."""
    node = _unwrapped(dict(node), defs)
    if node.get("additionalProperties") is False:
        del node["additionalProperties"]  # unknown fields are pruned (and refused by strict validation)
    for bound, plain in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(bound), int | float) and not isinstance(node[bound], bool):
            node[plain], node[bound] = node[bound], True
    if "description" in node:
        node["description"] = described(node)
    _nested(node, defs)
    if "x-kubernetes-validations" in node:
        order = ("rule", "message", "messageExpression", "fieldPath", "reason")
        node["x-kubernetes-validations"] = [
            {k: r[k] for k in order if k in r} for r in node["x-kubernetes-validations"]
        ]
    unknown = set(node) - set(_KEY_ORDER) - _DROPPED
    if unknown:
        raise ValueError(f"no place in a structural schema for {sorted(unknown)}: {node}")
    return {key: node[key] for key in _KEY_ORDER if key in node}


def _unwrapped(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """`node` with its references inlined and its Optional / single allOf wrappers removed."""
    while True:
        if "$ref" in node:
            # The referenced model's docstring describes a field that has no description of its own.
            node = {**defs[node.pop("$ref").rsplit("/", 1)[1]], **node}
        elif "anyOf" in node and any(s.get("type") == "null" for s in node["anyOf"]):
            inner = [s for s in node.pop("anyOf") if s.get("type") != "null"]
            if node.get("default", ...) is None:
                del node["default"]
            node = {**inner[0], **node} if len(inner) == 1 else {**node, "anyOf": inner}
        elif "allOf" in node and len(node["allOf"]) == 1:
            node = {**node.pop("allOf")[0], **node}
        else:
            return node


def described(node: dict[str, Any]) -> str:
    """`node`'s description on one line, followed by what the schema says of its values: its
    default (not an empty one: an object's `{}` only lets the API server fill in its fields)
    and its numeric range. `kubectl explain` shows neither, and a sentence restating them by
    hand would drift from the model."""
    text = " ".join(str(node["description"]).split())
    facts = []
    low, high = node.get("minimum"), node.get("maximum")
    open_low, open_high = bool(node.get("exclusiveMinimum")), bool(node.get("exclusiveMaximum"))
    if low is not None and high is not None and not (open_low or open_high):
        facts.append(f"Range: {shown(low)} to {shown(high)}.")
    else:
        bounds = [f"{'above' if open_low else 'at least'} {shown(low)}"] if low is not None else []
        bounds += [f"{'below' if open_high else 'at most'} {shown(high)}"] if high is not None else []
        if bounds:
            facts.append(f"Range: {', '.join(bounds)}.")
    if "default" in node and node["default"] not in ({}, [], ""):
        facts.append(f"Default: {shown(node['default'])}.")
    return " ".join([text, *facts])


def shown(value: Any) -> str:
    """A default or a bound as YAML would show it: 5 not 5.0, true, [a, b]."""
    if isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, list):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    return str(value)


def _nested(node: dict[str, Any], defs: dict[str, Any]) -> None:
    """Make the schemas nested in `node` (properties, items, map values) structural too."""
    if "properties" in node:
        node["properties"] = {name: _structural(sub, defs) for name, sub in node["properties"].items()}
    if isinstance(node.get("items"), dict):
        node["items"] = _structural(node["items"], defs)
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = _structural(node["additionalProperties"], defs)


def _schema_of(model: type[BaseModel]) -> dict[str, Any]:
    """`model`'s schema, its docstring the description."""
    schema = _json_schema(model)
    return _structural(schema, schema.get("$defs", {}))


def open_api_schema() -> dict[str, Any]:
    """The openAPIV3Schema of the served version."""
    return {
        "type": "object",
        "description": DESCRIPTION,
        "required": ["spec"],
        **RESOURCE_VALIDATIONS,
        "properties": {
            "apiVersion": {"type": "string", "description": TYPE_META_DESCRIPTIONS["apiVersion"]},
            "kind": {"type": "string", "description": TYPE_META_DESCRIPTIONS["kind"]},
            "metadata": {"type": "object"},
            "spec": _schema_of(InferenceServiceSpec),
            "status": _schema_of(InferenceServiceStatus),
        },
    }


@functools.cache
def _definition() -> dict[str, Any]:
    return {
        **CUSTOM_RESOURCE_DEFINITION.header(),
        "metadata": {
            "name": NAME,
            "labels": {
                "app.kubernetes.io/name": "rocm-inference-operator",
                "app.kubernetes.io/part-of": "rocm-inference-operator",
            },
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": [SHORT_NAME],
                "categories": ["all", "inference"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": open_api_schema()},
                }
            ],
        },
    }


def definition() -> dict[str, Any]:
    """The CustomResourceDefinition as a mapping (a fresh copy each call)."""
    return copy.deepcopy(_definition())


def render() -> str:
    """The CRD file's text, byte for byte."""
    return HEADER + yaml.safe_dump(definition(), sort_keys=False, width=10_000, allow_unicode=True)


def stale_files(root: pathlib.Path) -> list[pathlib.Path]:
    """The generated files under `root` whose content differs from what the models give."""
    text = render()
    return [root / out for out in OUTPUTS if not (root / out).is_file() or (root / out).read_text() != text]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference_operator.crd", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only report stale files (exit 1), write nothing")
    parser.add_argument("--root", type=pathlib.Path, default=pathlib.Path.cwd(), help="repository root")
    args = parser.parse_args(argv)
    stale = stale_files(args.root)
    if args.check:
        for path in stale:
            print(f"{path} is stale: run python -m inference_operator.crd", file=sys.stderr)
        return 1 if stale else 0
    text = render()
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
