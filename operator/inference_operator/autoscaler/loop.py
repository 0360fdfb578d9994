"""One autoscaling step for one InferenceService: observe, decide, write, report.

The kopf daemon (handlers/autoscaler.py) calls `Autoscaler.tick` every `intervalSeconds`. Everything the
step needs to survive across ticks is either in the object (spec.replicas, status.autoscaler)
or in `History`, which may be lost at any time (operator restart): `decide` then holds
instead of scaling down.

What one loop scales is a value, its `ScaleTarget`: the service's spec.replicas (through the
scale subresource), or one role of a prefill/decode pair, spec.disaggregation.ROLE.replicas
(a merge patch under the autoscaler's field manager), read from that role's pods alone and
reported in status.autoscaler.ROLE.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from .. import metrics
from ..builders.activator import Wake, ready_on_path
from ..builders.common import Role
from ..builders.disaggregation import (
    ROLES,
    replicas_patch,
    role_spec,
    role_workload,
)
from ..credentials import CredentialsRefused, check_url
from ..jsontypes import JsonObject
from ..k8s import KubeApi, Ref
from ..kinds import INFERENCE_SERVICE
from ..models import (
    DEFAULT_ENGINE,
    ENGINES,
    AutoscalingSpec,
    Engine,
    InferenceServiceSpec,
    Metric,
)
from ..prometheus import promql
from ..prometheus.client import PrometheusClient, Sample
from ..prometheus.clients import CLIENT_ERRORS, PrometheusClients, client_problem
from ..reasons import Reason
from ..rollout import Phase, RolloutState
from ..settings import SCALER_MANAGER, CredentialPolicy
from ..status import find_condition, now_iso, set_condition, status_changes
from .policy import Decision, History, Idleness, Observation, Policy, decide, idle_decision

# The condition telling whether the built-in loop can query its metric, like an HPA's.
SCALING_ACTIVE = "ScalingActive"
EventPoster = Callable[[Reason, str], None]


@dataclass(frozen=True)
class ScaleTarget:
    """What one loop scales: the service NAME's spec.replicas (`role` None), or the count of one
    role of its prefill/decode pair. Every difference between the two is here."""

    name: str
    role: Role | None = None

    def view(self, spec: InferenceServiceSpec) -> InferenceServiceSpec:
        """The spec as the loop reads it: the service's, or the role's as a service of its own
        (its replicas and autoscaling; builders/disaggregation.py: `role_spec`)."""
        return spec if self.role is None else role_spec(spec, self.role)

    @property
    def label(self) -> str:
        """The name of its metrics and log lines: NAME, or the role's workload NAME-ROLE."""
        return self.name if self.role is None else role_workload(self.name, self.role)

    @property
    def pods(self) -> str | None:
        """The pods its queries read (a regex of pod names): all the service's, or the role's."""
        return None if self.role is None else promql.workload_pods(role_workload(self.name, self.role))

    def ready(self, status: JsonObject) -> int | None:
        """Its ready replicas: the role's in status.roles; the service's own, status.readyReplicas,
        unless it has roles (routing.router): that sum counts the router's pods too, which serve
        no model, so the workers' count is the predictor's role."""
        roles = status.get("roles") or []
        if self.role is None and not roles:
            return status.get("readyReplicas")
        role = self.role or Role.PREDICTOR
        return next((r.get("readyReplicas") for r in roles if r.get("role") == role), None)

    def write(self, replicas: int) -> tuple[JsonObject, str | None]:
        """The patch that sets its count, and the subresource it goes to."""
        if self.role is None:
            return {"spec": {"replicas": replicas}}, "scale"
        return replicas_patch({self.role: replicas}), None

    def reported(self, autoscaler: JsonObject) -> JsonObject:
        """Its entry of status.autoscaler as written: the whole, or the role's part."""
        return autoscaler if self.role is None else autoscaler.get(str(self.role)) or {}

    def report(self, changes: JsonObject) -> JsonObject:
        """The status.autoscaler patch of its entry."""
        return changes if self.role is None else {str(self.role): changes}


@dataclass(frozen=True)
class Queries:
    value: str
    latency_p95: str
    age: str


