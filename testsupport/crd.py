"""The CRD as test data: its path, the document, and its openAPIV3Schema for jsonschema."""

from __future__ import annotations

import functools
import pathlib

import jsonschema
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
CRD_PATH = ROOT / "crds" / "inferenceservices.inference.rocm.dev.yaml"


@functools.cache
def crd() -> dict:
    return yaml.safe_load(CRD_PATH.read_text())


def crd_schema() -> dict:
    """The v1alpha1 openAPIV3Schema; OpenAPI's boolean exclusiveMinimum is draft-04 style."""
    return crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def schema_errors(obj: dict) -> list[str]:
    """Messages naming the field, as an API server would phrase them; empty when valid."""
    validator = jsonschema.Draft4Validator(crd_schema())
    return [
        f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
        for e in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
    ]


def apply_defaults(schema: dict, value):
    """Structural defaulting as an API server does it: fill `default`s of absent properties,
    then recurse into objects and array items (defaults of `{}` get their own defaults)."""
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        result = dict(value)
        for name, sub in props.items():
            if name not in result and "default" in sub:
                result[name] = sub["default"]
            if name in result:
                result[name] = apply_defaults(sub, result[name])
        if isinstance(schema.get("additionalProperties"), dict):
            extra = schema["additionalProperties"]
            for name in set(result) - set(props):
                result[name] = apply_defaults(extra, result[name])
        return result
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(schema["items"], item) for item in value]
    return value
