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
from inference_operator.validation import apply_defaults, validate_custom_resource

__all__ = ["CRD_PATH", "ROOT", "apply_defaults", "crd", "crd_schema", "schema_errors", "validate_custom_resource"]

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