def queries_for(
    scaling: AutoscalingSpec,
    namespace: str,
    model: str,
    engine: Engine = DEFAULT_ENGINE,
    pods: str | None = None,
) -> Queries:
    """The loop's queries; with `pods` (a role's), over those pods alone."""
    # The spec's engine reads the metric from its own series (the CRD has it export the metric).
    exports = scaling.metric in ENGINES[engine].traits.metrics
    return Queries(
        value=promql.metric_query(
            scaling.metric, namespace, model, scaling.window_seconds, engine if exports else None, pods=pods
        ),
        latency_p95=promql.request_latency_ms(engine, namespace, model, scaling.window_seconds, pods),
        age=promql.data_age_seconds(namespace, model, engine, pods),
    )


def observation_from(
    at: float, value: Sample | None, age: Sample | None, ready_replicas: int | None, error: str | None = None
) -> Observation:
    """Combine the answers of one tick; any doubt about the data becomes "no value"."""
    if error:
        return Observation(at, None, ready_replicas=ready_replicas, note=error)
    if age is None or not math.isfinite(age.value):
        return Observation(at, None, ready_replicas=ready_replicas, note="no live series of the service in Prometheus")
    if value is None:
        return Observation(at, None, ready_replicas=ready_replicas, note="query returned no series")
    return Observation(at, value.value, age_seconds=max(age.value, 0.0), ready_replicas=ready_replicas)


def _rounded(value: float | None, digits: int) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)


def autoscaler_status(
    metric: Metric,
    observation: Observation,
    latency_p95_ms: float | None,
    decision: Decision,
    last_scale_time: str | None,
) -> JsonObject:
    """`status.autoscaler`; None values delete their key in a merge patch."""
    return {
        "metric": metric.value,
        "currentValue": _rounded(observation.value, 3),
        "latencyP95Ms": _rounded(latency_p95_ms, 1),
        "desiredReplicas": decision.replicas,
        "lastScaleTime": last_scale_time,
        "reason": decision.reason,
    }


def scaling_active(
    conditions: list[JsonObject],
    observation: Observation,
    refusal: CredentialsRefused | None,
    generation: int | None,
    role: Role | None = None,
    others_have_data: bool = True,
) -> list[JsonObject] | None:
    """The conditions with `ScalingActive` brought up to date; None when it already says so.

    A refused Prometheus credential is reported here with its reason: the loop holds the
    replica count, and the message says which rule to satisfy. A role's loop (`role`) shares
    the one condition with the other role's: it names its role, and a role with data leaves a
    False that the other role's missing data set (`others_have_data`) to that role's loop, so
    the two do not turn it over at every tick.
    """
    if refusal is not None:
        active, reason, message = False, refusal.reason, refusal.message
    elif observation.value is not None:
        if not others_have_data:
            return None
        active, reason, message = True, Reason.METRIC_AVAILABLE, "the metric is queried from Prometheus"
    else:
        active, reason, message = False, Reason.METRIC_UNAVAILABLE, observation.note or "no value"
    if role is not None:
        message = f"{role}: {message}"
    current = find_condition(conditions, SCALING_ACTIVE)
    if current is not None and (current.get("status"), current.get("reason")) == (str(active), reason):
        return None
    return set_condition(conditions, SCALING_ACTIVE, active, reason, message, now_iso(), generation)


def others_have_data(autoscaler: JsonObject, role: Role | None) -> bool:
    """Whether every other role's last reading (status.autoscaler.ROLE) had a value; a role
    without an entry (not on the built-in loop, or not read yet) does not count."""
    if role is None:
        return True
    others = [autoscaler.get(str(other)) for other in ROLES if other != role]
    return all(entry.get("currentValue") is not None for entry in others if isinstance(entry, dict))


