"""`decide` on synthetic series: the HPA algorithm, bounds, rate limits, stabilization, gaps."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_operator.autoscaler.policy import (
    Decision,
    History,
    Observation,
    Policy,
    Rule,
    decide,
    scale_down_limit,
    scale_up_limit,
)
from inference_operator.models import AutoscalingSpec

TARGET = 100.0
POLICY = Policy(
    target=TARGET, min_replicas=1, max_replicas=20, metric="latencyP95Ms", scale_down_stabilization_seconds=300
)


@dataclass
class Run:
    """What a replay of a series produced: the count after each tick and every write."""

    replicas: list[int]
    writes: list[tuple[float, int, int]]
    decisions: list[Decision]

    @property
    def flaps(self) -> int:
        """Direction reversals between consecutive writes (up then down, or down then up)."""
        signs = [1 if after > before else -1 for _, before, after in self.writes]
        return sum(1 for a, b in itertools.pairwise(signs) if a != b)


def replay(
    series: Callable[[float, int], float | None],
    policy: Policy = POLICY,
    start: int = 2,
    ticks: int = 100,
    interval: float = 15,
    history: History | None = None,
) -> Run:
    """Run the loop the daemon runs, with `series(t, replicas)` as the metric source."""
    history = history if history is not None else History()
    replicas = start
    run = Run([], [], [])
    for i in range(ticks):
        now = i * interval
        decision = decide(Observation(now, series(now, replicas)), replicas, policy, history)
        history = history.remember(now, decision.recommendation, policy.horizon_seconds)
        if decision.replicas != replicas:
            history = history.scaled(now, replicas, decision.replicas, policy.horizon_seconds)
            run.writes.append((now, replicas, decision.replicas))
            replicas = decision.replicas
        run.replicas.append(replicas)
        run.decisions.append(decision)
    return run


def load_model(load: Callable[[float], float]) -> Callable[[float, int], float]:
    """A metric that falls as replicas are added: value = load / replicas (like queue depth)."""
    return lambda t, replicas: load(t) / replicas


def obs(value: float | None, at: float = 1000.0, **kw) -> Observation:
    return Observation(at, value, **kw)


# A history that has seen the whole stabilization window (as after a long steady run).
SETTLED = History(since=0.0)


# --- the proportional rule and its tolerance ------------------------------------------------


@pytest.mark.parametrize(
    ("value", "current", "expected"),
    [
        (200, 2, 4),  # twice the target: twice the replicas
        (150, 4, 6),  # ceil(4 * 1.5)
        (101, 4, 4),  # inside the 10% band
        (109, 10, 10),  # still inside
        (111, 10, 12),  # ceil(10 * 1.11) = 12 (11.1 rounds up)
        (91, 10, 10),  # inside the band downwards
        (50, 4, 2),  # half the target, history settled on 2-or-less
    ],
)
def test_autoscaler_proportional_rule_with_tolerance(value, current, expected) -> None:
    history = History(since=0.0, recommendations=((990.0, expected),))
    assert decide(obs(value), current, POLICY, history).replicas == expected


def test_autoscaler_exact_multiples_do_not_round_up_from_float_noise() -> None:
    # 3 * (0.7 / 0.1) is 21.000000000000004 in floating point; it must stay 21 replicas.
    policy = replace(POLICY, target=0.1, max_replicas=100, scale_up=Rule(pods=100, percent=1000, period_seconds=15))
    assert decide(obs(0.7), 3, policy, SETTLED).replicas == 21


# --- step, ramp, spike, noise --------------------------------------------------------------


def test_autoscaler_step_scales_up_on_the_first_tick_after_the_breach() -> None:
    # Load steps from 2 to 8 "targets" worth at t=300; value = load / replicas.
    run = replay(load_model(lambda t: 200.0 if t < 300 else 800.0), start=2, ticks=40)
    first_write = run.writes[0]
    assert first_write[0] == 300  # the very tick that saw the step
    assert first_write[2] > 2
    assert run.replicas[-1] == 8  # settles where value == target
    assert all(after > before for _, before, after in run.writes)


def test_autoscaler_ramp_only_ever_scales_up_while_load_grows() -> None:
    run = replay(load_model(lambda t: 100.0 + t), start=1, ticks=80)  # +1 target per 100 s
    assert run.writes, "a ramp from 1 to 13 targets' worth must scale"
    assert all(after > before for _, before, after in run.writes)
    assert run.flaps == 0
    assert run.replicas[-1] >= math.ceil((100 + 79 * 15) / TARGET / 1.1)


def test_autoscaler_spike_is_followed_and_held_for_the_stabilization_window() -> None:
    # A single 15 s spike to 4x; afterwards the load is back to what 2 replicas handle.
    run = replay(load_model(lambda t: 800.0 if t == 600 else 200.0), start=2, ticks=80)
    assert run.writes[0] == (600, 2, 6)  # 4 pods or 100% per period: 2 -> max(6, 4)
    up_at = 600
    down = [w for w in run.writes if w[2] < w[1]]
    assert down, "must scale down once the window has passed"
    assert down[0][0] >= up_at + POLICY.scale_down_stabilization_seconds
    assert down[0][0] <= up_at + POLICY.scale_down_stabilization_seconds + 15
    assert run.replicas[-1] == 2
    assert run.flaps == 1  # up once, down once


def test_autoscaler_noise_within_tolerance_never_scales() -> None:
    rng = random.Random(7)
    run = replay(lambda t, r: TARGET * (1 + rng.uniform(-0.09, 0.09)), start=5, ticks=200)
    assert run.writes == []


def test_autoscaler_large_noise_does_not_flap() -> None:
    # +-40% noise around a load 6 replicas carry: the count goes up to cover the peaks, and
    # comes down only when a whole stabilization window of samples agrees, so it never
    # oscillates with the noise.
    rng = random.Random(11)
    run = replay(load_model(lambda t: 600.0 * (1 + rng.uniform(-0.4, 0.4))), start=6, ticks=400)
    assert len(run.writes) <= 4
    assert run.flaps <= 1
    ups = [at for at, before, after in run.writes if after > before]
    for at, before, after in run.writes:
        if after < before:
            assert all(at - up >= POLICY.scale_down_stabilization_seconds for up in ups if up < at)


# --- missing and stale data ----------------------------------------------------------------


def test_autoscaler_missing_data_holds_even_for_an_hour() -> None:
    run = replay(lambda t, r: None, start=7, ticks=240)
    assert run.writes == []
    assert all("no data" in d.reason for d in run.decisions)


def test_autoscaler_after_an_outage_scale_down_waits_a_full_window_of_real_data() -> None:
    # High load, then Prometheus is gone for 30 min, then it comes back showing idle.
    def series(t: float, replicas: int) -> float | None:
        if t < 300:
            return 800.0 / replicas
        if t < 2100:
            return None
        return 0.0

    run = replay(series, start=8, ticks=200)
    down = [w for w in run.writes if w[2] < w[1]]
    last_tick_without_data = 2085
    assert down[0][0] >= last_tick_without_data + POLICY.scale_down_stabilization_seconds
    assert all(w[0] < 300 or w[0] >= 2100 for w in run.writes)


def test_autoscaler_stale_data_holds() -> None:
    decision = decide(obs(0.0, age_seconds=POLICY.stale_after_seconds + 1), 6, POLICY, SETTLED)
    assert decision.replicas == 6
    assert "stale" in decision.reason


def test_autoscaler_non_finite_values_hold() -> None:
    for value in (math.nan, math.inf):
        assert decide(obs(value), 6, POLICY, SETTLED).replicas == 6


def test_autoscaler_restart_blocks_scale_down_until_window_is_covered() -> None:
    fresh = History()
    decision = decide(obs(0.0), 6, POLICY, fresh)
    assert decision.replicas == 6
    assert "stabilization" in decision.reason
    # ...but a breach is acted on at once.
    assert decide(obs(300.0), 6, POLICY, fresh).replicas > 6


# --- bounds -------------------------------------------------------------------------------


def test_autoscaler_bounds_clamp_recommendation_and_current() -> None:
    policy = replace(POLICY, min_replicas=2, max_replicas=5)
    assert decide(obs(10_000.0), 4, policy, SETTLED).replicas == 5
    assert decide(obs(0.0), 3, policy, SETTLED).replicas == 2
    # A spec outside the bounds is brought inside, even without data.
    high = decide(obs(None), 9, policy, SETTLED)
    assert high.replicas == 5 and "brought into [2, 5]" in high.reason
    assert decide(obs(None), 0, policy, SETTLED).replicas == 2


def test_autoscaler_at_max_says_so() -> None:
    policy = replace(POLICY, max_replicas=4)
    decision = decide(obs(500.0), 4, policy, SETTLED)
    assert decision.replicas == 4
    assert "maxReplicas" in decision.reason


# --- rate limits and the fast path ---------------------------------------------------------


def test_autoscaler_scale_up_rate_limit_per_period() -> None:
    policy = replace(POLICY, scale_up=Rule(pods=2, percent=50, period_seconds=60), fast_factor=None)
    # From 4 at 1.9x target: wants 8; max(4 + 2, ceil(4 * 1.5)) = 6.
    first = decide(obs(190.0, at=0), 4, policy, SETTLED)
    assert first.replicas == 6 and "limited by scaleUp" in first.reason
    history = SETTLED.scaled(0, 4, 6, policy.horizon_seconds)
    # 15 s later, same period: the period started at 4, so 6 is all that is allowed.
    assert decide(obs(190.0, at=15), 6, policy, history).replicas == 6
    # A period later the limit counts from 6 again.
    assert decide(obs(190.0, at=61), 6, policy, history).replicas == 9


def test_autoscaler_fast_path_counts_the_limit_per_decision() -> None:
    policy = replace(POLICY, scale_up=Rule(pods=2, percent=50, period_seconds=60))
    history = SETTLED.scaled(0, 4, 6, policy.horizon_seconds)
    slow = decide(obs(190.0, at=15), 6, policy, history)  # 1.9x: not severe
    fast = decide(obs(300.0, at=15), 6, policy, history)  # 3x: severe
    assert slow.replicas == 6 and not slow.fast
    assert fast.replicas == 9 and fast.fast and "fast path" in fast.reason


def test_autoscaler_scale_down_rate_limit() -> None:
    policy = replace(POLICY, scale_down=Rule(pods=1, percent=25, period_seconds=60), scale_down_stabilization_seconds=0)
    # From 8 to idle: min(8 - 1, floor(8 * 0.75)) = 6, the larger step.
    assert decide(obs(0.0, at=0), 8, policy, SETTLED).replicas == 6
    history = SETTLED.scaled(0, 8, 6, policy.horizon_seconds)
    assert decide(obs(0.0, at=30), 6, policy, history).replicas == 6  # same period
    assert decide(obs(0.0, at=61), 6, policy, history).replicas == 4


def test_autoscaler_limits_match_hpa_formulas() -> None:
    rule = Rule(pods=4, percent=100, period_seconds=15)
    assert scale_up_limit(3, History(), rule, 0, fast=False) == 7  # max(3 + 4, 6)
    assert scale_up_limit(10, History(), rule, 0, fast=False) == 20  # max(14, 20)
    assert scale_down_limit(10, History(), Rule(4, 50, 15), 0) == 5  # min(6, 5)


# --- replicas that are still starting --------------------------------------------------------


def test_autoscaler_waits_for_starting_replicas_before_adding_more() -> None:
    # 2 of 4 ready at 1.5x: the 2 starting ones are expected to absorb it.
    waiting = decide(obs(150.0, ready_replicas=2), 4, POLICY, SETTLED)
    assert waiting.replicas == 4 and "starting" in waiting.reason
    # At 3x the ready ones alone ask for 6.
    assert decide(obs(300.0, ready_replicas=2), 4, POLICY, SETTLED).replicas == 6


def test_autoscaler_starting_replicas_count_as_on_target_when_scaling_down() -> None:
    # 2 ready at half the target, 2 starting: ceil(2 * 0.5 + 2) = 3, not ceil(4 * 0.5) = 2.
    assert decide(obs(50.0, ready_replicas=2), 4, POLICY, SETTLED).recommendation == 3


def test_autoscaler_plain_hpa_mode_ignores_readiness() -> None:
    policy = replace(POLICY, count_ready=False)
    assert decide(obs(150.0, ready_replicas=2), 4, policy, SETTLED).replicas == 6


# --- the spec is the source of the policy ---------------------------------------------------


def test_autoscaler_policy_from_spec_uses_spec_defaults() -> None:
    spec = AutoscalingSpec.model_validate({"maxReplicas": 8, "target": 50, "intervalSeconds": 30})
    policy = Policy.from_spec(spec)
    assert (policy.min_replicas, policy.max_replicas, policy.target) == (1, 8, 50)
    assert policy.tolerance == 0.1 and policy.scale_down_stabilization_seconds == 300
    assert policy.scale_up == Rule(4, 100, 15) and policy.scale_down == Rule(4, 100, 15)
    assert policy.stale_after_seconds == 90
    assert policy.metric == "latencyP95Ms"
    assert policy.scale_down_exponent == 0.5  # latency is convex in load


@pytest.mark.parametrize("metric", ["queueDepth", "rps", "gpuUtilization"])
def test_autoscaler_linear_metrics_scale_down_proportionally(metric: str) -> None:
    spec = AutoscalingSpec.model_validate({"maxReplicas": 8, "target": 50, "metric": metric})
    policy = Policy.from_spec(spec)
    assert policy.scale_down_exponent == 1.0
    assert decide(obs(12.5), 8, policy, SETTLED).replicas == 2  # a quarter of the target


def test_autoscaler_latency_scale_down_is_damped() -> None:
    # At a quarter of the target latency the proportional rule would drop 8 replicas to 2;
    # latency does not fall linearly with load, so the damped rule goes to ceil(8 * 0.5).
    policy = Policy.from_spec(AutoscalingSpec.model_validate({"maxReplicas": 8, "target": 100}))
    assert decide(obs(25.0), 8, policy, SETTLED).replicas == 4
    # Idle is still idle: zero latency (no requests) goes to minReplicas.
    assert decide(obs(0.0), 8, policy, SETTLED).replicas == 1
    # Scale-up is unchanged: proportional.
    assert decide(obs(200.0), 4, policy, SETTLED).replicas == 8


# --- properties over arbitrary inputs -------------------------------------------------------

values = st.one_of(st.none(), st.just(math.nan), st.just(math.inf), st.floats(min_value=0, max_value=1e6))


@st.composite
def histories(draw) -> History:
    since = draw(st.one_of(st.none(), st.floats(min_value=0, max_value=1000)))
    recs = draw(st.lists(st.tuples(st.floats(min_value=0, max_value=1000), st.integers(1, 50)), max_size=20))
    events = draw(
        st.lists(
            st.tuples(st.floats(min_value=900, max_value=1000), st.integers(1, 50), st.integers(1, 50)), max_size=5
        )
    )
    history = History(since=since, recommendations=tuple(sorted(recs)))
    for at, before, after in events:
        if before != after:
            history = history.scaled(at, before, after, 3600)
    return history


@settings(max_examples=300, deadline=None)
@given(
    value=values,
    current=st.integers(0, 60),
    history=histories(),
    lo=st.integers(1, 10),
    span=st.integers(0, 30),
    ready=st.one_of(st.none(), st.integers(0, 60)),
)
def test_autoscaler_decide_properties(value, current, history, lo, span, ready) -> None:
    policy = replace(POLICY, min_replicas=lo, max_replicas=lo + span)
    decision = decide(Observation(1000.0, value, ready_replicas=ready), current, policy, history)
    bounded = policy.bounded(current)
    # Always inside the bounds.
    assert policy.min_replicas <= decision.replicas <= policy.max_replicas
    # No usable data: never moves, except into the bounds.
    if value is None or not math.isfinite(value) or abs(value / TARGET - 1) <= policy.tolerance:
        assert decision.replicas == bounded
    # Never moves against the metric.
    elif value > TARGET:
        assert decision.replicas >= bounded
    else:
        assert decision.replicas <= bounded
    # A scale-down never goes below what the window's recommendations allow.
    if decision.replicas < bounded:
        window = [r for t, r in history.recommendations if t > 1000 - 300]
        assert decision.replicas >= max([decision.recommendation, *window])
        assert history.covers(1000.0, 300)
