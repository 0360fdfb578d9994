"""CEL rules (`x-kubernetes-validations`) run the way the API server runs them.

One evaluator (the `common-expression-language` package, a compiled CEL implementation) for the
model (models/ runs the rules it declares instead of rewriting them in Python), `render`, the
emulated API server and the tests. Standard CEL plus the functions of the Kubernetes CEL
libraries that the rules call; a rule calling any other fails loudly ("cannot be evaluated"),
never passes silently.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import cel


def _split(text: str, separator: str) -> list[str]:
    """Kubernetes' strings library: `'a,b'.split(',')`."""
    return text.split(separator)


def _is_sorted(values: list[Any]) -> bool:
    """Kubernetes' lists library: `[1, 2].isSorted()`."""
    return all(a <= b for a, b in zip(values, values[1:], strict=False))


def _index_of(values: list[Any], value: Any) -> int:
    """Kubernetes' lists library: `[1, 2].indexOf(2)`, -1 when absent."""
    return next((i for i, v in enumerate(values) if v == value), -1)


def _last_index_of(values: list[Any], value: Any) -> int:
    """Kubernetes' lists library: `[1, 2, 1].lastIndexOf(1)`, -1 when absent."""
    return next((len(values) - 1 - i for i, v in enumerate(reversed(values)) if v == value), -1)


# Functions of the Kubernetes CEL libraries (beyond standard CEL) that the CRD's rules call.
KUBERNETES_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "split": _split,
    "isSorted": _is_sorted,
    "indexOf": _index_of,
    "lastIndexOf": _last_index_of,
}
# What a rule that cannot run raises: an absent field (KeyError), an unknown function, a type clash.
_EVALUATION_ERRORS = (KeyError, RuntimeError, TypeError, ValueError, OverflowError)


@functools.cache
def compile_rule(rule: str) -> cel.Program:
    """The rule parsed and ready to run; raises ValueError on a syntax error."""
    return cel.compile(rule)


def to_cel(value: Any, schema: dict[str, Any] | None = None) -> Any:
    """A JSON value as CEL sees it under `schema`: `type: number` is a double even when written `5`."""
    schema = schema or {}
    if isinstance(value, dict):
        return {k: to_cel(v, child(schema, k)) for k, v in value.items()}
    if isinstance(value, list):
        items = schema.get("items")
        return [to_cel(v, items if isinstance(items, dict) else None) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and schema.get("type") == "number":
        return float(value)
    return value


def child(schema: dict[str, Any], key: str) -> dict[str, Any]:
    """The schema of property `key` of an object described by `schema` ({} when undeclared)."""
    props = schema.get("properties") or {}
    if key in props:
        found: dict[str, Any] = props[key]
        return found
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, dict) else {}


def evaluate_rule(rule: dict[str, Any], value: Any, schema: dict[str, Any] | None = None) -> str | None:
    """None when the rule holds for `value` (the node `schema` describes); else why not.

    Without `schema` the value is taken as typed already (a model's dump: floats are floats)."""
    problems = evaluate_rules([rule], value, schema)
    return problems[0] if problems else None


def evaluate_rules(rules: Sequence[dict[str, Any]], value: Any, schema: dict[str, Any] | None = None) -> list[str]:
    """Why each rule that does not hold for `value` fails, in order; one CEL context for all."""
    context = cel.Context()
    for name, function in KUBERNETES_FUNCTIONS.items():
        context.add_function(name, function)
    context.add_variable("self", value if schema is None else to_cel(value, schema))
    problems = []
    for rule in rules:
        try:
            result = compile_rule(rule["rule"]).execute(context)
        except _EVALUATION_ERRORS as exc:
            reason = f"no such key: {exc.args[0]}" if isinstance(exc, KeyError) else str(exc)
            problems.append(f"rule {rule['rule']!r} cannot be evaluated: {reason}")
            continue
        if result is not True:
            problems.append(str(rule.get("message") or f"failed rule: {rule['rule']}"))
    return problems
