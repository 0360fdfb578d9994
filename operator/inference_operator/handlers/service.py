"""The service itself: reconcile on create, update and resume (and report why not); forget it
once deleted."""

from __future__ import annotations

from typing import Any, NoReturn

import kopf
import urllib3
from kubernetes.client.exceptions import ApiException

from .. import credentials, lifetimes, metrics, policy, scale_to_zero, tracing
from ..autoscaler.report import leftover_reports
from ..builders import selector_string, service_url
from ..jsontypes import JsonObject
from ..k8s import Ref
from ..kinds import INFERENCE_SERVICE, unavailable_message
from ..models import SpecError
from ..reasons import Reason
from ..reconcile import ApplyRefused, ForeignObjectError, Result, api_message
from ..rollout import Phase, RolloutState
from ..status import NOT_CREATED, Problem, api_error_problem, compute_status, status_changes, with_api_error
from .bookkeeping import ProcessDiffBaseStorage, SeenWorkloads
from .shared import (
    announce_pods,
    announce_writes,
    by_ref,
    follow_activator,
    isvc_ref,
    normal_event,
    publish,
    reconcile_checked,
    refresh_status,
    rollout_problem,
)


def _temporary(exc: ApiException | urllib3.exceptions.HTTPError, retry: int = 0) -> kopf.TemporaryError:
    """Map a transient API failure to a retry, backing off exponentially (1 s … 5 min)."""
    delay = min(2.0**retry, 300.0)
    if not isinstance(exc, ApiException):
        return kopf.TemporaryError(f"API unreachable: {exc}", delay=delay)
    if exc.status == 429:
        retry_after = (exc.headers or {}).get("Retry-After")
        if retry_after and retry_after.isdigit():
            delay = max(delay, float(retry_after))
    elif exc.status in (401, 403):
        delay = max(delay, 30.0)  # RBAC or credentials: a person has to act, do not hammer
    return kopf.TemporaryError(f"API error {exc.status}: {exc.reason}", delay=delay)


@kopf.on.resume(INFERENCE_SERVICE.group, INFERENCE_SERVICE.version, INFERENCE_SERVICE.plural)
@kopf.on.create(INFERENCE_SERVICE.group, INFERENCE_SERVICE.version, INFERENCE_SERVICE.plural)
@kopf.on.update(INFERENCE_SERVICE.group, INFERENCE_SERVICE.version, INFERENCE_SERVICE.plural)
@metrics.instrumented("reconcile")
def reconcile_service(
    body: kopf.Body, meta: kopf.Meta, memo: kopf.Memo, logger: kopf.Logger, retry: int = 0, **_: Any
) -> None:
    try:
        with tracing.reconcile_span(memo.get("tracing"), meta["namespace"], meta["name"], meta.get("generation")):
            _reconcile_service(memo, body, meta, logger)
    except (ApiException, urllib3.exceptions.HTTPError) as exc:
        if isinstance(exc, ApiException) and retry >= 1:  # a second failure in a row: say so
            _report_api_error(memo, body, meta, exc, logger)
        raise _temporary(exc, retry) from exc


def _report_api_error(
    memo: kopf.Memo, body: kopf.Body, meta: kopf.Meta, exc: ApiException, logger: kopf.Logger
) -> None:
    """Degraded=ApiError with the API server's message (and a Warning event), so a failure no
    retry fixes is visible in `kubectl get/describe`; best effort, the retry goes on anyway."""
    problem = api_error_problem(exc.status or 0, str(exc.reason), api_message(exc))
    if problem is None:
        return
    generation = meta.get("generation")
    ref = isvc_ref(meta["namespace"], meta["name"])

    try:
        publish(memo, ref, lambda fresh: with_api_error(fresh.get("status"), problem, generation))
    except (ApiException, urllib3.exceptions.HTTPError) as write_error:
        logger.warning("could not record %s in status: %s", problem.reason, write_error)
    kopf.warn(body, reason=problem.reason, message=problem.message)


# What reconcile raises for a problem retrying alone does not fix.
_REFUSALS = (policy.PolicyViolation, credentials.CredentialsRefused, SpecError, ForeignObjectError, ApplyRefused)


def _refusal(exc: Exception) -> tuple[Problem, float | None]:
    """The problem one of `_REFUSALS` records, and when to look again (None: on a spec change)."""
    if isinstance(exc, policy.PolicyViolation):
        return Problem(exc.reason, str(exc)), None
    if isinstance(exc, credentials.CredentialsRefused):
        # Cleared by labelling a Secret or configuring the operator, not only by a spec change.
        return Problem(exc.reason, exc.message), float(credentials.RECHECK_SECONDS)
    if isinstance(exc, SpecError):
        return Problem(Reason.INVALID_SPEC, str(exc)), None
    if isinstance(exc, ForeignObjectError):
        return Problem(Reason.RESOURCE_CONFLICT, str(exc)), None
    return Problem(Reason.APPLY_FAILED, f"the API server refused the desired objects, none was changed: {exc}"), None


