"""A canary rollout's analysis: judged from Prometheus every interval, stepped, promoted or
rolled back (rollout.py decides, analysis.py measures)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import kopf

from .. import credentials, metrics, policy
from ..analysis import AnalysisRefused, analysis_client, measure
from ..jsontypes import JsonObject
from ..k8s import Ref
from ..models import CanarySpec, InferenceServiceSpec, RolloutStrategy, SpecError
from ..prometheus.clients import CLIENT_ERRORS, PrometheusClients, client_problem
from ..reasons import Reason
from ..reconcile import ApplyRefused, ForeignObjectError
from ..rollout import COMMAND_ANNOTATION, Check, Command, Phase, Progress, RolloutState, advance
from ..status import now_iso
from .daemons import Daemon, Tick, service_daemon
from .shared import (
    announce_writes,
    as_body,
    by_ref,
    isvc_ref,
    normal_event,
    publish,
    reconcile_checked,
    refresh_status,
    rollout_problem,
)

ROLLOUT_EVENTS = {
    Reason.CANARY_STEP: "stepped",
    Reason.CANARY_PROMOTED: "promoted",
    Reason.CANARY_ROLLED_BACK: "rolled_back",
}


def canary_strategy(spec: kopf.Spec, **_: Any) -> bool:
    return bool((spec.get("rollout") or {}).get("strategy") == RolloutStrategy.CANARY.value)


@service_daemon("canary", when=canary_strategy)
@contextlib.asynccontextmanager
async def canary_analysis(daemon: Daemon) -> AsyncIterator[Tick]:
    """Judge a progressing canary every analysis interval; step, promote or roll it back."""
    clients = PrometheusClients(daemon.memo.api, daemon.meta["namespace"])
    try:
        yield lambda spec: _analyse_once(daemon, spec, clients)
    finally:
        await clients.aclose()


async def _analyse_once(daemon: Daemon, spec: InferenceServiceSpec, clients: PrometheusClients) -> float:
    """One analysis tick; returns the seconds until the next."""
    memo, body, meta, logger = daemon.memo, daemon.body, daemon.meta, daemon.logger
    canary = spec.rollout.canary
    state = RolloutState.from_status(body.get("status"))
    if canary is None:
        return 5.0
    if state is None or state.phase != Phase.PROGRESSING:
        return float(canary.analysis.interval_seconds)  # reading the body costs nothing
    command = (meta.get("annotations") or {}).get(COMMAND_ANNOTATION)
    check, refused = None, None
    if command not in (Command.PROMOTE, Command.ABORT):
        check, refused = await _canary_check(memo, clients, spec, canary, meta, logger)
    step = advance(state, canary, check, time.time(), command)
    if refused is not None and step.verdict == "inconclusive":  # say why there is no data
        why = f"step {state.step + 1} at {state.weight}%: not analysed: {refused}"
        step = dataclasses.replace(step, state=dataclasses.replace(step.state, message=why))
    logger.info("canary analysis: %s (%s)", step.verdict, step.state.message)
    if step.state != state:
        await asyncio.to_thread(_apply_rollout_step, memo, dict(body), step, check, logger)
    if command is not None:  # carried out (or meaningless): it must not act on the next rollout
        await asyncio.to_thread(memo.api.patch, daemon.ref, {"metadata": {"annotations": {COMMAND_ANNOTATION: None}}})
    return float(canary.analysis.interval_seconds)


async def _canary_check(
    memo: kopf.Memo,
    clients: PrometheusClients,
    spec: InferenceServiceSpec,
    canary: CanarySpec,
    meta: kopf.Meta,
    logger: kopf.Logger,
) -> tuple[Check | None, str | None]:
    """The canary's numbers from Prometheus, or none and why the analysis may not query."""
    try:
        client = await analysis_client(clients, spec, canary, memo.config.credentials)
    except (AnalysisRefused, credentials.CredentialsRefused) as exc:
        refused = str(exc)
    except CLIENT_ERRORS as exc:
        refused = client_problem(exc)
    else:
        model = spec.model.name or meta["name"]
        return await measure(client, spec, canary, meta["namespace"], meta["name"], model), None
    logger.warning("canary not analysed: %s", refused)
    return None, refused


def _apply_rollout_step(
    memo: kopf.Memo, isvc: JsonObject, step: Progress, check: Check | None, logger: kopf.Logger
) -> None:
    """Record the new rollout state, with the check behind it, then reconcile to it (the canary's
    replicas, the promotion or the rollback). Status first: the canary's deletion makes the
    repair path reconcile too, and it must read the new state, not bring the canary back."""
    meta = isvc["metadata"]
    ref = isvc_ref(meta["namespace"], meta["name"])
    last_check = _check_status(check, step.verdict)
    rollout = {"rollout": {**step.state.to_status(), "lastCheck": last_check}}
    publish(memo, ref, lambda fresh: rollout)
    status = {**(isvc.get("status") or {}), **rollout}
    try:
        _, result = reconcile_checked(memo, {**isvc, "status": status})
    except (SpecError, ForeignObjectError, ApplyRefused, policy.PolicyViolation, credentials.CredentialsRefused) as exc:
        logger.warning("canary step not applied: %s", exc)  # the reconcile handler reports it
        return
    if result.rollout is not None:  # as reconcile left it (a promotion records the new stable manifest)
        settled = {"rollout": {**result.rollout.to_status(), "lastCheck": last_check}}
        publish(memo, ref, lambda fresh: settled)
    announce_writes(isvc, result.writes)
    if (problem := rollout_problem(step.state)) is not None:
        workloads = by_ref(memo.api, {role: Ref.of(obj) for role, obj in result.serving.items()})
        publish(memo, ref, lambda fresh: refresh_status(memo.api, fresh, workloads, problem))
    if step.event is not None:
        reason, message = step.event
        metrics.ROLLOUTS.labels(meta["namespace"], meta["name"], ROLLOUT_EVENTS[reason]).inc()
        if reason == Reason.CANARY_ROLLED_BACK:
            kopf.warn(as_body(isvc), reason=str(reason), message=message)
        else:
            normal_event(isvc, reason, message)


def _check_status(check: Check | None, verdict: str) -> JsonObject:
    found: JsonObject = {"time": now_iso(), "verdict": verdict}
    if check is not None:
        for key, value in (
            ("latencyMs", check.latency_ms),
            ("errorRatio", check.error_ratio),
            ("requests", check.requests),
        ):
            if value is not None and math.isfinite(value):
                found[key] = round(value, 4)
    return found
