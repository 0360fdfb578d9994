"""An InferenceService checked the way the API server checks it, with no cluster.

The API server prunes (or, with strict field validation as kubectl asks for, refuses) unknown
fields, fills the schema's defaults, validates the OpenAPI schema and then evaluates the CEL rules
(`x-kubernetes-validations`) on the defaulted object. `validate_custom_resource` does the same
against the CRD generated from models/, so `render`, the tests and the emulated API server give
the verdict a real one would (CEL through cel.py).
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

import jsonschema

from .cel_rules import child, compile_rule, evaluate_rule, to_cel
from .crd import open_api_schema

__all__ = [
    "apply_defaults",
    "cel_errors",
    "compile_rule",
    "default_custom_resource",
    "evaluate_rule",
    "schema_errors",
    "to_cel",
    "validate_custom_resource",
]

# What the API server checks of metadata itself (ObjectMeta), for the fields a manifest sets.
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
METADATA_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "generateName": {"type": "string"},
        "namespace": {"type": "string"},
        "uid": {"type": "string"},
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
        "generation": {"type": "integer"},
        "resourceVersion": {"type": "string"},
        "finalizers": {"type": "array", "items": {"type": "string"}},
    },
}
# Deeper than any InferenceService (or its managedFields) goes; deeper input is refused early.
MAX_DEPTH = 64
MAX_MESSAGE = 300
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _join(path: str, part: str) -> str:
    return f"{path}.{part}" if path else part


def cel_errors(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """Every CEL rule of `schema` and its descendants, run on each node present in `value`."""
    errors: list[str] = []
    for rule in schema.get("x-kubernetes-validations", []):
        problem = evaluate_rule(rule, value, schema)
        if problem:
            where = path + str(rule.get("fieldPath", "")) if rule.get("fieldPath") else path
            # A rule on the root names its field in its message (metadata.name ...).
            errors.append(f"{where.lstrip('.')}: {problem}" if where else problem)
    if isinstance(value, dict):
        for key, item in value.items():
            sub = child(schema, key)
            if sub:
                errors += cel_errors(sub, item, _join(path, key))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            errors += cel_errors(schema["items"], item, f"{path}[{index}]")
    return errors


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting as the API server does it: fill the `default` of absent properties,
    then recurse into objects and array items (a default of `{}` gets its own defaults)."""
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        result = dict(value)
        for name, sub in props.items():
            if name not in result and "default" in sub:
                result[name] = copy.deepcopy(sub["default"])  # never share the schema's own value
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


def unknown_fields(schema: dict[str, Any], value: Any, path: str = "") -> Iterator[str]:
    """Fields the schema does not declare (the API server drops them; strict validation refuses)."""
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if props is not None and key in props:
                yield from unknown_fields(props[key], item, _join(path, str(key)))
            elif isinstance(extra, dict):
                yield from unknown_fields(extra, item, _join(path, str(key)))
            elif props:  # an object with declared fields and no others allowed
                yield _join(path, str(key))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            yield from unknown_fields(schema["items"], item, f"{path}[{index}]")


@functools.cache
def _schema() -> dict[str, Any]:
    """The CRD's schema, built once and only read (the generator takes tens of milliseconds)."""
    return open_api_schema()


@functools.cache
def _validator() -> jsonschema.Draft4Validator:
    # OpenAPI v3.0's exclusiveMinimum/Maximum are draft-04 booleans.
    schema = open_api_schema()  # a copy of its own
    schema["properties"]["metadata"] = METADATA_SCHEMA
    return jsonschema.Draft4Validator(schema)


def schema_errors(obj: Any) -> list[str]:
    """OpenAPI schema violations of a (defaulted) object, each naming the field."""
    found = sorted(_validator().iter_errors(obj), key=lambda e: [str(p) for p in e.absolute_path])
    errors = [f"{_path(e.absolute_path) or '<root>'}: {_shorten(e.message)}" for e in found]
    return errors + list_type_errors(open_api_schema(), obj)


