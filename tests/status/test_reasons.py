"""Every reason the operator writes on a condition or an event is a member of one enum: a
literal reason at a writing call is a second spelling of the same word, free to drift."""

from __future__ import annotations

import ast
import pathlib
import re

import yaml

import inference_operator
from inference_operator import credentials, status_pods
from inference_operator.handlers.canary import ROLLOUT_EVENTS
from inference_operator.handlers.shared import KEPT_PROBLEMS
from inference_operator.reasons import Reason
from inference_operator.status import Problem, set_condition

PACKAGE = pathlib.Path(inference_operator.__file__).parent
# metav1.Condition's reason, as the API server validates it.
CONDITION_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
# The calls that write a reason, and where the reason is: (positional index, keyword).
WRITERS = {
    "set_condition": (3, "reason"),
    "Problem": (0, "reason"),
    "CredentialsRefused": (0, "reason"),
    "normal_event": (1, "reason"),
    "post_event": (0, "reason"),
    "event": (None, "reason"),  # kopf.event
    "warn": (None, "reason"),  # kopf.warn
}


def _called_name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def literal_reasons(source: str) -> list[tuple[int, str]]:
    """(line, word) of every string literal passed as the reason of a writing call in `source`,
    including each branch of a conditional expression."""
    found = []
    for call in (node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)):
        name = _called_name(call)
        if name not in WRITERS:
            continue
        index, keyword = WRITERS[name]
        args = [kw.value for kw in call.keywords if kw.arg == keyword]
        if index is not None and len(call.args) > index:
            args.append(call.args[index])
        found += [(node.lineno, node.value) for arg in args for node in _literals(arg)]
    return sorted(found)


def _literals(node: ast.expr) -> list[ast.Constant]:
    """The string constants an argument can evaluate to (a reason read from a mapping, as
    `condition["reason"]`, is no literal)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node]
    if isinstance(node, ast.IfExp):
        return _literals(node.body) + _literals(node.orelse)
    if isinstance(node, ast.BoolOp):
        return [c for value in node.values for c in _literals(value)]
    return []


def test_no_writing_call_spells_a_reason_itself() -> None:
    found = [
        f"{path.relative_to(PACKAGE)}:{line}: {word!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, word in literal_reasons(path.read_text())
    ]
    assert found == [], "reasons written as literals (add them to reasons.Reason):\n" + "\n".join(found)


def test_the_check_finds_literal_reasons() -> None:
    source = (
        'set_condition(conditions, READY, False, "NotYet", "", now)\n'
        'st.Problem("InvalidSpec", str(exc))\n'
        'kopf.warn(body, reason="CanaryRolledBack", message=m)\n'
        'normal_event(body, "Ready" if ok else "NotReady", message)\n'
        'kopf.warn(body, reason=Reason.API_ERROR, message="a message is free text")\n'
        'set_condition(conditions, "Ready", True, Reason.READY, "the type is no reason", now)\n'
        'kopf.warn(body, reason=condition["reason"], message=condition.get("message", ""))\n'
    )
    assert [word for _, word in literal_reasons(source)] == [
        "NotYet",
        "InvalidSpec",
        "CanaryRolledBack",
        "NotReady",
        "Ready",
    ]


def test_every_reason_is_a_word_the_api_server_accepts() -> None:
    assert [r.value for r in Reason if not CONDITION_REASON.match(r.value) or len(r.value) > 1024] == []


def test_the_groups_of_reasons_hold_only_members() -> None:
    """The tuples other modules match conditions against are made of members, so a reason
    read back from the cluster is recognised exactly when the operator wrote it."""
    groups = [status_pods.REASONS, credentials.REFUSALS, KEPT_PROBLEMS, tuple(ROLLOUT_EVENTS)]
    assert all(isinstance(reason, Reason) for group in groups for reason in group)
    assert Reason.ROLLED_BACK in KEPT_PROBLEMS and Reason.API_ERROR in KEPT_PROBLEMS


def test_a_written_condition_holds_the_plain_word() -> None:
    """Status goes out as JSON and as YAML (render): the reason is a str, equal to the member."""
    (condition,) = set_condition([], "Degraded", True, Reason.ROLLED_BACK, "revision 2", "2026-01-01T00:00:00Z")
    assert type(condition["reason"]) is str and condition["reason"] == Reason.ROLLED_BACK == "RolledBack"
    assert "reason: RolledBack" in yaml.safe_dump(condition)
    assert Problem(Reason("ApiError"), "") == Problem(Reason.API_ERROR, "")
