"""Status conditions from Deployment states: pure, so every branch is checked here."""

from __future__ import annotations

from inference_operator.status import Problem, compute_status, set_condition, status_changes

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def deployment(desired=2, ready=0, updated=0, replicas=None, generation=1, observed=1, conditions=()):
    return {
        "metadata": {"generation": generation},
        "spec": {"replicas": desired},
        "status": {
            "observedGeneration": observed,
            "replicas": desired if replicas is None else replicas,
            "readyReplicas": ready,
            "updatedReplicas": updated,
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
    assert c["Progressing"]["status"] == "False"

    ready = compute_status(starting, deployment(ready=2, updated=2), 1, now=T1)
    c = by_type(ready)
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("True", "MinimumReplicasAvailable")
    assert c["Ready"]["lastTransitionTime"] == T1
    assert c["Degraded"]["lastTransitionTime"] == T0  # unchanged status keeps its time
    assert (ready["replicas"], ready["readyReplicas"]) == (2, 2)


def test_stale_deployment_generation_is_progressing() -> None:
    c = by_type(compute_status(None, deployment(ready=2, updated=2, generation=3, observed=2), 1, now=T0))
    assert (c["Progressing"]["status"], c["Progressing"]["reason"]) == ("True", "RolloutInProgress")
    assert c["Ready"]["status"] == "True"  # old pods still serve during a surge rollout


def test_old_pods_left_means_progressing() -> None:
    c = by_type(compute_status(None, deployment(ready=2, updated=1, replicas=3), 1, now=T0))
    assert c["Progressing"]["status"] == "True"
    assert "1/2 updated" in c["Progressing"]["message"]


def test_scaled_to_zero_is_not_ready_but_not_degraded() -> None:
    c = by_type(compute_status(None, deployment(desired=0, replicas=0), 1, now=T0))
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", "ScaledToZero")
    assert c["Degraded"]["status"] == "False"


def test_deployment_failures_are_degraded() -> None:
    stuck = deployment(
        ready=0,
        conditions=[
            {
                "type": "Progressing",
                "status": "False",
                "reason": "ProgressDeadlineExceeded",
                "message": "ReplicaSet has timed out progressing.",
            }
        ],
    )
    c = by_type(compute_status(None, stuck, 1, now=T0))
    assert (c["Degraded"]["status"], c["Degraded"]["reason"]) == ("True", "ProgressDeadlineExceeded")

    quota = deployment(
        conditions=[
            {
                "type": "ReplicaFailure",
                "status": "True",
                "reason": "FailedCreate",
                "message": "exceeded quota: amd.com/gpu",
            }
        ]
    )
    c = by_type(compute_status(None, quota, 1, now=T0))
    assert (c["Degraded"]["reason"], c["Degraded"]["message"]) == ("ReplicaFailure", "exceeded quota: amd.com/gpu")


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
