"""InferenceService status from what the cluster reports: pure, so every branch is testable.

Conditions follow the Kubernetes API conventions: `type`, `status`, `reason`, `message`,
`lastTransitionTime` (moved only when `status` flips) and `observedGeneration`.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"


@dataclass(frozen=True)
class Problem:
    """Why the operator cannot (fully) realise the spec: becomes the Degraded condition."""

    reason: str
    message: str


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def set_condition(
    conditions: list[dict],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: str,
    generation: int | None = None,
) -> list[dict]:
    """A copy of `conditions` with `type_` set; lastTransitionTime kept unless status flips."""
    value = "True" if status else "False"
    previous = next((c for c in conditions if c.get("type") == type_), None)
    changed = previous is None or previous.get("status") != value
    condition = {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now if changed else previous.get("lastTransitionTime", now),
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    others = [c for c in conditions if c.get("type") != type_]
    return sorted([*others, condition], key=lambda c: c["type"])


def _deployment_condition(deployment: dict, type_: str) -> dict | None:
    for condition in (deployment.get("status") or {}).get("conditions") or []:
        if condition.get("type") == type_:
            return condition
    return None


def rollout(deployment: dict | None) -> tuple[bool, bool, str, int, int, int]:
    """(ready, progressing, message, replicas, readyReplicas, updatedReplicas) of a Deployment."""
    if deployment is None:
        return False, True, "Deployment not created yet", 0, 0, 0
    spec, status = deployment.get("spec") or {}, deployment.get("status") or {}
    desired = spec.get("replicas", 1)
    replicas = status.get("replicas", 0)
    ready = status.get("readyReplicas", 0)
    updated = status.get("updatedReplicas", 0)
    generation = (deployment.get("metadata") or {}).get("generation")
    observed = status.get("observedGeneration")
    caught_up = generation is None or (observed is not None and observed >= generation)
    progressing = not caught_up or updated < desired or replicas > updated
    is_ready = desired > 0 and ready >= desired
    if desired == 0:
        message = "scaled to zero replicas"
    else:
        message = f"{ready}/{desired} replicas ready"
        if progressing:
            message += f", {updated}/{desired} updated"
    return is_ready, progressing, message, replicas, ready, updated


def deployment_problem(deployment: dict | None) -> Problem | None:
    """A rollout that cannot finish without help (quota, image, scheduling deadline)."""
    if deployment is None:
        return None
    failure = _deployment_condition(deployment, "ReplicaFailure")
    if failure and failure.get("status") == "True":
        return Problem("ReplicaFailure", failure.get("message") or "pods cannot be created")
    progress = _deployment_condition(deployment, "Progressing")
    if progress and progress.get("status") == "False" and progress.get("reason") == "ProgressDeadlineExceeded":
        return Problem("ProgressDeadlineExceeded", progress.get("message") or "rollout is stuck")
    return None


def compute_status(
    previous: dict | None,
    deployment: dict | None,
    generation: int | None,
    problem: Problem | None = None,
    now: str | None = None,
) -> dict:
    """The status conditions and replica counts for the current state of the world.

    `problem` comes from the reconciler (invalid spec, apply failed); it wins over what the
    Deployment says, since a Deployment built from an older spec is not news about this one.
    """
    now = now or now_iso()
    previous = previous or {}
    conditions = list(previous.get("conditions") or [])
    is_ready, progressing, message, replicas, ready, updated = rollout(deployment)
    problem = problem or deployment_problem(deployment)

    if is_ready:
        conditions = set_condition(conditions, READY, True, "MinimumReplicasAvailable", message, now, generation)
    else:
        reason = "ScaledToZero" if message.startswith("scaled to zero") else "ReplicasNotReady"
        if problem and deployment is None:
            reason, message = problem.reason, problem.message
        conditions = set_condition(conditions, READY, False, reason, message, now, generation)

    if problem and problem.reason in ("InvalidSpec", "ResourceConflict", "ApplyFailed"):
        progressing = False
        conditions = set_condition(conditions, PROGRESSING, False, "Blocked", problem.message, now, generation)
    elif progressing:
        conditions = set_condition(conditions, PROGRESSING, True, "RolloutInProgress", message, now, generation)
    else:
        conditions = set_condition(conditions, PROGRESSING, False, "RolloutComplete", message, now, generation)

    if problem:
        conditions = set_condition(conditions, DEGRADED, True, problem.reason, problem.message, now, generation)
    else:
        conditions = set_condition(conditions, DEGRADED, False, "AsExpected", "", now, generation)

    return {
        "conditions": conditions,
        "replicas": replicas,
        "readyReplicas": ready,
        "updatedReplicas": updated,
    }


def status_changes(current: dict | None, desired: dict) -> dict:
    """The top-level status keys whose value differs: what a merge patch has to send."""
    current = current or {}
    return {key: value for key, value in desired.items() if current.get(key) != value}
