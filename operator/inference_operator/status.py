"""InferenceService status from what the cluster reports: pure, so every branch is testable.

Conditions follow the Kubernetes API conventions: `type`, `status`, `reason`, `message`,
`lastTransitionTime` (moved only when `status` flips) and `observedGeneration`. Rollout
progress is read from the Deployment the way `kubectl rollout status` reads it, so the
InferenceService never says "complete" while kubectl still says "waiting".
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, replace

from .jsontypes import JsonObject
from .kinds import LEADER_WORKER_SET
from .reasons import Reason

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"

# Problems that stop the operator from applying the spec at all: rollout progress is blocked.
BLOCKING_PROBLEMS = (Reason.INVALID_SPEC, Reason.POLICY_VIOLATION, Reason.RESOURCE_CONFLICT, Reason.APPLY_FAILED)
# Problems that only a change of the InferenceService (or of the cluster's APIs) can clear:
# Deployment events keep them rather than overwrite them with rollout news.
SPEC_PROBLEMS = (*BLOCKING_PROBLEMS, Reason.API_UNAVAILABLE)
# Failures that retrying clears by itself, not news for the user.
ROUTINE_API_STATUSES = (409, 429)


def api_error_problem(status: int, reason: str, message: str, limit: int = 1024) -> Problem | None:
    """The Degraded problem for an API error that persisted across a retry (a full Service IP
    range, RBAC, an admission webhook down: only a reconcile that gets through clears it), or
    None when it is routine (a conflict, throttling)."""
    if status in ROUTINE_API_STATUSES:
        return None
    text = f"the API server keeps failing a write ({status} {reason}): {message}"
    return Problem(Reason.API_ERROR, text if len(text) <= limit else text[: limit - 3] + "...")


@dataclass(frozen=True)
class Problem:
    """Why the operator cannot (fully) realise the spec: becomes the Degraded condition."""

    reason: Reason
    message: str


@dataclass(frozen=True)
class Rollout:
    """Where a Deployment's rollout stands, as `kubectl rollout status` would report it."""

    done: bool
    message: str
    desired: int = 0
    replicas: int = 0
    ready: int = 0
    updated: int = 0
    available: int = 0
    problem: Problem | None = None
    # A service of several workloads: each role's own state (its counts are their sums).
    roles: tuple[tuple[str, Rollout], ...] = ()

    @property
    def is_ready(self) -> bool:
        if self.roles:
            return all(state.is_ready for _, state in self.roles)
        return self.desired > 0 and self.ready >= self.desired

    @property
    def ready_message(self) -> str:
        if self.roles:  # which role is short, in the one message `kubectl get` shows
            return ", ".join(f"{role} {state.ready_message}" for role, state in self.roles)
        return "scaled to zero replicas" if self.desired == 0 else f"{self.ready}/{self.desired} replicas ready"

    def role_status(self) -> list[JsonObject] | None:
        """`status.roles`: each workload's counts, for a service of several (None: one, or none)."""
        if not self.roles:
            return None
        return [
            {
                "role": role,
                "replicas": state.replicas,
                "readyReplicas": state.ready,
                "updatedReplicas": state.updated,
                "ready": state.is_ready,
                "message": state.message,
            }
            for role, state in self.roles
        ]


NOT_CREATED = Rollout(done=False, message="Deployment not created yet")


def of_roles(states: Mapping[str, Rollout]) -> Rollout:
    """One state for the service from its workloads' by role: a single workload's as it is (a
    service of one workload reads as it always has); several summed, done and ready only when
    each is, the first problem and the messages of those not done named by role."""
    if not states:
        return NOT_CREATED
    if len(states) == 1:
        return next(iter(states.values()))
    roles = tuple(sorted(states.items()))
    pending = [f"{role}: {state.message}" for role, state in roles if not state.done]
    return Rollout(
        done=not pending,
        message="; ".join(pending) or "successfully rolled out",
        desired=sum(state.desired for _, state in roles),
        replicas=sum(state.replicas for _, state in roles),
        ready=sum(state.ready for _, state in roles),
        updated=sum(state.updated for _, state in roles),
        available=sum(state.available for _, state in roles),
        problem=next((state.problem for _, state in roles if state.problem is not None), None),
        roles=roles,
    )


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def find_condition(conditions: list[JsonObject] | None, type_: str) -> JsonObject | None:
    """The condition of `type_` in a conditions list (any object's), or None."""
    return next((c for c in conditions or [] if c.get("type") == type_), None)


