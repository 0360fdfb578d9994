"""Hypothesis strategies drawn from the CRD's own openAPIV3Schema.

A small generator for the structural subset of OpenAPI the CRD uses (objects, arrays, enums,
patterns, bounds, int-or-string), so fuzzing follows the schema as it changes.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

MAX_ITEMS = 3


def _integer(node: dict) -> st.SearchStrategy[int]:
    low = node.get("minimum", -(10**6))
    high = node.get("maximum", 10**6)
    if node.get("exclusiveMinimum"):
        low += 1
    if node.get("exclusiveMaximum"):
        high -= 1
    return st.integers(low, high)


def _number(node: dict) -> st.SearchStrategy[float]:
    return st.floats(
        min_value=node.get("minimum", -1e6),
        max_value=node.get("maximum", 1e6),
        exclude_min=bool(node.get("exclusiveMinimum")),
        exclude_max=bool(node.get("exclusiveMaximum")),
        allow_nan=False,
        allow_infinity=False,
    )


def _string(node: dict) -> st.SearchStrategy[str]:
    if "pattern" in node:
        strategy = st.from_regex(node["pattern"], fullmatch=True)
    else:
        strategy = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=20)
    if "maxLength" in node:
        strategy = strategy.filter(lambda s: len(s) <= node["maxLength"])
    if "minLength" in node:
        strategy = strategy.filter(lambda s: len(s) >= node["minLength"])
    return strategy


def from_schema(node: dict) -> st.SearchStrategy[Any]:
    """Values that satisfy `node` (CEL rules aside: those are the model's to enforce)."""
    if "enum" in node:
        return st.sampled_from(node["enum"])
    if node.get("x-kubernetes-int-or-string"):
        return st.one_of(st.integers(0, 512), _string({**node, "type": "string"}))
    kind = node.get("type")
    if kind == "object":
        props = node.get("properties") or {}
        if not props and isinstance(node.get("additionalProperties"), dict):
            return st.dictionaries(
                st.from_regex(r"^[a-z][a-z0-9.-]{0,15}$", fullmatch=True),
                from_schema(node["additionalProperties"]),
                max_size=MAX_ITEMS,
            )
        required = set(node.get("required", []))
        return st.fixed_dictionaries(
            {name: from_schema(props[name]) for name in props if name in required},
            optional={name: from_schema(props[name]) for name in props if name not in required},
        )
    if kind == "array":
        items = from_schema(node["items"])
        size = {"min_size": node.get("minItems", 0), "max_size": min(node.get("maxItems", MAX_ITEMS), MAX_ITEMS)}
        if node.get("x-kubernetes-list-type") == "set":
            return st.lists(items, unique=True, **size)
        return st.lists(items, **size)
    if kind == "integer":
        return _integer(node)
    if kind == "number":
        return _number(node)
    if kind == "string":
        return _string(node)
    if kind == "boolean":
        return st.booleans()
    raise ValueError(f"no strategy for schema node {node}")


def leaf_paths(node: dict, prefix: tuple = ()) -> list[tuple]:
    """Paths of every property in the schema, for targeted corruption of valid objects."""
    paths = []
    for name, child in (node.get("properties") or {}).items():
        path = (*prefix, name)
        paths.append(path)
        paths.extend(leaf_paths(child, path))
    return paths


JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**9), 10**9),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)
