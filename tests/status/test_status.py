"""Status conditions from Deployment states: pure, so every branch is checked here."""

from __future__ import annotations

import pytest

from inference_operator import status as st
from inference_operator.status import NOT_CREATED, Problem, deployment_rollout, set_condition, status_changes

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def compute_status(previous, deployment, generation, problem=None, now=None):
    return st.compute_status(previous, deployment_rollout(deployment), generation, problem, now=now)


def deployment(desired=2, ready=0, updated=0, replicas=None, generation=1, observed=1, conditions=(), available=None):
    return {
        "metadata": {"generation": generation},
        "spec": {"replicas": desired},
        "status": {
            "observedGeneration": observed,
            "replicas": desired if replicas is None else replicas,
            "readyReplicas": ready,
            "updatedReplicas": updated,
            "availableReplicas": ready if available is None else available,
            "conditions": list(conditions),
        },
    }


def by_type(status: dict) -> dict[str, dict]:
    return {c["type"]: c for c in status["conditions"]}


def test_rollout_in_progress_then_ready() -> None:
    starting = compute_status(None, deployment(ready=0, updated=2), 1, now=T0)
    c = by_type(starting)
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", "ReplicasNotReady")
    assert c["Ready"]["message"] == "0/2 replicas ready"
    # Updated but not available: kubectl rollout status still waits, and so does Progressing.
    assert (c["Progressing"]["status"], c["Progressing"]["reason"]) == ("True", "RolloutInProgress")
    assert c["Progressing"]["message"] == "0 of 2 updated replicas are available"

    ready = compute_status(starting, deployment(ready=2, updated=2), 1, now=T1)
    c = by_type(ready)
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("True", "MinimumReplicasAvailable")
    assert c["Ready"]["lastTransitionTime"] == T1
    assert c["Degraded"]["lastTransitionTime"] == T0  # unchanged status keeps its time
    assert (ready["replicas"], ready["readyReplicas"]) == (2, 2)
    assert (c["Progressing"]["status"], c["Progressing"]["reason"]) == ("False", "RolloutComplete")


def test_pending_pods_are_progressing_as_kubectl_says() -> None:
    # The real Deployment controller with unschedulable pods: 1 replica created and updated,
    # none available; its own condition says Progressing=True ReplicaSetUpdated.
    pending = deployment(
        desired=1,
        updated=1,
        replicas=1,
        ready=0,
        conditions=[{"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"}],
    )
    c = by_type(compute_status(None, pending, 1, now=T0))
    assert (c["Progressing"]["status"], c["Progressing"]["message"]) == (
        "True",
        "0 of 1 updated replicas are available",
    )
    assert (c["Ready"]["status"], c["Degraded"]["status"]) == ("False", "False")


def test_rollout_follows_kubectl_order() -> None:
    assert (
        deployment_rollout(deployment(updated=1, replicas=2, ready=2)).message
        == "1 out of 2 new replicas have been updated"
    )
    assert (
        deployment_rollout(deployment(updated=2, replicas=3, ready=2)).message
        == "1 old replicas are pending termination"
    )
    assert (
        deployment_rollout(deployment(updated=2, ready=2, available=1)).message
        == "1 of 2 updated replicas are available"
    )
    assert deployment_rollout(deployment(updated=2, ready=2)).done
    assert not deployment_rollout(deployment(updated=2, ready=2, generation=2, observed=1)).done
    assert deployment_rollout(None) is NOT_CREATED


def test_stale_deployment_generation_is_progressing() -> None:
    c = by_type(compute_status(None, deployment(ready=2, updated=2, generation=3, observed=2), 1, now=T0))
    assert (c["Progressing"]["status"], c["Progressing"]["reason"]) == ("True", "RolloutInProgress")
    assert c["Ready"]["status"] == "True"  # old pods still serve during a surge rollout


def test_old_pods_left_means_progressing() -> None:
    c = by_type(compute_status(None, deployment(ready=2, updated=1, replicas=3), 1, now=T0))
    assert c["Progressing"]["status"] == "True"
    assert c["Progressing"]["message"] == "1 out of 2 new replicas have been updated"


def test_scaled_to_zero_is_not_ready_but_not_degraded() -> None:
    c = by_type(compute_status(None, deployment(desired=0, replicas=0), 1, now=T0))
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", "ScaledToZero")
    assert c["Degraded"]["status"] == "False"


