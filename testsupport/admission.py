"""A ValidatingAdmissionPolicy run the way the API server runs it, without an API server.

Its matchConditions, then its variables (in order, each seeing those before it), then its
validations and their messageExpressions, over `object`, `oldObject` and `request`, in the CEL
evaluator of `inference_operator.cel_rules` (standard CEL plus the Kubernetes functions it knows)
with `substring` of the Kubernetes strings library added (the chart's pod policy cuts `oci://`
with it). An expression that cannot be evaluated raises `AdmissionError`: with failurePolicy
Fail the API server would refuse the request, so a test must never mistake it for a verdict.
resourceRules are not matched here; the caller passes objects of the policy's kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cel

from inference_operator.cel_rules import KUBERNETES_FUNCTIONS, compile_rule
from inference_operator.jsontypes import JsonObject


class AdmissionError(Exception):
    """An expression of the policy failed to evaluate (the API server would refuse the request)."""


def substring(text: str, start: int, end: int | None = None) -> str:
    """Kubernetes' strings library: `'oci://x'.substring(6)`, `'abc'.substring(1, 2)`; out of
    range is an error there too."""
    stop = len(text) if end is None else end
    if not 0 <= start <= stop <= len(text):
        raise ValueError(f"substring({start}, {stop}) out of range for a string of length {len(text)}")
    return text[start:stop]


FUNCTIONS = {**KUBERNETES_FUNCTIONS, "substring": substring}


@dataclass(frozen=True)
class Verdict:
    """Whether the policy applies to the request and, if so, the message of each failed validation."""

    matched: bool
    messages: tuple[str, ...] = ()

    @property
    def allowed(self) -> bool:
        return not self.matched or not self.messages


def _run(expression: str, inputs: dict[str, Any]) -> Any:
    context = cel.Context()
    for name, function in FUNCTIONS.items():
        context.add_function(name, function)
    for name, value in inputs.items():
        context.add_variable(name, value)
    try:
        return compile_rule(expression).execute(context)
    except (KeyError, RuntimeError, TypeError, ValueError, OverflowError) as exc:
        raise AdmissionError(f"{expression!r}: {exc!r}") from exc


def evaluate(
    policy: JsonObject,
    obj: JsonObject | None,
    old: JsonObject | None = None,
    operation: str = "CREATE",
    user: str = "admin",
) -> Verdict:
    """The policy's verdict on a request by `user` writing `obj` (over `old` for an UPDATE)."""
    spec = policy["spec"]
    metadata = (obj or old or {}).get("metadata") or {}
    request = {
        "operation": operation,
        "name": metadata.get("name", ""),
        "namespace": metadata.get("namespace", ""),
        "userInfo": {"username": user},
    }
    # The request's Namespace, as the API server hands it to a policy (its name is all we know).
    namespace = {"metadata": {"name": request["namespace"]}} if request["namespace"] else None
    inputs: dict[str, Any] = {
        "object": obj,
        "oldObject": old,
        "request": request,
        "params": None,
        "namespaceObject": namespace,
    }
    for condition in spec.get("matchConditions") or []:
        if _run(condition["expression"], inputs) is not True:
            return Verdict(matched=False)
    variables: dict[str, Any] = {}
    for variable in spec.get("variables") or []:
        variables[variable["name"]] = _run(variable["expression"], {**inputs, "variables": variables})
    inputs["variables"] = variables
    messages = []
    for validation in spec["validations"]:
        result = _run(validation["expression"], inputs)
        if result is not True and result is not False:
            raise AdmissionError(f"{validation['expression']!r} is {result!r}, not a bool")
        if not result:
            if "messageExpression" in validation:
                message = _run(validation["messageExpression"], inputs)
                if not isinstance(message, str) or not message:
                    raise AdmissionError(f"{validation['messageExpression']!r} is {message!r}, not a message")
            else:
                message = validation.get("message") or f"failed expression: {validation['expression']}"
            messages.append(message)
    return Verdict(matched=True, messages=tuple(messages))
