"""The InferenceService reference page (docs/reference.md), generated from the CRD's schema.

    python -m inference_operator.reference            # rewrite docs/reference.md
    python -m inference_operator.reference --check    # exit 1 when it is stale (a test runs this)

The page is made from the same schema as the CRD (`crd.open_api_schema()`, itself from the
pydantic models in models/), so the field list, types, defaults, bounds, descriptions and CEL
rules a reader sees are the ones the API server enforces: a field added to a model is on the page
once this runs, and the test fails until it has. The page is build output: never edit it by hand.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .crd import open_api_schema
from .models import GROUP, KIND, SHORT_NAME, VERSION

OUTPUT = pathlib.Path("docs") / "reference.md"
GENERATED = (
    "<!-- Generated from operator/inference_operator/models/ by `python -m inference_operator.reference`;"
    " do not edit. -->\n"
)


@dataclass(frozen=True)
class Field:
    """One property of an object in the schema, as a row of its object's table."""

    name: str
    path: str
    type: str
    default: str
    constraints: str
    description: str
    required: bool
    has_section: bool


@dataclass(frozen=True)
class Section:
    """One object of the schema (spec, spec.model, spec.adapters[], ...): its own fields and rules."""

    path: str
    description: str
    fields: tuple[Field, ...]
    rules: tuple[str, ...]


def anchor(path: str) -> str:
    """The section's id on the page: `spec.resources.gpu` -> `spec-resources-gpu`."""
    return re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-")


def _object_of(node: dict[str, Any]) -> dict[str, Any] | None:
    """The object schema a field leads to (itself, or the items of a list of objects)."""
    if "properties" in node:
        return node
    items = node.get("items")
    if isinstance(items, dict) and "properties" in items:
        return items
    return None


def _child_path(path: str, name: str, node: dict[str, Any]) -> str:
    return f"{path}.{name}[]" if "properties" not in node and _object_of(node) is not None else f"{path}.{name}"


def type_of(node: dict[str, Any]) -> str:
    """A reader's name for a schema node's type."""
    if node.get("x-kubernetes-int-or-string"):
        return "quantity (integer or string)"
    kind = node.get("type", "any")
    if kind == "array":
        items = node.get("items")
        return f"list of {type_of(items) if isinstance(items, dict) else 'any'}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map of {type_of(node['additionalProperties'])}"
    return str(kind)


def _code(value: str) -> str:
    """A code span for a table cell, whatever backticks the value holds (the site's tables keep
    a pipe inside a code span in its cell)."""
    fence = "``" if "`" in value else "`"
    pad = " " if "`" in value else ""
    return f"{fence}{pad}{value}{pad}{fence}"


def _text(value: str) -> str:
    """Prose for a table cell: one line, pipes escaped."""
    return " ".join(value.split()).replace("|", "\\|")


def constraints_of(node: dict[str, Any]) -> str:
    """What the schema bounds a value to, in words."""
    parts: list[str] = []
    if "enum" in node:
        parts.append("one of " + ", ".join(_code(json.dumps(v) if not isinstance(v, str) else v) for v in node["enum"]))
    for key, word in (("minimum", "≥"), ("maximum", "≤")):
        if key in node:
            strict = node.get(f"exclusive{key[:1].upper()}{key[1:]}") is True
            parts.append(f"{word.replace('≥', '>').replace('≤', '<') if strict else word} {node[key]}")
    for key, word in (
        ("minLength", "at least {} characters"),
        ("maxLength", "at most {} characters"),
        ("minItems", "at least {} items"),
        ("maxItems", "at most {} items"),
        ("maxProperties", "at most {} entries"),
    ):
        if key in node:
            parts.append(word.format(node[key]))
    if "pattern" in node:
        parts.append("matches " + _code(node["pattern"]))
    items = node.get("items")
    if isinstance(items, dict) and "properties" not in items:
        inner = constraints_of(items)
        if inner:
            parts.append(f"each: {inner}")
    return "; ".join(parts)


def _default_of(node: dict[str, Any]) -> str:
    if "default" not in node:
        return ""
    value = node["default"]
    if value == {} and "properties" in node:
        return "{} (its fields' defaults)"
    return _code(json.dumps(value, separators=(", ", ": ")))


