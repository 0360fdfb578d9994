"""The CRD as test data: its path, the document as shipped, and its openAPIV3Schema for jsonschema.

`schema_errors` checks the OpenAPI schema only (as written, no defaulting); the API server's whole
verdict (unknown fields, defaults, schema, CEL rules) is `validate_custom_resource`, from the
operator package, re-exported here.
"""

from __future__ import annotations

import functools
import pathlib

import jsonschema
import yaml

from inference_operator.jsontypes import JsonObject
from inference_operator.validation import apply_defaults, cel_errors, unknown_fields, validate_custom_resource

__all__ = [
    "CRD_PATH",
    "ROOT",
    "addon_errors",
    "apply_defaults",
    "crd",
    "crd_schema",
    "schema_errors",
    "validate_custom_resource",
]

ROOT = pathlib.Path(__file__).resolve().parent.parent
CRD_PATH = ROOT / "crds" / "inferenceservices.inference.rocm.dev.yaml"


@functools.cache
def crd() -> JsonObject:
    document: JsonObject = yaml.safe_load(CRD_PATH.read_text())
    return document


def crd_schema() -> JsonObject:
    """The v1alpha1 openAPIV3Schema; OpenAPI's boolean exclusiveMinimum is draft-04 style."""
    schema: JsonObject = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def schema_errors(obj: JsonObject) -> list[str]:
    """Messages naming the field, as an API server would phrase them; empty when valid."""
    validator = jsonschema.Draft4Validator(crd_schema())
    return [
        f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
    ]


# Add-on kinds kubernetes-validate has no schema for, and the stand-in CRDs this repository has.
ADDON_CRDS = {
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): ROOT
    / "testsupport"
    / "crds"
    / "httproutes.gateway.networking.k8s.io.yaml",
    ("inference.networking.k8s.io/v1", "InferencePool"): ROOT
    / "testsupport"
    / "crds"
    / "inferencepools.inference.networking.k8s.io.yaml",
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): ROOT
    / "testsupport"
    / "crds"
    / "leaderworkersets.leaderworkerset.x-k8s.io.yaml",
}


@functools.cache
def _addon_schema(api_version: str, kind: str) -> JsonObject | None:
    path = ADDON_CRDS.get((api_version, kind))
    if path is None:
        return None
    schema: JsonObject = yaml.safe_load(path.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def addon_errors(obj: JsonObject) -> list[str] | None:
    """An add-on's object as an API server with its (stand-in) CRD would judge it: unknown
    fields, the schema on the defaulted object, then the CEL rules; None without a stand-in."""
    schema = _addon_schema(obj["apiVersion"], obj["kind"])
    if schema is None:
        return None
    errors = [f"{path}: unknown field" for path in unknown_fields(schema, obj)]
    defaulted = apply_defaults(schema, obj)
    validator = jsonschema.Draft4Validator(schema)
    errors += [f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}" for e in validator.iter_errors(defaulted)]
    return errors or cel_errors(schema, defaulted)
