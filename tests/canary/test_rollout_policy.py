"""The canary step machine and the arms of a rollout, as pure functions on plain values."""

from __future__ import annotations

from dataclasses import replace

import pytest

from inference_operator.models import CanarySpec
from inference_operator.rollout import (
    Check,
    Phase,
    RolloutState,
    advance,
    arms,
    canary_replicas,
    judge,
    traffic_share,
)

CANARY = CanarySpec.model_validate(
    {
        "steps": [10, 50],
        "stepSeconds": 30,
        "analysis": {"maxLatencyMs": 50, "maxErrorRatio": 0.05, "minRequests": 20, "failureLimit": 2},
    }
)
T0 = 1_000_000.0
GOOD = Check(latency_ms=20, error_ratio=0.0, requests=100, age_seconds=1)
SLOW = Check(latency_ms=80, error_ratio=0.0, requests=100, age_seconds=1)
FAILING = Check(latency_ms=20, error_ratio=0.2, requests=100, age_seconds=1)


def progressing(step: int = 0, failures: int = 0, started: float = T0) -> RolloutState:
    return RolloutState(Phase.PROGRESSING, "new", "old", step, CANARY.steps[step], started, failures)


# --- which Deployments a revision gets ---------------------------------------------------------


def test_rolling_and_first_rollouts_follow_the_spec() -> None:
    assert arms(None, "new", "old", None, T0).stable_follows_spec  # strategy rolling
    first = arms(CANARY, "new", None, None, T0)  # no stable Deployment yet: nothing to compare
    assert first.stable_follows_spec and first.canary_weight is None and first.state.phase == Phase.STABLE
    same = arms(CANARY, "rev", "rev", None, T0)
    assert same.stable_follows_spec and same.state.stage == "stable"


def test_a_new_revision_starts_a_canary_at_the_first_step_and_freezes_the_stable_arm() -> None:
    started = arms(CANARY, "new", "old", None, T0)
    assert not started.stable_follows_spec and started.canary_weight == 10
    assert (started.state.phase, started.state.step, started.state.step_started) == (Phase.PROGRESSING, 0, T0)
    assert started.state.stage == "canary 10%" and started.state.stable_revision == "old"
    # The recorded state carries on; another change starts over at the first step.
    going = arms(CANARY, "new", "old", progressing(step=1), T0 + 99)
    assert going.canary_weight == 50 and going.state.step == 1
    newer = arms(CANARY, "newer", "old", progressing(step=1), T0 + 99)
    assert newer.canary_weight == 10 and newer.state.revision == "newer"


def test_promoted_rolls_the_stable_arm_and_rolled_back_keeps_it() -> None:
    promoted = replace(progressing(), phase=Phase.PROMOTED)
    assert arms(CANARY, "new", "old", promoted, T0) == arms(CANARY, "new", "old", promoted, T0)
    rolling = arms(CANARY, "new", "old", promoted, T0)
    assert rolling.stable_follows_spec and rolling.canary_weight is None and rolling.state.stage == "promoted"
    done = arms(CANARY, "new", "new", promoted, T0)  # the stable Deployment runs it: still "promoted"
    assert done.stable_follows_spec and done.state.phase == Phase.PROMOTED
    back = arms(CANARY, "new", "old", replace(progressing(), phase=Phase.ROLLED_BACK), T0)
    assert not back.stable_follows_spec and back.canary_weight is None and back.state.stage == "rolled back"


@pytest.mark.parametrize(
    ("stable", "weight", "canary", "share"),
    [(1, 10, 1, 50.0), (9, 10, 1, 10.0), (4, 50, 4, 50.0), (10, 25, 3, 23.1), (0, 10, 1, 100.0)],
)
def test_the_canary_takes_its_share_by_replicas_and_never_shrinks_the_stable_arm(
    stable: int, weight: int, canary: int, share: float
) -> None:
    assert canary_replicas(stable, weight) == canary
    assert traffic_share(stable, canary) == pytest.approx(share, abs=0.1)