def _rules_of(node: dict[str, Any]) -> tuple[str, ...]:
    return tuple(_text(rule.get("message") or rule["rule"]) for rule in node.get("x-kubernetes-validations", []))


def sections(node: dict[str, Any], path: str) -> Iterator[Section]:
    """The object at `path` and every object under it, depth first, in the schema's order."""
    obj = _object_of(node)
    if obj is None:
        return
    required = set(obj.get("required", []))
    fields: list[Field] = []
    rules = list(_rules_of(obj))
    children: list[tuple[dict[str, Any], str]] = []
    for name, sub in obj["properties"].items():
        child = _child_path(path, name, sub)
        has_section = _object_of(sub) is not None
        # A field's own rules are listed with its object, naming it.
        rules.extend(f"`{name}`: {rule}" for rule in _rules_of(sub) if not has_section)
        if isinstance(sub.get("items"), dict) and not has_section:
            rules.extend(f"`{name}[]`: {rule}" for rule in _rules_of(sub["items"]))
        fields.append(
            Field(
                name=name,
                path=child,
                type=type_of(sub),
                default=_default_of(sub),
                constraints=constraints_of(sub),
                description=_text(sub.get("description", "")),
                required=name in required,
                has_section=has_section,
            )
        )
        if has_section:
            children.append((sub, child))
    description = _text(node.get("description", "") or obj.get("description", ""))
    yield Section(path=path, description=description, fields=tuple(fields), rules=tuple(rules))
    for sub, child in children:
        if "properties" not in sub:
            # A list of objects: the list's own rules go with the list's section.
            yield from _list_section(sub, child)
        else:
            yield from sections(sub, child)


def _list_section(node: dict[str, Any], path: str) -> Iterator[Section]:
    for section in sections(node["items"], path):
        if section.path == path:
            rules = _rules_of(node) + section.rules
            description = section.description or _text(node.get("description", ""))
            yield Section(path=path, description=description, fields=section.fields, rules=rules)
        else:
            yield section


def _row(field: Field) -> str:
    name = f"[`{field.name}`](#{anchor(field.path)})" if field.has_section else f"`{field.name}`"
    if field.required:
        name += " (required)"
    description = field.description or "–"
    return f"| {name} | {field.type} | {field.default or '–'} | {field.constraints or '–'} | {description} |"


def render_section(section: Section) -> str:
    lines = [f"## {section.path} {{ #{anchor(section.path)} }}", ""]
    if section.description:
        lines += [section.description, ""]
    lines += ["| field | type | default | bounds | description |", "| --- | --- | --- | --- | --- |"]
    lines += [_row(field) for field in section.fields]
    if section.rules:
        lines += ["", "The API server refuses an object that breaks a rule here:", ""]
        lines += [f"- {rule}" for rule in section.rules]
    return "\n".join(lines) + "\n"


def render() -> str:
    """The page's text, byte for byte."""
    schema = open_api_schema()
    head = [
        GENERATED,
        "# InferenceService reference",
        "",
        f"`{GROUP}/{VERSION}`, kind `{KIND}` (short name `{SHORT_NAME}`): every field of the CRD's schema, "
        "with the type, default, bounds and description the API server holds, and the rules it checks "
        "across fields. `kubectl explain ris.spec.FIELD` gives the same descriptions on a cluster. "
        "A guide to the spec by topic is [The InferenceService](inferenceservice.md).",
        "",
    ]
    top_rules = _rules_of(schema)
    if top_rules:
        head += ["The API server refuses an object that breaks a rule on the whole resource:", ""]
        head += [f"- {rule}" for rule in top_rules] + [""]
    body = [render_section(s) for part in ("spec", "status") for s in sections(schema["properties"][part], part)]
    return "\n".join(head) + "\n" + "\n".join(body)


def is_stale(root: pathlib.Path) -> bool:
    target = root / OUTPUT
    return not target.is_file() or target.read_text() != render()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference_operator.reference", description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only report a stale page (exit 1), write nothing")
    parser.add_argument("--root", type=pathlib.Path, default=pathlib.Path.cwd(), help="repository root")
    args = parser.parse_args(argv)
    target = args.root / OUTPUT
    if args.check:
        if is_stale(args.root):
            print(f"{target} is stale: run python -m inference_operator.reference", file=sys.stderr)
            return 1
        return 0
    if is_stale(args.root):
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(render())
        print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