def _reconcile_service(memo: kopf.Memo, body: kopf.Body, meta: kopf.Meta, logger: kopf.Logger) -> None:
    name, namespace, generation = meta["name"], meta["namespace"], meta.get("generation")
    ref = isvc_ref(namespace, name)
    problem: Problem | None = None
    recheck: float | None = None
    try:
        owner, result = reconcile_checked(memo, body)
    except _REFUSALS as exc:
        problem, recheck = _refusal(exc)
    if problem is not None:
        _give_up(memo, body, ref, generation, problem, logger, recheck)
    seen: SeenWorkloads | None = memo.get("seen_workloads")
    if seen is not None:  # their events, if they bring these versions, have no news (repair.py)
        for workload in result.serving.values():
            seen.saw(workload)

    announce_writes(body, result.writes)
    tracing.record_writes(result.writes)
    problem = result.problem
    if result.unavailable:
        problem = Problem(Reason.API_UNAVAILABLE, "; ".join(unavailable_message(k) for k in result.unavailable))
    workloads = by_ref(memo.api, {role: Ref.of(obj) for role, obj in result.serving.items()})
    selector = selector_string(owner)
    extra = {"observedGeneration": generation, "url": service_url(owner), "selector": selector}
    extra["inventory"] = result.inventory
    extra |= rollout_status(result)
    _announce_rollout(body, RolloutState.from_status(body.get("status")), result.rollout)
    shown = problem or rollout_problem(result.rollout)

    def compute(fresh: JsonObject) -> JsonObject:
        status = refresh_status(memo.api, fresh, workloads, shown, generation=generation, selector=selector)
        return status | extra | leftover_reports(owner.spec, fresh.get("status"))

    def follow(status: JsonObject) -> None:
        follow_activator(memo, body, owner, status, logger)

    previous, new_status = publish(memo, ref, compute, known=body, then=follow)
    announce_pods(body, previous, new_status)
    logger.info(
        "reconciled generation %s: %d writes (%s), status keys changed: %s",
        generation,
        len(result.writes),
        ", ".join(c.describe() for c in result.writes) or "none",
        ", ".join(sorted(status_changes(previous, new_status))) or "none",
    )
    if problem is not None:
        kopf.warn(body, reason=problem.reason, message=problem.message)
        # Not permanent: the add-on may be installed, the Secret labelled, both outside the
        # spec. Looked at again on a slow timer, not in a hot loop.
        raise kopf.TemporaryError(problem.message, delay=credentials.RECHECK_SECONDS)


def rollout_status(result: Result) -> JsonObject:
    """`status.rollout` as reconcile left it; removed once the service no longer uses canaries."""
    return {"rollout": result.rollout.to_status() if result.rollout is not None else None}


def _give_up(
    memo: kopf.Memo,
    body: kopf.Body,
    ref: Ref,
    generation: int | None,
    problem: Problem,
    logger: kopf.Logger,
    recheck: float | None = None,
) -> NoReturn:
    """Record a problem only a spec change can fix, then stop retrying until that change (or,
    with `recheck`, look again after that many seconds)."""
    try:
        publish(
            memo,
            ref,
            lambda fresh: (
                compute_status(fresh.get("status"), NOT_CREATED, generation, problem)
                | {"observedGeneration": generation}
            ),
        )
    except ApiException as exc:
        if exc.status not in (400, 422):
            raise  # transient: retry the whole handler, which records it next time
        logger.warning("could not record %s in status: %s", problem.reason, exc.reason)
    kopf.warn(body, reason=problem.reason, message=problem.message)
    if recheck is not None:
        raise kopf.TemporaryError(problem.message, delay=recheck)
    raise kopf.PermanentError(problem.message)


def _announce_rollout(body: kopf.Body | JsonObject, before: RolloutState | None, after: RolloutState | None) -> None:
    """An event and a count when a reconcile starts a canary of a new revision."""
    if after is None or after.phase != Phase.PROGRESSING:
        return
    if before is not None and before.revision == after.revision and before.phase == Phase.PROGRESSING:
        return
    meta = body["metadata"]
    metrics.ROLLOUTS.labels(meta["namespace"], meta["name"], "started").inc()
    normal_event(body, Reason.CANARY_STARTED, after.message)


@kopf.on.event(INFERENCE_SERVICE.group, INFERENCE_SERVICE.version, INFERENCE_SERVICE.plural, id="service-deleted")
async def service_deleted(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """End the daemons of a deleted InferenceService (no finalizer made kopf do it: lifetimes)
    and forget its status lock and kopf's diff base (one per service ever seen would otherwise
    stay). Async: it sets the daemons' asyncio.Event on their own loop."""
    if event["type"] == "DELETED":
        meta = body["metadata"]
        lifetimes.object_deleted(memo, meta["uid"])
        diffbase: ProcessDiffBaseStorage | None = memo.get("diffbase")
        if diffbase is not None:
            diffbase.forget(meta["uid"])
        memo.status_locks.forget(meta["namespace"], meta["name"])
        seen: SeenWorkloads | None = memo.get("seen_workloads")
        if seen is not None:
            seen.forget(meta["namespace"], meta["name"])
        registry: scale_to_zero.Registry | None = memo.get("scale_to_zero")
        if registry is not None:
            registry.forget(meta["namespace"], meta["name"])
