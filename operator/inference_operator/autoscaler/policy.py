"""The scaling decision: a pure function of one observation, the replica count and the past.

It follows the Kubernetes HPA algorithm (`desired = ceil(current * value / target)` outside a
tolerance band; `behavior` rate limits per period; a scale-down stabilization window that
takes the highest recommendation in the window) with four differences that matter for
latency-driven GPU services:

- a fast path: above `fast_factor * target` the scale-up limit is counted per decision, not
  per period, so a severe breach is not made to wait out the rate-limit period;
- replicas that are still starting (model loading takes minutes on GPUs) are not counted as
  capacity when scaling up, and are assumed to be on target when scaling down, so the loop
  does not pile on replicas while earlier ones load, nor remove them for being idle;
- latency is convex in load (the service time is a floor, queueing grows like 1/(1-rho)), so
  at half the target latency the service cannot lose half its replicas; scaling down on a
  latency metric uses the square root of the ratio (halfway, in log terms), which removes
  the overshoot-then-rebound sawtooth that the proportional rule produces on latency;
- missing or stale data holds the current count, and a history that does not yet cover the
  stabilization window (an operator restart, a Prometheus outage) blocks scale-down, so a
  gap in the data can never walk a service down to `minReplicas`.

Time is whatever clock the caller uses (seconds); `decide` never reads a clock itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..models import AutoscalingSpec, Metric

LATENCY_METRICS = (
    Metric.LATENCY_P95_MS,
    Metric.LATENCY_P99_MS,
    Metric.TTFT_P95_MS,
    Metric.ITL_P95_MS,
    Metric.E2E_LATENCY_P95_MS,
)
# Guards ceil() against 2.0000000001-style float noise turning into an extra replica.
_EPSILON = 1e-9


@dataclass(frozen=True)
class Rule:
    """At most `pods` or `percent` of the replicas at the period's start per period (larger wins)."""

    pods: int = 4
    percent: int = 100
    period_seconds: float = 15


@dataclass(frozen=True)
class Policy:
    """What `decide` needs from `spec.autoscaling`, plus the knobs the spec does not expose."""

    target: float
    min_replicas: int
    max_replicas: int
    metric: str = "value"
    tolerance: float = 0.1
    scale_down_stabilization_seconds: float = 300
    scale_up: Rule = Rule()
    scale_down: Rule = Rule()
    # None turns the fast path off (plain HPA behaviour).
    fast_factor: float | None = 2.0
    stale_after_seconds: float = 60
    # False uses the spec count as capacity even while replicas start (plain HPA, external metric).
    count_ready: bool = True
    # Scale-down uses ratio ** exponent: 1 is HPA's proportional rule, 0.5 suits latency.
    scale_down_exponent: float = 1.0

    @classmethod
    def from_spec(cls, spec: AutoscalingSpec) -> Policy:
        return cls(
            target=spec.target,
            # Zero is the idle rule's alone (idle_decision): latency never asks for less than one.
            min_replicas=max(spec.min_replicas, 1),
            max_replicas=spec.max_replicas,
            metric=spec.metric.value,
            tolerance=spec.tolerance,
            scale_down_stabilization_seconds=spec.scale_down_stabilization_seconds,
            scale_up=Rule(spec.scale_up.pods, spec.scale_up.percent, spec.scale_up.period_seconds),
            scale_down=Rule(spec.scale_down.pods, spec.scale_down.percent, spec.scale_down.period_seconds),
            # A sample older than three decisions (or a minute) no longer describes the service.
            stale_after_seconds=max(60.0, 3.0 * spec.interval_seconds),
            scale_down_exponent=0.5 if spec.metric in LATENCY_METRICS else 1.0,
        )

    def bounded(self, replicas: int) -> int:
        return min(max(replicas, self.min_replicas), self.max_replicas)

    @property
    def horizon_seconds(self) -> float:
        """How much history `decide` can look at; older entries can be dropped."""
        return max(self.scale_down_stabilization_seconds, self.scale_up.period_seconds, self.scale_down.period_seconds)


@dataclass(frozen=True)
class Observation:
    """The metric as seen at `at`; `value` None means Prometheus gave no usable answer."""

    at: float
    value: float | None
    age_seconds: float = 0.0
    ready_replicas: int | None = None
    note: str = ""