def list_type_errors(schema: dict[str, Any], value: Any) -> list[str]:
    """Repeated entries of `x-kubernetes-list-type` map (by their keys) and set lists, which the
    API server refuses (`Duplicate value`) before any CEL rule runs."""
    errors = []
    stack: list[tuple[dict[str, Any], Any, str]] = [(schema, value, "")]
    while stack:
        node, item, path = stack.pop()
        if isinstance(item, dict):
            for key, child_value in item.items():
                if isinstance(child_schema := (node.get("properties") or {}).get(key), dict):
                    stack.append((child_schema, child_value, _join(path, key)))
        elif isinstance(item, list) and isinstance(node.get("items"), dict):
            list_type = node.get("x-kubernetes-list-type")
            keys = node.get("x-kubernetes-list-map-keys") or []
            seen: set[str] = set()
            for index, entry in enumerate(item):
                if list_type in ("map", "set"):
                    by_keys = list_type == "map" and isinstance(entry, dict)
                    identity = json.dumps({k: entry.get(k) for k in keys} if by_keys else entry, sort_keys=True)
                    if identity in seen:
                        errors.append(f"{path}[{index}]: Duplicate value: {_shorten(identity)}")
                    seen.add(identity)
                stack.append((node["items"], entry, f"{path}[{index}]"))
    return sorted(errors)


def _path(parts: Iterable[Any]) -> str:
    text = ""
    for part in parts:
        text = f"{text}[{part}]" if isinstance(part, int) else _join(text, str(part))
    return text


def _shorten(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."


def too_deep(obj: Any, limit: int = MAX_DEPTH) -> str | None:
    """The path of the first value nested deeper than `limit`, or None (iterative: no recursion)."""
    stack: list[tuple[Any, str, int]] = [(obj, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > limit:
            return path or "<root>"
        if isinstance(value, dict):
            stack += [(v, _join(path, str(k)), depth + 1) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
    return None


def default_custom_resource(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as the API server stores it: schema defaults filled (input left unchanged)."""
    result: dict[str, Any] = apply_defaults(_schema(), obj)
    return result


def validate_custom_resource(obj: Any) -> list[str]:
    """The API server's verdict on an InferenceService (create or update); empty when accepted.

    Each message starts with the field it is about (`spec.runtime.port: ...`). Order of checks
    as on the API server: unknown fields (strict field validation, as kubectl sends), then the
    OpenAPI schema on the defaulted object, then the CEL rules when the schema holds. For an
    emulated API server: call it on every create/update/patch result of an InferenceService and
    refuse the write with 422 when the list is not empty; store `default_custom_resource(obj)`.
    """
    if not isinstance(obj, dict):
        return [f"<root>: expected a mapping, got {type(obj).__name__}"]
    if deep := too_deep(obj):
        return [f"{deep}: nested deeper than {MAX_DEPTH} levels"]
    schema = _schema()
    errors = [
        f"{path}: unknown field" + _hint(path)
        for path in unknown_fields(schema, obj)
        if path.split(".")[0] != "status"  # status is the operator's, pruned not refused
    ]
    defaulted = default_custom_resource(obj)
    errors += schema_errors(defaulted)
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        if metadata is None:
            errors.append("metadata.name: a name is required")
    elif not metadata.get("name") and not metadata.get("generateName"):
        errors.append("metadata.name: a name is required")
    elif isinstance(name := metadata.get("name"), str) and not (DNS_SUBDOMAIN.match(name) and len(name) <= 253):
        errors.append("metadata.name: must be a lowercase RFC 1123 subdomain")
    if not errors:
        errors += cel_errors(schema, defaulted)
    return errors


def _hint(path: str) -> str:
    leaf = path.rsplit(".", 1)[-1]
    if "_" in leaf:
        head, *rest = leaf.split("_")
        return f" (fields are camelCase: {head + ''.join(p.title() for p in rest)})"
    return ""