@pytest.mark.parametrize(
    ("failing", "reason"),
    [
        (
            {
                "type": "Progressing",
                "status": "False",
                "reason": "ProgressDeadlineExceeded",
                "message": "ReplicaSet has timed out progressing.",
            },
            "ProgressDeadlineExceeded",
        ),
        (
            {
                "type": "ReplicaFailure",
                "status": "True",
                "reason": "FailedCreate",
                "message": "exceeded quota: amd.com/gpu",
            },
            "ReplicaFailure",
        ),
    ],
    ids=["deadline", "replica-failure"],
)
def test_deployment_failures_are_degraded(failing: dict, reason: str) -> None:
    c = by_type(compute_status(None, deployment(ready=0, conditions=[failing]), 1, now=T0))
    assert (c["Degraded"]["status"], c["Degraded"]["reason"], c["Degraded"]["message"]) == (
        "True",
        reason,
        failing["message"],
    )


def test_spec_problem_wins_and_blocks_progress() -> None:
    c = by_type(compute_status(None, None, 4, Problem("InvalidSpec", "spec.model.uri: bad"), now=T0))
    assert (c["Degraded"]["status"], c["Degraded"]["reason"]) == ("True", "InvalidSpec")
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", "InvalidSpec")
    assert (c["Progressing"]["status"], c["Progressing"]["reason"]) == ("False", "Blocked")
    assert all(cond["observedGeneration"] == 4 for cond in c.values())


def test_set_condition_moves_time_only_on_flip() -> None:
    conditions = set_condition([], "Ready", False, "A", "a", T0)
    same = set_condition(conditions, "Ready", False, "B", "b", T1)
    assert same[0]["lastTransitionTime"] == T0 and same[0]["reason"] == "B"
    flipped = set_condition(same, "Ready", True, "C", "c", T1)
    assert flipped[0]["lastTransitionTime"] == T1


def test_unchanged_status_needs_no_write() -> None:
    first = compute_status(None, deployment(ready=2, updated=2), 1, now=T0)
    again = compute_status(first, deployment(ready=2, updated=2), 1, now=T1)
    assert status_changes(first, again) == {}
    assert set(status_changes(first, compute_status(first, deployment(ready=1, updated=2), 1, now=T1))) == {
        "conditions",
        "readyReplicas",
    }


def test_routine_api_errors_are_not_reported_and_others_name_the_server_message() -> None:
    assert st.api_error_problem(409, "Conflict", "the object has been modified") is None
    assert st.api_error_problem(429, "Too Many Requests", "throttled") is None
    problem = st.api_error_problem(500, "Internal Server Error", "failed to allocate a serviceIP: range is full")
    assert problem is not None and problem.reason == "ApiError"
    assert "500 Internal Server Error" in problem.message and "range is full" in problem.message
    huge = st.api_error_problem(403, "Forbidden", "x" * 10_000)
    assert huge is not None and len(huge.message) == 1024 and huge.message.endswith("...")


def test_api_error_sets_degraded_and_keeps_the_rest_of_the_status() -> None:
    problem = Problem("ApiError", "the API server keeps failing a write (500 ...)")
    reconciled = compute_status(None, deployment(desired=1, ready=1, updated=1), 3, now=T0)
    reconciled |= {"url": "http://m.ns.svc.cluster.local", "observedGeneration": 3}
    after = st.with_api_error(reconciled, problem, 4, now=T1)
    assert after["url"] == reconciled["url"] and after["observedGeneration"] == 3  # not reconciled yet
    assert st.find_condition(after["conditions"], "Ready") == st.find_condition(reconciled["conditions"], "Ready")
    degraded = st.find_condition(after["conditions"], "Degraded")
    assert degraded == {
        "type": "Degraded",
        "status": "True",
        "reason": "ApiError",
        "message": problem.message,
        "lastTransitionTime": T1,
        "observedGeneration": 4,
    }
    # Never reconciled: Ready=False says why, too.
    fresh = st.with_api_error(None, problem, 1, now=T0)
    assert [(c["type"], c["status"], c["reason"]) for c in fresh["conditions"]] == [
        ("Degraded", "True", "ApiError"),
        ("Ready", "False", "ApiError"),
    ]