@dataclass(frozen=True)
class ScaleEvent:
    at: float
    before: int
    after: int


@dataclass(frozen=True)
class History:
    """Past recommendations and scale writes; immutable, so each decision sees a snapshot.

    `since` is when the first recommendation was remembered: a window that reaches further
    back than that is not covered, and decide() treats the uncovered part as "keep current".
    """

    since: float | None = None
    recommendations: tuple[tuple[float, int], ...] = ()
    events: tuple[ScaleEvent, ...] = ()

    def covers(self, now: float, seconds: float) -> bool:
        return seconds <= 0 or (self.since is not None and now - self.since >= seconds)

    def remember(self, at: float, recommendation: int, horizon: float) -> History:
        recs = tuple(r for r in self.recommendations if r[0] > at - horizon)
        return History(
            self.since if self.since is not None else at,
            (*recs, (at, recommendation)),
            tuple(e for e in self.events if e.at > at - horizon),
        )

    def scaled(self, at: float, before: int, after: int, horizon: float) -> History:
        events = tuple(e for e in self.events if e.at > at - horizon)
        return History(self.since, self.recommendations, (*events, ScaleEvent(at, before, after)))

    def changes(self, now: float, period: float) -> tuple[int, int]:
        """Replicas (added, removed) by scale writes within the last `period` seconds."""
        recent = [e for e in self.events if e.at > now - period]
        added = sum(e.after - e.before for e in recent if e.after > e.before)
        removed = sum(e.before - e.after for e in recent if e.after < e.before)
        return added, removed


@dataclass(frozen=True)
class Decision:
    """The replicas to run and why; `recommendation` is what the metric alone asked for."""

    replicas: int
    reason: str
    recommendation: int
    fast: bool = False


def scale_up_limit(current: int, history: History, rule: Rule, now: float, fast: bool) -> int:
    """HPA's scale-up limit (select policy Max); the fast path counts from `current`."""
    if fast:
        start = current
    else:
        added, removed = history.changes(now, rule.period_seconds)
        start = current - added + removed
    return max(start + rule.pods, math.ceil(start * (1 + rule.percent / 100)))


def scale_down_limit(current: int, history: History, rule: Rule, now: float) -> int:
    """HPA's scale-down limit (select policy Max: the lowest count any policy allows)."""
    added, removed = history.changes(now, rule.period_seconds)
    start = current + removed - added
    return min(start - rule.pods, math.floor(start * (1 - rule.percent / 100)))


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def recommend(value: float, current: int, ready: int | None, policy: Policy) -> tuple[int, str]:
    """Replicas the metric alone asks for (bounded), and why; no history, no rate limits."""
    ratio = value / policy.target
    if abs(ratio - 1) <= policy.tolerance:
        return current, f"within {policy.tolerance:.0%} of target"
    basis = current
    if policy.count_ready and ready is not None and 0 < ready < current:
        basis = ready
    starting = current - basis
    if ratio > 1:
        wanted = math.ceil(basis * ratio - _EPSILON)
        if wanted <= current and starting:
            return current, f"above target, waiting for {starting} starting replica(s)"
        return policy.bounded(max(wanted, current)), "above target"
    wanted = math.ceil(basis * ratio**policy.scale_down_exponent + starting - _EPSILON)
    return policy.bounded(wanted), "below target"


def decide(observation: Observation, current_replicas: int, policy: Policy, history: History) -> Decision:
    """The replica count to write now; equal to the (bounded) current count means no change."""
    now = observation.at
    current = policy.bounded(current_replicas)
    bounds = ""
    if current != current_replicas:
        bounds = f"; spec.replicas {current_replicas} brought into [{policy.min_replicas}, {policy.max_replicas}]"
    value = observation.value
    if value is None or not math.isfinite(value) or observation.age_seconds > policy.stale_after_seconds:
        return Decision(current, f"{_unusable(observation, policy)}: holding {current}{bounds}", current)

    recommendation, why = recommend(value, current, observation.ready_replicas, policy)
    # Stabilization (HPA semantics): up takes the recommendation, down the window's maximum.
    window = policy.scale_down_stabilization_seconds
    in_window = [r for t, r in history.recommendations if t > now - window]
    if not history.covers(now, window):
        in_window.append(current)
    ceiling = max([recommendation, *in_window])
    stabilized = min(max(current, recommendation), ceiling)
    fast = stabilized > current and policy.fast_factor is not None and value > policy.fast_factor * policy.target
    result, limited = _rate_limited(stabilized, current, policy, history, now, fast)

    seen = f"{policy.metric}={_fmt(value)} target={_fmt(policy.target)}"
    reason = _reason(seen, why, current, result, recommendation, limited, fast, window, ceiling, policy)
    return Decision(result, reason + bounds, recommendation, fast)