class IdleWatch:
    """The scale-to-zero rule's memory (policy.idle_decision): since when the service counts as
    active, on the wall clock, and whether it was last seen at zero (then a tick at one or more
    means it was woken). A service's loop keeps one; a prefill/decode pair keeps one for both."""

    def __init__(self, wall_clock: Callable[[], float], activator: bool):
        self.wall_clock = wall_clock
        # Without the chart's activator nothing would wake a service at zero: it stays at one.
        self.activator = activator
        self.active_since = wall_clock()
        self.was_at_zero = False

    def seen(self, at_zero: bool) -> None:
        self.was_at_zero = self.was_at_zero or at_zero

    def decide(
        self, body: JsonObject, idle_seconds: float, ready: int | None, requests: float | None, current: int
    ) -> Decision | None:
        """Zero now, or None: `requests` is what Prometheus counted over `idle_seconds` (None:
        it could not say), `ready` what serves now."""
        now = self.wall_clock()
        if self.was_at_zero or not ready:
            self.active_since = now  # woken, or not serving yet: idle counts from when it serves
        self.was_at_zero = False
        woken = Wake.of((body.get("metadata") or {}).get("annotations")).at
        if woken is not None:
            self.active_since = max(self.active_since, woken.timestamp())
        if requests is not None and requests > 0:
            self.active_since = now
        rollout = RolloutState.from_status(body.get("status"))
        idleness = Idleness(
            now=now,
            active_since=self.active_since,
            idle_seconds=idle_seconds,
            requests=requests,
            rollout_in_progress=rollout is not None and rollout.phase == Phase.PROGRESSING,
        )
        return idle_decision(idleness, current)