# --- one check --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("check", "verdict", "why"),
    [
        (None, "inconclusive", "no data"),
        (Check(None, None, None, 1), "inconclusive", "no data"),
        (replace(GOOD, age_seconds=31), "inconclusive", "31s old"),  # older than two intervals (15 s)
        (replace(GOOD, requests=19), "inconclusive", "fewer than 20"),
        (replace(SLOW, requests=19), "inconclusive", "fewer than 20"),  # too few to condemn either
        (SLOW, "fail", "latency 80.0 ms over 50 ms"),
        (FAILING, "fail", "error ratio 0.200 over 0.05"),
        (GOOD, "pass", "latency 20.0 ms"),
        (replace(GOOD, error_ratio=None), "pass", "latency 20.0 ms"),  # vLLM exports no error count
        # Requests but no latency (its query failed or came back NaN): never promoted unjudged.
        (replace(GOOD, latency_ms=None), "inconclusive", "no latency for the canary's pods over 100 requests"),
        (replace(SLOW, latency_ms=float("nan")), "inconclusive", "no latency"),
    ],
)
def test_a_check_is_judged_only_on_fresh_data_with_enough_requests(check: Check | None, verdict: str, why: str) -> None:
    found, message = judge(check, CANARY)
    assert found == verdict and why in message, message


# --- the step machine -------------------------------------------------------------------------


def test_a_passing_canary_steps_after_its_pause_and_is_promoted_after_the_last_step() -> None:
    held = advance(progressing(), CANARY, GOOD, T0 + 10, None)  # passes, but the step has not lasted
    assert held.state.step == 0 and held.event is None and held.verdict == "pass"
    stepped = advance(progressing(), CANARY, GOOD, T0 + 30, None)
    assert (stepped.state.step, stepped.state.weight, stepped.state.step_started) == (1, 50, T0 + 30)
    assert stepped.event is not None and stepped.event[0] == "CanaryStep" and "50%" in stepped.event[1]
    promoted = advance(stepped.state, CANARY, GOOD, T0 + 60, None)
    assert promoted.state.phase == Phase.PROMOTED and promoted.state.stage == "promoted"
    assert promoted.event is not None and promoted.event[0] == "CanaryPromoted"


def test_no_data_never_promotes() -> None:
    state = progressing()
    for t in range(10):
        state = advance(state, CANARY, replace(GOOD, age_seconds=60), T0 + 100 * t, None).state
    assert (state.phase, state.step) == (Phase.PROGRESSING, 0)


def test_failed_checks_roll_back_at_the_limit_with_the_numbers_and_the_step() -> None:
    once = advance(progressing(step=1), CANARY, SLOW, T0, None)
    assert once.state.phase == Phase.PROGRESSING and once.state.failures == 1 and once.event is None
    twice = advance(once.state, CANARY, FAILING, T0 + 15, None)
    assert twice.state.phase == Phase.ROLLED_BACK and twice.state.weight == 0
    assert twice.event is not None and twice.event[0] == "CanaryRolledBack"
    message = twice.event[1]
    assert "step 2 (50%)" in message and "error ratio 0.200" in message and "2 failed checks" in message


def test_a_flapping_canary_is_rolled_back_since_failures_are_counted_per_rollout() -> None:
    state = progressing()
    for check in (SLOW, GOOD, SLOW):  # fail, pass (before the pause ends), fail
        state = advance(state, CANARY, check, T0 + 5, None).state
    assert state.phase == Phase.ROLLED_BACK


def test_promote_and_abort_by_hand() -> None:
    assert advance(progressing(), CANARY, None, T0, "promote").state.phase == Phase.PROMOTED
    aborted = advance(progressing(), CANARY, GOOD, T0, "abort")
    assert aborted.state.phase == Phase.ROLLED_BACK and "aborted by hand" in aborted.state.message
    settled = RolloutState(Phase.STABLE, "r", "r")
    assert advance(settled, CANARY, SLOW, T0, "abort").state == settled  # nothing in progress


def test_the_state_round_trips_through_status() -> None:
    state = progressing(step=1, failures=1)
    assert RolloutState.from_status({"rollout": state.to_status()}) == state
    assert RolloutState.from_status({"rollout": {"phase": "Bogus"}}) is None
    assert RolloutState.from_status(None) is None