def _reason(
    seen: str,
    why: str,
    current: int,
    result: int,
    recommendation: int,
    limited: str,
    fast: bool,
    window: float,
    ceiling: int,
    policy: Policy,
) -> str:
    """What a decision says: the move made, or why none was."""
    if result > current:
        path = " [fast path]" if fast else ""
        return f"{seen}: {why}, scale up {current} -> {result} (wants {recommendation}{limited}){path}"
    if result < current:
        return f"{seen}: {why}, scale down {current} -> {result} (wants {recommendation}{limited})"
    if recommendation < current:
        return (
            f"{seen}: {why}, wants {recommendation}; holding {current} "
            f"(scale-down stabilization: highest in the last {window:g}s is {ceiling})"
        )
    if recommendation == current and why == "above target" and current == policy.max_replicas:
        return f"{seen}: above target, already at maxReplicas {current}"
    return f"{seen}: {why}; holding {current}"


def _unusable(observation: Observation, policy: Policy) -> str:
    """Why an observation without a usable value cannot be acted on."""
    value = observation.value
    if value is None or not math.isfinite(value):
        return f"no data ({observation.note or ('no samples' if value is None else f'value {value}')})"
    return f"stale data ({observation.age_seconds:.0f}s old, limit {policy.stale_after_seconds:.0f}s)"


def _rate_limited(
    wanted: int, current: int, policy: Policy, history: History, now: float, fast: bool
) -> tuple[int, str]:
    """`wanted` held to the behavior rules (and the bounds), with what limited it, if anything."""
    limited = ""
    if wanted > current:
        limit = scale_up_limit(current, history, policy.scale_up, now, fast)
        if wanted > limit:
            rule = policy.scale_up
            limited = (
                f", limited by scaleUp ({rule.pods} pods or {rule.percent}% per "
                f"{rule.period_seconds:g}s{', counted per decision' if fast else ''})"
            )
            wanted = limit
    elif wanted < current:
        limit = scale_down_limit(current, history, policy.scale_down, now)
        if wanted < limit:
            rule = policy.scale_down
            limited = f", limited by scaleDown ({rule.pods} pods or {rule.percent}% per {rule.period_seconds:g}s)"
            wanted = limit
    return policy.bounded(wanted), limited


@dataclass(frozen=True)
class Idleness:
    """What the scale-to-zero rule looks at (`autoscaling.scaleToZero`), on the wall clock.

    `requests` is what the service answered in the last `idle_seconds` plus what it is
    answering now (None: Prometheus could not say). `active_since` is the latest of: when this
    loop started watching, the last wake, the last time requests were seen. Both must say idle:
    Prometheus alone would call a service idle right after a wake (its new pods have counted
    nothing yet), and the loop's own memory alone would not see requests it never asked about.
    """

    now: float
    active_since: float
    idle_seconds: float
    requests: float | None
    rollout_in_progress: bool = False


def idle_decision(idle: Idleness, current: int) -> Decision | None:
    """Scale to zero now (a Decision of 0), or None to let the latency rule decide."""
    if current <= 0:
        return None
    if idle.rollout_in_progress:
        return None  # no arm of a canary goes to zero mid-rollout
    if idle.requests is None or not math.isfinite(idle.requests) or idle.requests > 0:
        return None
    quiet = idle.now - idle.active_since
    if quiet < idle.idle_seconds:
        return None
    return Decision(0, f"no request for {quiet:.0f}s (scaleToZero.idleSeconds {idle.idle_seconds:g}): scale to zero", 0)
