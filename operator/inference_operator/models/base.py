"""The base of every spec model, and the CEL rules a model declares for the API server.

A rule is written once, next to the model it checks (`cel(...)` in its `json_schema_extra`): the
CRD carries it, and the model runs it as the API server would (`cel_rules.evaluate_rules`), so no
Python copy of a rule can drift from the one the cluster enforces.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic.alias_generators import to_camel

from ..cel_rules import evaluate_rules
from .names import NAME_MAX_LENGTH, NAME_MESSAGE, NAME_PATTERN


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, Any]:
    """A CEL rule for the API server, as the `json_schema_extra` of a model or field.

    The API server also evaluates each rule against every `default:` in the schema as written and
    on objects that lack optional fields: guard every field a rule reads with `has()`.
    """
    entry: dict[str, Any] = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return {"x-kubernetes-validations": [entry]}


def cel_rules(*rules: dict[str, Any]) -> dict[str, Any]:
    """Several `cel(...)` rules on one node."""
    return {"x-kubernetes-validations": [r for rule in rules for r in rule["x-kubernetes-validations"]]}


# Rules on the whole object (the CRD's root); at the root, CEL sees metadata.name and generateName.
RESOURCE_VALIDATIONS = cel(
    f"!has(self.metadata) || !has(self.metadata.name) || size(self.metadata.name) <= {NAME_MAX_LENGTH}"
    f" && self.metadata.name.matches('{NAME_PATTERN}')",
    NAME_MESSAGE,
)


class SpecModel(BaseModel):
    """Base for spec models: camelCase on the wire, unknown fields are an error, and the CEL rules
    declared on a model or its fields hold (run here as the API server runs them, not rewritten)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )

    @model_validator(mode="after")
    def _cel_rules_hold(self) -> Self:
        declared = _declared_rules(type(self))
        if declared:
            data = self.model_dump(by_alias=True, mode="json", exclude_none=True)
            for key, rules in declared:
                if key is None or key in data:
                    if problems := evaluate_rules(rules, data if key is None else data[key]):
                        raise ValueError(problems[0])
        return self


@functools.cache
def _declared_rules(model: type[BaseModel]) -> list[tuple[str | None, list[dict[str, Any]]]]:
    """(None for the model or a field's alias, its rules) for every `cel(...)` on `model`."""

    def rules(extra: object) -> list[dict[str, Any]]:
        found = extra.get("x-kubernetes-validations") if isinstance(extra, dict) else None
        return [r for r in found if isinstance(r, dict)] if isinstance(found, list) else []

    declared: list[tuple[str | None, list[dict[str, Any]]]] = [
        (None, rules(model.model_config.get("json_schema_extra")))
    ]
    for name, field in model.model_fields.items():
        declared.append((field.alias or name, rules(field.json_schema_extra)))
    return [(key, found) for key, found in declared if found]


def flag_prefixes(flag: str) -> str:
    """A regex matching every non-empty prefix of `flag`, `-` or `_` between words."""
    chars = ["[-_]" if c == "-" else c for c in flag]
    pattern = ""
    for c in reversed(chars[1:]):
        pattern = f"({c}{pattern})?"
    return chars[0] + pattern


def cel_list(values: tuple[str, ...]) -> str:
    """`values` as a CEL list of string literals (plain words: nothing to escape)."""
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def prefixes_pattern(words: tuple[str, ...]) -> str:
    """An RE2 pattern for every prefix of every word (the empty one too): one regex per argument
    is far cheaper for a CEL evaluator than a loop over the words."""
    trie: dict[str, Any] = {}
    for word in words:
        assert re.fullmatch(r"[a-z0-9-]+", word), word  # nothing to escape, in RE2 or in a CEL string
        node = trie
        for char in word:
            node = node.setdefault(char, {})

    def optional(node: dict[str, Any]) -> str:
        return "(?:" + "|".join(char + optional(sub) for char, sub in node.items()) + ")?" if node else ""

    return optional(trie)


def cel_string(pattern: str) -> str:
    """`pattern` as a single-quoted CEL string literal."""
    return "'" + pattern.replace("\\", "\\\\").replace("'", "\\'") + "'"