class Autoscaler:
    """Per-InferenceService (or per role of its pair: `role`) state of the built-in loop:
    history and a Prometheus client."""

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        name: str,
        logger: logging.Logger | logging.LoggerAdapter[Any],
        post_event: EventPoster,
        policy: CredentialPolicy,
        clock: Callable[[], float] = time.monotonic,
        prometheus_factory: Callable[..., PrometheusClient] = PrometheusClient,
        wall_clock: Callable[[], float] = time.time,
        activator: bool = True,
        role: Role | None = None,
    ):
        self.api = api
        self.namespace = namespace
        self.name = name
        self.target = ScaleTarget(name, role)
        self.logger = logger
        self.post_event = post_event
        self.clock = clock
        self.policy = policy  # the operator's (OperatorConfig.credentials)
        self.history = History()
        self._clients = PrometheusClients(api, namespace, clock, prometheus_factory)
        self._had_data = True
        # (generation before our last scale write, replicas written): until the watch delivers
        # the object with a newer generation, the body still shows the old count.
        self._pending: tuple[int, int] | None = None
        # scaleToZero (a service's own; a pair's is its PairAutoscaler's).
        self.idle = IdleWatch(wall_clock, activator)
        # The last tick's decision and the count it started from (a pair goes to zero only
        # from a tick where both roles' loops held).
        self.last: tuple[int, Decision] | None = None

    @property
    def ref(self) -> Ref:
        return Ref.to(INFERENCE_SERVICE, self.namespace, self.name)

    async def aclose(self) -> None:
        await self._clients.aclose()

    async def _prometheus(self, scaling: AutoscalingSpec) -> PrometheusClient:
        """A client for the spec's URL and auth, once the URL may have them."""
        check_url(scaling, self.policy)
        return await self._clients.get(scaling.prometheus_url, scaling.prometheus_auth)

    async def requests(self, scaling: AutoscalingSpec, query: str) -> float | None:
        """The idle rule's count (`query`), or None when Prometheus cannot say."""
        try:
            answer = await (await self._prometheus(scaling)).query(query)
        except CredentialsRefused:
            answer = None
        except CLIENT_ERRORS:
            answer = None
        return answer.value if answer is not None else None

    async def _observe(
        self, scaling: AutoscalingSpec, model: str, ready: int | None, engine: Engine = DEFAULT_ENGINE
    ) -> tuple[Observation, float | None, CredentialsRefused | None]:
        q = queries_for(scaling, self.namespace, model, engine, self.target.pods)
        at = self.clock()
        try:
            client = await self._prometheus(scaling)
            wanted = [q.value, q.age]
            if q.latency_p95 != q.value:
                wanted.append(q.latency_p95)
            answers = await _query_all(client, wanted)
        except CredentialsRefused as exc:
            await self.aclose()
            return observation_from(at, None, None, ready, error=f"{exc.reason}: {exc.message}"), None, exc
        except CLIENT_ERRORS as exc:
            return observation_from(at, None, None, ready, error=client_problem(exc)), None, None
        value, age = answers[0], answers[1]
        p95 = answers[2] if len(answers) > 2 else value
        observation = observation_from(at, value, age, ready)
        p95_ms = p95.value if p95 is not None and observation.value is not None else None
        return observation, p95_ms, None

    def now(self, spec_replicas: int, body: JsonObject) -> int:
        """Its count as of its own last write: `spec_replicas` unless the body predates that."""
        return self._current_replicas(spec_replicas, (body.get("metadata") or {}).get("generation") or 0)

    def pending(self, generation: int, replicas: int) -> None:
        """A write of `replicas` made for it (by a pair's scale to zero): the next body may
        predate it."""
        self._pending = (generation, replicas) if generation else None

    async def tick(self, body: JsonObject, spec: InferenceServiceSpec) -> float:
        """Observe, decide and act once; returns the seconds until the next tick is due."""
        spec = self.target.view(spec)
        scaling = spec.autoscaling
        assert scaling is not None
        started = self.clock()
        policy = Policy.from_spec(scaling)
        status = body.get("status") or {}
        ready = self.target.ready(status)
        generation = (body.get("metadata") or {}).get("generation") or 0
        current = self._current_replicas(spec.replicas, generation)
        at_zero = scaling.scale_to_zero is not None and current == 0
        if at_zero:  # no pods to measure: nothing to ask Prometheus
            observation, p95_ms, refusal = Observation(started, None, note="scaled to zero"), None, None
        else:
            observation, p95_ms, refusal = await self._observe(
                scaling, spec.model.name or self.name, ready, spec.runtime.engine
            )
        self.idle.seen(at_zero)
        decision = await self._decision(body, spec, observation, current, policy, at_zero)
        self.last = (current, decision)

        previous = self.target.reported(status.get("autoscaler") or {})
        last_scale_time = previous.get("lastScaleTime")
        scaled_now = False
        if decision.replicas != current:
            scaled_at = await self._scale(policy, current, decision)
            if scaled_at is None:
                self.last = (current, Decision(current, "not written", current))
                return max(0.0, scaling.interval_seconds - (self.clock() - started))
            self.pending(generation, decision.replicas)
            last_scale_time, scaled_now = scaled_at, True

        self._log(scaling, observation, p95_ms, current, decision)
        metrics.record_autoscaler_decision(
            self.namespace,
            self.target.label,
            current=current,
            desired=decision.replicas,
            min_replicas=scaling.min_replicas,
            max_replicas=scaling.max_replicas,
            metric=scaling.metric.value,
            value=observation.value,
            target=scaling.target,
        )
        desired = autoscaler_status(scaling.metric, observation, p95_ms, decision, last_scale_time)
        role = self.target.role

        def patch(fresh: JsonObject) -> JsonObject:
            """From the object as it is now: the reconciler writes conditions too."""
            status = fresh.get("status") or {}
            autoscaler = status.get("autoscaler") or {}
            written = self.target.reported(autoscaler)
            # Not scaled now: the last scale is the one the object has (the body this tick was
            # given may predate the loop's own last write, and None would delete it).
            wanted = (
                desired if scaled_now else {**desired, "lastScaleTime": written.get("lastScaleTime", last_scale_time)}
            )
            changes = status_changes(written, wanted)
            found: JsonObject = {"autoscaler": self.target.report(changes)} if changes else {}
            conditions = scaling_active(
                status.get("conditions") or [],
                observation,
                refusal,
                generation or None,
                role,
                others_have_data(autoscaler, role),
            )
            if conditions is not None:
                found["conditions"] = conditions
            return found

        try:
            await asyncio.to_thread(self.api.update_status, self.ref, patch)
        except ApiException as exc:
            self.logger.warning("autoscaler status not written: API error %s", exc.status)
        return max(0.0, scaling.interval_seconds - (self.clock() - started))

    async def _decision(
        self,
        body: JsonObject,
        spec: InferenceServiceSpec,
        observation: Observation,
        current: int,
        policy: Policy,
        at_zero: bool,
    ) -> Decision:
        """Zero while at zero; otherwise the policy's, remembered in the history, or the
        scale-to-zero rule's when that goes lower (a service's own: a role's pair decides it)."""
        scaling = spec.autoscaling
        assert scaling is not None
        if at_zero:
            return Decision(0, "scaled to zero: a request wakes it (the activator holds it meanwhile)", 0)
        decision = decide(observation, current, policy, self.history)
        self.history = self.history.remember(observation.at, decision.recommendation, policy.horizon_seconds)
        if self.target.role is None and scaling.scale_to_zero is not None and decision.replicas <= current:
            decision = await self._idle(body, spec, current) or decision
        return decision

    async def _idle(self, body: JsonObject, spec: InferenceServiceSpec, current: int) -> Decision | None:
        """The scale-to-zero rule: zero once nothing was asked for `idleSeconds` (policy.idle_decision)."""
        scaling = spec.autoscaling
        assert scaling is not None and scaling.scale_to_zero is not None
        if not self.idle.activator:
            return None
        idle_seconds = scaling.scale_to_zero.idle_seconds
        query = promql.recent_requests(spec.runtime.engine, self.namespace, spec.model.name or self.name, idle_seconds)
        requests = await self.requests(scaling, query)
        # Serving once a request can pass the whole path: with a router, the router too.
        ready = ready_on_path(body.get("status") or {})
        return self.idle.decide(body, idle_seconds, ready, requests, current)

    def _current_replicas(self, spec_replicas: int, generation: int) -> int:
        """spec.replicas, or what we wrote last if the body predates that write."""
        if self._pending is not None:
            before, written = self._pending
            if generation and generation <= before:
                return written
            self._pending = None
        return spec_replicas

    async def _scale(self, policy: Policy, current: int, decision: Decision) -> str | None:
        """Write the target's count (`ScaleTarget.write`); the time of the write, or None."""
        running = policy.bounded(current)  # what the Deployment runs (the builder clamps too)
        patch, subresource = self.target.write(decision.replicas)
        try:
            await asyncio.to_thread(self.api.patch, self.ref, patch, subresource, SCALER_MANAGER)
        except ApiException as exc:
            self.logger.warning(
                "%s: scale to %d not written: API error %s %s",
                self.target.label,
                decision.replicas,
                exc.status,
                exc.reason,
            )
            return None
        written = now_iso()
        if decision.replicas != running:
            self.history = self.history.scaled(self.clock(), running, decision.replicas, policy.horizon_seconds)
            reason = Reason.SCALED_UP if decision.replicas > running else Reason.SCALED_DOWN
        else:
            reason = Reason.REPLICAS_BOUNDED
        what = "replicas" if self.target.role is None else f"{self.target.role} replicas"
        self.post_event(reason, f"{what} {current} -> {decision.replicas}: {decision.reason}")
        return written

    def _log(
        self, scaling: AutoscalingSpec, observation: Observation, p95_ms: float | None, current: int, decision: Decision
    ) -> None:
        has_data = observation.value is not None
        log = self.logger.info
        if not has_data and self._had_data:
            log = self.logger.warning  # once per outage, not on every tick
        self._had_data = has_data
        log(
            "autoscaler decision (%s): replicas %d -> %d (recommendation %d) metric=%s value=%s "
            "target=%s p95_ms=%s ready=%s data_age_s=%s fast=%s | %s",
            self.target.label,
            current,
            decision.replicas,
            decision.recommendation,
            scaling.metric.value,
            _fmt(observation.value),
            _fmt(scaling.target),
            _fmt(p95_ms),
            observation.ready_replicas,
            _fmt(observation.age_seconds if has_data else None),
            decision.fast,
            decision.reason,
        )


def _fmt(value: float | None) -> str:
    return "none" if value is None else f"{value:.4g}"


async def _query_all(client: PrometheusClient, queries: list[str]) -> list[Sample | None]:
    """The queries one after another, inside the daemon's own task: a task of their own could
    outlive a stopped daemon (a cancelled connect can surface as a connection error), and
    kopf re-raises such leftovers when the operator exits."""
    return [await client.query(text) for text in queries]