def condition_status(status: JsonObject | None, type_: str) -> str | None:
    """ "True", "False", "Unknown" or None (absent) for one condition of a status."""
    condition = find_condition((status or {}).get("conditions"), type_)
    return condition.get("status") if condition else None


def set_condition(
    conditions: list[JsonObject],
    type_: str,
    status: bool,
    reason: Reason,
    message: str,
    now: str,
    generation: int | None = None,
) -> list[JsonObject]:
    """A copy of `conditions` with `type_` set; lastTransitionTime kept unless status flips."""
    value = "True" if status else "False"
    previous = find_condition(conditions, type_)
    changed = previous is None or previous.get("status") != value
    condition = {
        "type": type_,
        "status": value,
        "reason": str(reason),  # the word, not the member: YAML writers know only str
        "message": message,
        "lastTransitionTime": now if changed or previous is None else previous.get("lastTransitionTime", now),
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    others = [c for c in conditions if c.get("type") != type_]
    return sorted([*others, condition], key=lambda c: c["type"])


def _counts(workload: JsonObject, available_key: str) -> Rollout:
    """The replica counts of a workload's spec and status, not yet judged."""
    spec, status = workload.get("spec") or {}, workload.get("status") or {}
    return Rollout(
        False,
        "",
        desired=int(spec.get("replicas", 1)),
        replicas=int(status.get("replicas", 0)),
        ready=int(status.get("readyReplicas", 0)),
        updated=int(status.get("updatedReplicas", 0)),
        available=int(status.get(available_key, 0)),
    )


def _unobserved(workload: JsonObject) -> bool:
    """Whether its controller has not yet seen its latest spec (its status is older news)."""
    generation = (workload.get("metadata") or {}).get("generation")
    observed = (workload.get("status") or {}).get("observedGeneration")
    return generation is not None and (observed is None or observed < generation)


def deployment_rollout(deployment: JsonObject | None) -> Rollout:
    """The rollout state of a Deployment, with kubectl's rules (kubectl/pkg/polymorphichelpers).

    Done means: the controller has observed the latest spec, every desired replica runs the
    new template, no old replica is left, and every updated replica is available.
    """
    if deployment is None:
        return NOT_CREATED
    if deployment.get("kind") == LEADER_WORKER_SET.kind:
        return group_rollout(deployment)
    counts = _counts(deployment, "availableReplicas")
    if _unobserved(deployment):
        return replace(counts, message="waiting for the Deployment controller to observe the new spec")
    conditions = (deployment.get("status") or {}).get("conditions")
    failure = find_condition(conditions, "ReplicaFailure")
    if failure and failure.get("status") == "True":
        problem = Problem(Reason.REPLICA_FAILURE, failure.get("message") or "pods cannot be created")
        return replace(counts, message=problem.message, problem=problem)
    progress = find_condition(conditions, "Progressing")
    if progress and progress.get("reason") == Reason.PROGRESS_DEADLINE_EXCEEDED:
        problem = Problem(Reason.PROGRESS_DEADLINE_EXCEEDED, progress.get("message") or "rollout exceeded its deadline")
        return replace(counts, message=problem.message, problem=problem)
    desired, replicas, updated, available = counts.desired, counts.replicas, counts.updated, counts.available
    if updated < desired:
        return replace(counts, message=f"{updated} out of {desired} new replicas have been updated")
    if replicas > updated:
        return replace(counts, message=f"{replicas - updated} old replicas are pending termination")
    if available < updated:
        return replace(counts, message=f"{available} of {updated} updated replicas are available")
    return replace(counts, done=True, message="successfully rolled out")


def group_rollout(lws: JsonObject) -> Rollout:
    """The rollout state of a LeaderWorkerSet (a multi-node service), by groups: its status
    counts groups (`readyReplicas`: groups whose every pod is ready, so they are the available
    ones), and `UpdateInProgress` stays True until a template change has reached every group."""
    counts = _counts(lws, "readyReplicas")
    if _unobserved(lws):
        return replace(counts, message="waiting for the LeaderWorkerSet controller to observe the new spec")
    updating = find_condition((lws.get("status") or {}).get("conditions"), "UpdateInProgress")
    desired, replicas, ready, updated = counts.desired, counts.replicas, counts.ready, counts.updated
    if updated < desired or (updating and updating.get("status") == "True"):
        return replace(counts, message=f"{updated} out of {desired} new groups have been updated")
    if replicas > desired:
        return replace(counts, message=f"{replicas - desired} old groups are pending termination")
    if ready < desired:
        return replace(counts, message=f"{ready} of {desired} groups are ready")
    return replace(counts, done=True, message="successfully rolled out")


def _ready(
    state: Rollout, problem: Problem | None, pods: Problem | None, serves_at_zero: bool
) -> tuple[bool, Reason, str]:
    """The Ready condition's status, reason and message (`compute_status`)."""
    if state.is_ready:
        return True, Reason.MINIMUM_REPLICAS_AVAILABLE, state.ready_message
    if state is NOT_CREATED:
        return (
            (False, problem.reason, problem.message) if problem else (False, Reason.REPLICAS_NOT_READY, state.message)
        )
    if state.desired == 0 and serves_at_zero and not problem:
        return True, Reason.SCALED_TO_ZERO, "scaled to zero replicas: a request wakes it and waits for a replica"
    if state.desired == 0:
        return False, Reason.SCALED_TO_ZERO, state.ready_message
    if pods is not None:
        return False, pods.reason, f"{state.ready_message}: {pods.message}"
    return False, Reason.REPLICAS_NOT_READY, state.ready_message


def compute_status(
    previous: JsonObject | None,
    state: Rollout | Mapping[str, Rollout],
    generation: int | None,
    problem: Problem | None = None,
    now: str | None = None,
    pods: Problem | None = None,
    serves_at_zero: bool = False,
) -> JsonObject:
    """The status conditions and replica counts for the current state of the world.

    `state`: the workload's, or the workloads' by role (`of_roles`): Ready only when every role
    is, the message naming each role's count, and `status.roles` listing them.

    `serves_at_zero`: the service scales to zero (autoscaling.scaleToZero), so zero replicas is
    Ready (the activator answers and wakes it), not an outage.

    `problem` comes from the reconciler (invalid spec, apply refused, API missing); it wins
    over what the Deployment says, since a Deployment built from an older spec is not news
    about this one. `pods` is what is wrong with the service's pods (status_pods): more
    specific than the Deployment's own verdict, and seconds rather than minutes after the cause.
    """
    now = now or now_iso()
    state = state if isinstance(state, Rollout) else of_roles(state)
    conditions = list((previous or {}).get("conditions") or [])
    problem = problem or pods or state.problem

    conditions = set_condition(conditions, READY, *_ready(state, problem, pods, serves_at_zero), now, generation)

    if problem and problem.reason in BLOCKING_PROBLEMS:
        conditions = set_condition(conditions, PROGRESSING, False, Reason.BLOCKED, problem.message, now, generation)
    elif state.problem is not None:
        conditions = set_condition(conditions, PROGRESSING, False, state.problem.reason, state.message, now, generation)
    elif not state.done:
        conditions = set_condition(
            conditions, PROGRESSING, True, Reason.ROLLOUT_IN_PROGRESS, state.message, now, generation
        )
    else:
        conditions = set_condition(
            conditions, PROGRESSING, False, Reason.ROLLOUT_COMPLETE, state.message, now, generation
        )

    if problem:
        conditions = set_condition(conditions, DEGRADED, True, problem.reason, problem.message, now, generation)
    else:
        conditions = set_condition(conditions, DEGRADED, False, Reason.AS_EXPECTED, "", now, generation)

    return {
        "conditions": conditions,
        "replicas": state.replicas,
        "readyReplicas": state.ready,
        "updatedReplicas": state.updated,
        "roles": state.role_status(),  # None, so absent, for a service of one workload
    }


def spec_problem(status: JsonObject | None, kept: tuple[str, ...] = SPEC_PROBLEMS) -> Problem | None:
    """The problem recorded in a status that rollout news must not clear (reasons in `kept`)."""
    condition = find_condition((status or {}).get("conditions"), DEGRADED)
    if condition and condition.get("status") == "True" and condition.get("reason") in kept:
        return Problem(Reason(condition["reason"]), condition.get("message", ""))
    return None


def status_changes(current: JsonObject | None, desired: JsonObject) -> JsonObject:
    """The top-level status keys whose value differs: what a merge patch has to send."""
    current = current or {}
    return {key: value for key, value in desired.items() if current.get(key) != value}


def with_api_error(
    previous: JsonObject | None, problem: Problem, generation: int | None, now: str | None = None
) -> JsonObject:
    """`previous` status with Degraded set to `problem`; everything else as it was, except that
    an object never reconciled before also gets Ready=False for the same reason."""
    now = now or now_iso()
    status = dict(previous or {})
    conditions = list(status.get("conditions") or [])
    if find_condition(conditions, READY) is None:
        conditions = set_condition(conditions, READY, False, problem.reason, problem.message, now, generation)
    conditions = set_condition(conditions, DEGRADED, True, problem.reason, problem.message, now, generation)
    return status | {"conditions": conditions}
