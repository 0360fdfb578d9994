"""kopf handlers: the I/O edge between the API server and the pure parts of the operator.

State lives in the objects (spec-hash annotations, field ownership, status), never in this
process, so any replica of the operator can pick up where another stopped. The only memory
kept here is what rate-limits repairs and serialises status writes; losing it is harmless.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn, cast

import httpx
import kopf
import urllib3
from kubernetes.client.exceptions import ApiException

from . import (
    adapter_status,
    adapter_watch,
    config,
    credentials,
    lifetimes,
    metrics,
    ownership,
    policy,
    scale_to_zero,
    status_pods,
    tracing,
)
from . import status as st
from .analysis import AnalysisRefused, analysis_client, measure
from .autoscaler.clients import CLIENT_ERRORS, PrometheusClients, client_problem
from .builders import selector_string, service_url
from .builders.common import COMPONENT, MANAGER, OWNER_LABEL, SPEC_HASH_ANNOTATION, Owner
from .builders.deployment import CONTAINER as SERVER_CONTAINER
from .builders.storage import FETCH_CONTAINER
from .builders.vllm import CONTAINER as VLLM_CONTAINER
from .jsontypes import JsonObject
from .k8s import FIELD_MANAGER, KubeApi, Ref, load_api_client
from .kinds import DEPLOYMENT, KINDS, LEADER_WORKER_SET, POD, WORKLOAD_KINDS, unavailable_message
from .models import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    CanarySpec,
    InferenceServiceSpec,
    RolloutStrategy,
    SpecError,
    parse_spec,
)
from .reasons import Reason
from .reconcile import Action, ApplyRefused, ForeignObjectError, Result, api_message, reconcile
from .rollout import COMMAND_ANNOTATION, Check, Command, Phase, RolloutState, advance
from .rollout import Step as RolloutStep
from .scale_to_zero_handlers import watch_activator_only

# Problems rollout news does not clear: only a spec change or the next re-check can (a canary
# rolled back stays Degraded until the spec changes; the stable revision serves meanwhile).
KEPT_PROBLEMS = (*st.SPEC_PROBLEMS, Reason.API_ERROR, *credentials.REFUSALS, Reason.ROLLED_BACK)
# At most this many drift repairs of one InferenceService's objects per window; more wait,
# so a fight with another controller costs a few writes a minute, not a write storm.
REPAIR_BURST = 3
REPAIR_WINDOW_SECONDS = 30.0
# The containers of a model pod whose failures status_pods tells apart.
POD_ROLES = status_pods.Roles(fetch=FETCH_CONTAINER, servers=(SERVER_CONTAINER, VLLM_CONTAINER))
_STATUS_LOCKS_GUARD = threading.Lock()


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Keep kopf's bookkeeping in annotations: status is ours, and the schema prunes unknowns.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    # Events are posted deliberately (one per change), not for every log line.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    # `run` puts its configuration in the memo; `kopf run -m` (tests) gets it read here. Either
    # way it is read once: a bad value stops the operator now, not on every reconcile.
    if getattr(memo, "config", None) is None:
        memo.config = config.load()
    operator_config: config.OperatorConfig = memo.config
    # HA: a priority of this replica's own and the keep-alive lifetime (see peering.py).
    operator_config.peering.apply(settings)
    if getattr(memo, "api", None) is None:
        memo.api = KubeApi(load_api_client(operator_config.kubeconfig))
    if "tracing" not in memo:
        memo.tracing = tracing.start(operator_config.tracing)
    watch_activator_only(settings, operator_config.activator)
    if "scale_to_zero" not in memo:
        memo.scale_to_zero = scale_to_zero.Registry()


@kopf.on.cleanup()
async def flush_traces(memo: kopf.Memo, **_: Any) -> None:
    """The last reconciles' spans leave before the process does (bounded: a stuck collector
    holds the exit for `tracing.SHUTDOWN_TIMEOUT_S` at most)."""
    traces: tracing.Tracing | None = memo.get("tracing")
    if traces is not None:
        await asyncio.to_thread(traces.shutdown)


# kopf (1.45) names the task that waits on a watch stream's pause toggle so.
PAUSE_WAITER_PREFIX = "pause-waiter for "


@kopf.on.cleanup()
async def release_abandoned_watch_waiters(logger: kopf.Logger, **_: Any) -> None:
    """Cancel the pause waiters of watch streams that kopf abandoned.

    A watcher cancelled while it waits for a free worker (`queueing.worker_limit`, busy with a
    backlog) leaves its watch stream suspended, and the stream's pause-waiter task alive; kopf
    then waits 5 s for such leftover tasks before cancelling them. Cleanup runs once every
    watcher is gone, so cancelling them here is what closing the stream would have done:
    SIGTERM with a backlog exits in about 1.5 s instead of 6.5 s (bench/operator_scale.py).
    """
    current = asyncio.current_task()
    waiters = [
        task
        for task in asyncio.all_tasks()
        if task is not current and not task.done() and task.get_name().startswith(PAUSE_WAITER_PREFIX)
    ]
    for task in waiters:
        task.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    if waiters:
        logger.debug("released %d abandoned watch-stream waiters", len(waiters))


@kopf.on.login()
def login(memo: kopf.Memo, **kwargs: Any) -> kopf.ConnectionInfo | None:
    """The same sources as the kubernetes client: in-cluster account, else KUBECONFIG.

    In a pod the API server is reached at the address the kubelet puts in the environment, as
    client-go and the kubernetes client do (`OperatorConfig.api_server`): kopf's own choice,
    https://kubernetes.default.svc, needs cluster DNS, so an operator would stop with CoreDNS.
    Login runs after the startup handlers, so the memo has the configuration."""
    info = kopf.login_with_service_account(memo=memo, **kwargs)
    if info is None:
        return kopf.login_with_kubeconfig(memo=memo, **kwargs)
    server = memo.config.api_server
    return dataclasses.replace(info, server=server) if server else info


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


def _normal_event(body: kopf.Body | JsonObject, reason: Reason | Action, message: str) -> None:
    """A Normal event; kopf.info would obey posting.level, which keeps log lines out."""
    kopf.event(_body(body), type="Normal", reason=str(reason), message=message)


def _body(obj: kopf.Body | JsonObject) -> kopf.Body:
    """An object read through the API as kopf's events take it (kopf reads only its metadata)."""
    return cast(kopf.Body, obj)


def _isvc_ref(namespace: str, name: str) -> Ref:
    return Ref(API_VERSION, KIND, namespace, name)


def _publish(
    memo: kopf.Memo, ref: Ref, compute: Callable[[JsonObject], JsonObject | None]
) -> tuple[JsonObject | None, JsonObject]:
    """Write only the status keys that changed, computed from the object as it is now.

    Several writers race (the reconcile handler, owned-object events, the autoscaler): each
    decides from a fresh read and writes guarded by its resourceVersion (KubeApi.update_status),
    so none puts back a stale conditions list and two never send the same patch twice.
    `compute` may return None: nothing to say now. Returns (the previous status, the new
    status); an unchanged status costs no write.
    """
    api: KubeApi = memo.api
    computed: JsonObject = {}

    def changes(fresh: JsonObject) -> JsonObject | None:
        new_status = compute(fresh)
        computed["status"] = fresh.get("status") if new_status is None else new_status
        return None if new_status is None else st.status_changes(fresh.get("status"), new_status)

    with _status_lock(memo, ref):
        fresh, _ = api.update_status(ref, changes)
    if fresh is None:
        return None, {}
    return fresh.get("status"), computed.get("status") or {}


def _follow_activator(
    memo: kopf.Memo, isvc: kopf.Body | JsonObject, owner: Owner, status: JsonObject, logger: kopf.Logger
) -> None:
    """NAME-activator as the service's ready count now asks (scale_to_zero.py)."""
    ready = status.get("readyReplicas")
    registry: scale_to_zero.Registry | None = memo.get("scale_to_zero")
    if registry is None or not registry.remember(owner, ready):  # None: not started by `configure`
        return
    change = scale_to_zero.sync_slice(memo.api, owner, ready, registry.activator)
    if change is not None:
        _normal_event(isvc, change.action, change.describe())
        logger.info("activator slice: %s (ready replicas %s)", change.describe(), ready)


def _serves_at_zero(isvc: JsonObject) -> bool:
    """The service scales to zero: at zero it is Ready (status.compute_status)."""
    scaling = (isvc.get("spec") or {}).get("autoscaling") or {}
    return bool(scaling.get("scaleToZero")) and scaling.get("minReplicas") == 0


def _status_lock(memo: kopf.Memo, ref: Ref) -> threading.Lock:
    """One InferenceService's status writes, one at a time (in this process; peering keeps
    other replicas paused). With `_observe` inside, whichever write comes last read the cluster
    last: an event that arrives while another write is under way waits for it, then reads
    again, so no write can put back news older than the last event."""
    with _STATUS_LOCKS_GUARD:
        locks: dict[tuple[str, str], threading.Lock] = memo.setdefault("status_locks", {})
        return locks.setdefault((ref.namespace, ref.name), threading.Lock())


def _observe(api: KubeApi, workload: Ref | None, pod_selector: str | None) -> tuple[st.Rollout, st.Problem | None]:
    """The service's workload and pods as they are now, read inside the status write (see
    `_status_lock`): never the copy an apply answered, which predates its controller's news."""
    live = api.get(workload) if workload is not None else None
    pods = api.list_objects(*POD.key, workload.namespace, pod_selector) if workload and pod_selector else []
    return st.rollout(live), status_pods.pods_problem(pods, POD_ROLES)


def _workload_ref(isvc: JsonObject) -> Ref:
    """The Deployment named after the service, or its LeaderWorkerSet when it spans nodes."""
    meta = isvc["metadata"]
    nodes = ((((isvc.get("spec") or {}).get("resources") or {}).get("gpu")) or {}).get("nodes") or 1
    if int(nodes) > 1:
        return Ref.to(LEADER_WORKER_SET, meta["namespace"], meta["name"])
    return Ref.to(DEPLOYMENT, meta["namespace"], meta["name"])


def _announce_pods(isvc: kopf.Body | JsonObject, previous: JsonObject | None, new: JsonObject) -> None:
    """A Warning event when the pods' problem appears or changes (kubectl describe shows it)."""
    condition = st.find_condition(new.get("conditions"), st.DEGRADED)
    if condition is None or condition.get("status") != "True" or condition.get("reason") not in status_pods.REASONS:
        return
    before = st.find_condition((previous or {}).get("conditions"), st.DEGRADED) or {}
    if (before.get("status"), before.get("reason"), before.get("message")) == (
        "True",
        condition.get("reason"),
        condition.get("message"),
    ):
        return
    kopf.warn(_body(isvc), reason=condition["reason"], message=condition.get("message", ""))


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
@metrics.instrumented("reconcile")
def reconcile_service(
    body: kopf.Body, meta: kopf.Meta, spec: kopf.Spec, memo: kopf.Memo, logger: kopf.Logger, retry: int = 0, **_: Any
) -> None:
    try:
        with tracing.reconcile_span(memo.get("tracing"), meta["namespace"], meta["name"], meta.get("generation")):
            _reconcile_service(memo, body, meta, spec, logger)
    except (ApiException, urllib3.exceptions.HTTPError) as exc:
        if isinstance(exc, ApiException) and retry >= 1:  # a second failure in a row: say so
            _report_api_error(memo, body, meta, exc, logger)
        raise _temporary(exc, retry) from exc


def _report_api_error(
    memo: kopf.Memo, body: kopf.Body, meta: kopf.Meta, exc: ApiException, logger: kopf.Logger
) -> None:
    """Degraded=ApiError with the API server's message (and a Warning event), so a failure no
    retry fixes is visible in `kubectl get/describe`; best effort, the retry goes on anyway."""
    problem = st.api_error_problem(exc.status or 0, str(exc.reason), api_message(exc))
    if problem is None:
        return
    generation = meta.get("generation")
    ref = _isvc_ref(meta["namespace"], meta["name"])

    try:
        _publish(memo, ref, lambda fresh: st.with_api_error(fresh.get("status"), problem, generation))
    except (ApiException, urllib3.exceptions.HTTPError) as write_error:
        logger.warning("could not record %s in status: %s", problem.reason, write_error)
    kopf.warn(body, reason=problem.reason, message=problem.message)


def _reconcile_checked(
    memo: kopf.Memo, name: str, namespace: str, uid: str, spec: JsonObject, status: JsonObject | None
) -> tuple[Owner, Result]:
    """Parse the spec, hold it to the platform's pod policy, then reconcile it (a canary
    rollout where `status` left it)."""
    operator_config: config.OperatorConfig = memo.config
    owner = operator_config.owner(name, namespace, uid, parse_spec(spec))
    policy.check(owner.spec, operator_config.pod_policy, owner.namespace)
    state = RolloutState.from_status(status)
    return owner, reconcile(memo.api, owner, operator_config.credentials, state)


def _reconcile_service(memo: kopf.Memo, body: kopf.Body, meta: kopf.Meta, spec: kopf.Spec, logger: kopf.Logger) -> None:
    name, namespace, generation = meta["name"], meta["namespace"], meta.get("generation")
    ref = _isvc_ref(namespace, name)
    problem: st.Problem | None = None
    recheck: float | None = None
    try:
        owner, result = _reconcile_checked(memo, name, namespace, meta["uid"], dict(spec), body.get("status"))
    except policy.PolicyViolation as exc:
        problem = st.Problem(exc.reason, str(exc))
    except credentials.CredentialsRefused as exc:
        # Cleared by labelling a Secret or configuring the operator, not only by a spec change.
        problem, recheck = st.Problem(exc.reason, exc.message), float(credentials.RECHECK_SECONDS)
    except SpecError as exc:
        problem = st.Problem(Reason.INVALID_SPEC, str(exc))
    except ForeignObjectError as exc:
        problem = st.Problem(Reason.RESOURCE_CONFLICT, str(exc))
    except ApplyRefused as exc:
        problem = st.Problem(
            Reason.APPLY_FAILED, f"the API server refused the desired objects, none was written: {exc}"
        )
    if problem is not None:
        _give_up(memo, body, ref, generation, problem, logger, recheck)

    for change in result.writes:
        _normal_event(body, change.action, change.describe())
    tracing.record_writes(result.writes)
    problem = result.problem
    if result.unavailable:
        problem = st.Problem(Reason.API_UNAVAILABLE, "; ".join(unavailable_message(k) for k in result.unavailable))
    workload = Ref.of(result.deployment) if result.deployment is not None else None
    selector = selector_string(owner)
    extra = {"observedGeneration": generation, "url": service_url(owner), "selector": selector}
    extra |= rollout_status(result)
    _announce_rollout(body, RolloutState.from_status(body.get("status")), result.rollout)
    shown = problem or _rollout_problem(result.rollout)

    def compute(fresh: JsonObject) -> JsonObject:
        state, pods = _observe(memo.api, workload, selector)
        zero = _serves_at_zero(fresh)
        return st.compute_status(fresh.get("status"), state, generation, shown, pods=pods, serves_at_zero=zero) | extra

    previous, new_status = _publish(memo, ref, compute)
    _follow_activator(memo, body, owner, new_status, logger)
    _announce_pods(body, previous, new_status)
    logger.info(
        "reconciled generation %s: %d writes (%s), status keys changed: %s",
        generation,
        len(result.writes),
        ", ".join(c.describe() for c in result.writes) or "none",
        ", ".join(sorted(st.status_changes(previous, new_status))) or "none",
    )
    if problem is not None:
        kopf.warn(body, reason=problem.reason, message=problem.message)
        # Not permanent: the add-on may be installed, the Secret labelled, both outside the
        # spec. Looked at again on a slow timer, not in a hot loop.
        raise kopf.TemporaryError(problem.message, delay=credentials.RECHECK_SECONDS)


def _rollout_problem(rollout: RolloutState | None) -> st.Problem | None:
    if rollout is None or rollout.phase != Phase.ROLLED_BACK:
        return None
    return st.Problem(Reason.ROLLED_BACK, f"revision {rollout.revision}: {rollout.message}")


def rollout_status(result: Result) -> JsonObject:
    """`status.rollout` as reconcile left it; removed once the service no longer uses canaries."""
    return {"rollout": result.rollout.to_status() if result.rollout is not None else None}


def _give_up(
    memo: kopf.Memo,
    body: kopf.Body,
    ref: Ref,
    generation: int | None,
    problem: st.Problem,
    logger: kopf.Logger,
    recheck: float | None = None,
) -> NoReturn:
    """Record a problem only a spec change can fix, then stop retrying until that change (or,
    with `recheck`, look again after that many seconds)."""
    try:
        _publish(
            memo,
            ref,
            lambda fresh: (
                st.compute_status(fresh.get("status"), st.NOT_CREATED, generation, problem)
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


def _controller_owner(body: kopf.Body) -> JsonObject | None:
    refs: list[JsonObject] = body["metadata"].get("ownerReferences") or []
    return next(
        (r for r in refs if r.get("kind") == KIND and r.get("apiVersion") == API_VERSION and r.get("controller")), None
    )


def _suspect(body: kopf.Body) -> str | None:
    """Why an owned object may have drifted, judged from the object alone (no API call)."""
    if SPEC_HASH_ANNOTATION not in (body["metadata"].get("annotations") or {}):
        return "annotations edited"
    managers = ownership.foreign_spec_managers(dict(body), FIELD_MANAGER)
    return "fields changed by " + ", ".join(managers) if managers else None


def _repair_times(memo: kopf.Memo, key: tuple[str, str]) -> collections.deque[float]:
    """When this InferenceService's recent repairs wrote something (only those count)."""
    repairs: collections.defaultdict[tuple[str, str], collections.deque[float]] = memo.setdefault(
        "repairs", collections.defaultdict(collections.deque)
    )
    return repairs[key]


async def _await_repair_slot(memo: kopf.Memo, key: tuple[str, str], logger: kopf.Logger) -> None:
    """Allow REPAIR_BURST writing repairs per window per InferenceService; later ones wait. A
    look that finds nothing to repair (a stale event, an HPA's scaling) costs no slot."""
    times = _repair_times(memo, key)
    now = time.monotonic()
    while times and now - times[0] > REPAIR_WINDOW_SECONDS:
        times.popleft()
    if len(times) >= REPAIR_BURST:
        wait = REPAIR_WINDOW_SECONDS - (now - times[0])
        logger.warning("repairs of %s/%s rate-limited: next in %.0f s", *key, wait)
        await asyncio.sleep(wait)


def _repair(
    memo: kopf.Memo, isvc: JsonObject, why: str, logger: kopf.Logger
) -> tuple[Result | None, st.Problem | None]:
    """Reconcile an InferenceService whose owned object was deleted or edited by hand.

    Not when a credential its pods would carry is no longer allowed: then the problem says why.
    """
    meta = isvc["metadata"]
    try:
        # A repair renders the current spec: the platform's policy holds here too, or deleting
        # an owned object would roll out what the reconcile handler refused.
        _, result = _reconcile_checked(
            memo, meta["name"], meta["namespace"], meta["uid"], isvc["spec"], isvc.get("status")
        )
    except policy.PolicyViolation as exc:
        logger.warning("not repaired (%s): %s", why, exc)
        return None, st.Problem(exc.reason, str(exc))
    except credentials.CredentialsRefused as exc:
        logger.warning("not repaired (%s): %s", why, exc.message)
        return None, st.Problem(exc.reason, exc.message)
    except (SpecError, ForeignObjectError, ApplyRefused) as exc:
        logger.info("not repaired (%s): %s", why, exc)  # the reconcile handler reports it
        return None, None
    for change in result.writes:
        _normal_event(isvc, Action.REPAIRED, f"{change.describe()}: {why}")
    logger.info("repair after %s: %s", why, ", ".join(c.describe() for c in result.writes) or "nothing to do")
    return result, None


@metrics.instrumented("owned_event")
async def owned_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """Repair an owned object that was deleted or edited; mirror a Deployment's rollout."""
    owner_ref = _controller_owner(body)
    if owner_ref is None:
        return
    # The service's pods (stable or canary arm), not its endpoint picker's: only they make its status.
    labels = body["metadata"].get("labels") or {}
    is_deployment = body.get("kind") in WORKLOAD_KINDS and labels.get("app.kubernetes.io/component") == COMPONENT
    why = f"{body.get('kind')} deleted" if event["type"] == "DELETED" else _suspect(body)
    if why is None and not is_deployment:
        return
    api: KubeApi = memo.api
    namespace = body["metadata"]["namespace"]
    ref = _isvc_ref(namespace, owner_ref["name"])
    try:
        isvc = await asyncio.to_thread(api.get, ref)
        if isvc is None or isvc["metadata"].get("uid") != owner_ref.get("uid"):
            return
        if isvc["metadata"].get("deletionTimestamp"):
            return
        refused: st.Problem | None = None
        if why is not None:
            await _await_repair_slot(memo, (namespace, owner_ref["name"]), logger)
            result, refused = await asyncio.to_thread(_repair, memo, isvc, why, logger)
            if result is not None and result.writes:
                _repair_times(memo, (namespace, owner_ref["name"])).append(time.monotonic())
        if not is_deployment:
            return
        # The workload named after the service (a canary's event too: status is the stable's).
        workload = Ref(body["apiVersion"], body["kind"], namespace, owner_ref["name"])

        def mirrored(fresh: JsonObject) -> JsonObject | None:
            status, generation = fresh.get("status") or {}, fresh["metadata"].get("generation")
            if refused is None and status.get("observedGeneration") != generation:
                # A reconcile of this generation is under way: its status write reads the
                # workload after this event (it waits for this write, or this for it).
                return None
            problem = refused or st.spec_problem(status, KEPT_PROBLEMS)
            state, pods = _observe(api, workload, status.get("selector"))
            return st.compute_status(
                status, state, generation, problem, pods=pods, serves_at_zero=_serves_at_zero(fresh)
            )

        previous, new_status = await asyncio.to_thread(_publish, memo, ref, mirrored)
        registry: scale_to_zero.Registry | None = memo.get("scale_to_zero")
        if _serves_at_zero(isvc) or (registry is not None and registry.knows(namespace, owner_ref["name"])):
            owner = memo.config.owner(owner_ref["name"], namespace, owner_ref["uid"], parse_spec(isvc["spec"]))
            await asyncio.to_thread(_follow_activator, memo, isvc, owner, new_status, logger)
    except (ApiException, urllib3.exceptions.HTTPError) as exc:
        logger.warning("owned %s event not handled: %s", body.get("kind"), exc)
        return
    except SpecError:
        return  # the reconcile handler reports it
    _announce_readiness(isvc, previous, new_status)
    _announce_pods(isvc, previous, new_status)


# One event handler per owned kind, selected by our managed-by label.
for _kind in KINDS:
    if _kind.owned and _kind.reconciled:
        kopf.on.event(
            group=_kind.group,
            version=_kind.version,
            plural=_kind.plural,
            labels={"app.kubernetes.io/managed-by": MANAGER},
            id=f"owned-{_kind.plural}",
        )(owned_event)


@kopf.on.event(
    POD.group,
    POD.version,
    POD.plural,
    labels={"app.kubernetes.io/managed-by": MANAGER, "app.kubernetes.io/component": COMPONENT},
    id="service-pods",
)
@metrics.instrumented("pod_event")
async def pod_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """Say within seconds what is wrong with a service's pods (status_pods), and clear it once
    they are well: a Deployment says only that replicas are unavailable, and ten minutes on."""
    meta = body["metadata"]
    name = (meta.get("labels") or {}).get(OWNER_LABEL)
    if not name:
        return
    troubled = event["type"] != "DELETED" and status_pods.pod_problem_of(dict(body), POD_ROLES) is not None
    api: KubeApi = memo.api
    ref = _isvc_ref(meta["namespace"], name)

    def compute(fresh: JsonObject) -> JsonObject | None:
        status, generation = fresh.get("status") or {}, fresh["metadata"].get("generation")
        degraded = st.find_condition(status.get("conditions"), st.DEGRADED) or {}
        shown = degraded.get("status") == "True" and degraded.get("reason") in status_pods.REASONS
        if not (troubled or shown) or fresh["metadata"].get("deletionTimestamp"):
            return None  # nothing to say and nothing to clear: one read, no write
        if status.get("observedGeneration") != generation:
            return None  # a reconcile of this generation is under way and reads the pods itself
        state, pods = _observe(api, _workload_ref(fresh), status.get("selector"))
        problem = st.spec_problem(status, KEPT_PROBLEMS)
        return st.compute_status(status, state, generation, problem, pods=pods, serves_at_zero=_serves_at_zero(fresh))

    try:
        previous, new_status = await asyncio.to_thread(_publish, memo, ref, compute)
        isvc = await asyncio.to_thread(api.get, ref) if new_status != previous else None
    except (ApiException, urllib3.exceptions.HTTPError) as exc:
        logger.warning("pod event not handled: %s", exc)
        return
    if isvc is not None:
        _announce_readiness(isvc, previous, new_status)
        _announce_pods(isvc, previous, new_status)


def _announce_readiness(isvc: JsonObject, previous: JsonObject | None, new: JsonObject) -> None:
    """An event when the service becomes ready, a warning when a ready one stops being so."""
    before, after = st.condition_status(previous, st.READY), st.condition_status(new, st.READY)
    if before == after or (after != "True" and before != "True"):
        return
    condition = st.find_condition(new["conditions"], st.READY)
    assert condition is not None
    if after == "True":
        _normal_event(isvc, Reason.READY, condition["message"])
    else:
        kopf.warn(_body(isvc), reason=condition["reason"], message=condition["message"])


def _announce_rollout(body: kopf.Body | JsonObject, before: RolloutState | None, after: RolloutState | None) -> None:
    """An event and a count when a reconcile starts a canary of a new revision."""
    if after is None or after.phase != Phase.PROGRESSING:
        return
    if before is not None and before.revision == after.revision and before.phase == Phase.PROGRESSING:
        return
    meta = body["metadata"]
    metrics.ROLLOUTS.labels(meta["namespace"], meta["name"], "started").inc()
    _normal_event(body, Reason.CANARY_STARTED, after.message)


# --- canary analysis ----------------------------------------------------------------------------

ROLLOUT_EVENTS = {
    Reason.CANARY_STEP: "stepped",
    Reason.CANARY_PROMOTED: "promoted",
    Reason.CANARY_ROLLED_BACK: "rolled_back",
}


def canary_strategy(spec: kopf.Spec, **_: Any) -> bool:
    return bool((spec.get("rollout") or {}).get("strategy") == RolloutStrategy.CANARY.value)


@kopf.daemon(
    GROUP,
    VERSION,
    PLURAL,
    id="canary",
    when=canary_strategy,
    cancellation_backoff=5,
    cancellation_timeout=10,
    backoff=15,
)
async def canary_analysis(
    stopped: kopf.DaemonStopped, body: kopf.Body, meta: kopf.Meta, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """Judge a progressing canary every analysis interval; step, promote or roll it back."""
    clients = PrometheusClients(memo.api, meta["namespace"])
    life = lifetimes.Lifetime(memo, meta["uid"])
    try:
        while life.alive(stopped):
            delay = await _analyse_once(memo, body, meta, logger, clients)
            await life.sleep(stopped, delay)
    finally:
        await clients.aclose()


async def _analyse_once(
    memo: kopf.Memo, body: kopf.Body, meta: kopf.Meta, logger: kopf.Logger, clients: PrometheusClients
) -> float:
    """One analysis tick; returns the seconds until the next."""
    try:
        spec = parse_spec(dict(body.get("spec") or {}))
    except SpecError:
        return 15.0  # the reconcile handler reports it
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
        ref = _isvc_ref(meta["namespace"], meta["name"])
        await asyncio.to_thread(memo.api.patch, ref, {"metadata": {"annotations": {COMMAND_ANNOTATION: None}}})
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
    memo: kopf.Memo, isvc: JsonObject, step: RolloutStep, check: Check | None, logger: kopf.Logger
) -> None:
    """Record the new rollout state, with the check behind it, then reconcile to it (the canary's
    replicas, the promotion or the rollback). Status first: the canary's deletion makes the
    repair path reconcile too, and it must read the new state, not bring the canary back."""
    meta = isvc["metadata"]
    ref = _isvc_ref(meta["namespace"], meta["name"])
    last_check = _check_status(check, step.verdict)
    rollout = {"rollout": {**step.state.to_status(), "lastCheck": last_check}}
    _publish(memo, ref, lambda fresh: rollout)
    status = {**(isvc.get("status") or {}), **rollout}
    try:
        _, result = _reconcile_checked(memo, meta["name"], meta["namespace"], meta["uid"], isvc["spec"], status)
    except (SpecError, ForeignObjectError, ApplyRefused, policy.PolicyViolation, credentials.CredentialsRefused) as exc:
        logger.warning("canary step not applied: %s", exc)  # the reconcile handler reports it
        return
    if result.rollout is not None:  # as reconcile left it (a promotion records the new stable manifest)
        settled = {"rollout": {**result.rollout.to_status(), "lastCheck": last_check}}
        _publish(memo, ref, lambda fresh: settled)
    for change in result.writes:
        _normal_event(isvc, change.action, change.describe())
    if (problem := _rollout_problem(step.state)) is not None:
        deployment_state = st.rollout(result.deployment)
        _publish(
            memo,
            ref,
            lambda fresh: st.compute_status(
                fresh.get("status"), deployment_state, fresh["metadata"].get("generation"), problem
            ),
        )
    if step.event is not None:
        reason, message = step.event
        metrics.ROLLOUTS.labels(meta["namespace"], meta["name"], ROLLOUT_EVENTS[reason]).inc()
        if reason == Reason.CANARY_ROLLED_BACK:
            kopf.warn(_body(isvc), reason=str(reason), message=message)
        else:
            _normal_event(isvc, reason, message)


def _check_status(check: Check | None, verdict: str) -> JsonObject:
    found: JsonObject = {"time": st.now_iso(), "verdict": verdict}
    if check is not None:
        for key, value in (
            ("latencyMs", check.latency_ms),
            ("errorRatio", check.error_ratio),
            ("requests", check.requests),
        ):
            if value is not None and math.isfinite(value):
                found[key] = round(value, 4)
    return found


# --- LoRA adapters ------------------------------------------------------------------------------

ADAPTER_STATUS_SECONDS = 5.0


def has_adapters(spec: kopf.Spec, **_: Any) -> bool:
    return bool(spec.get("adapters"))


@kopf.daemon(
    GROUP,
    VERSION,
    PLURAL,
    id="adapters",
    when=has_adapters,
    cancellation_backoff=5,
    cancellation_timeout=10,
    backoff=15,
)
async def adapters_status(
    stopped: kopf.DaemonStopped, body: kopf.Body, meta: kopf.Meta, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """Keep status.adapters and AdaptersReady up to date from the replicas' sidecars; clear
    both when the spec no longer has adapters (kopf then stops this daemon)."""
    ref = _isvc_ref(meta["namespace"], meta["name"])
    life = lifetimes.Lifetime(memo, meta["uid"])
    async with adapter_watch.client() as http:
        try:
            while life.alive(stopped):
                await _report_adapters(memo, body, ref, http)
                await life.sleep(stopped, ADAPTER_STATUS_SECONDS)
        finally:
            if not life.gone and not (body.get("spec") or {}).get("adapters"):
                await asyncio.to_thread(_publish, memo, ref, _without_adapter_status)


async def _report_adapters(memo: kopf.Memo, body: kopf.Body, ref: Ref, http: httpx.AsyncClient) -> None:
    try:
        spec = parse_spec(dict(body.get("spec") or {}))
    except SpecError:
        return  # the reconcile handler reports it
    if not spec.adapters:
        return
    owner = memo.config.owner(ref.name, ref.namespace, body["metadata"]["uid"], spec)
    found = await adapter_watch.answers(memo.api, http, owner)
    entries, ready, reason, message = adapter_status.summarize(spec, found)

    def compute(fresh: JsonObject) -> JsonObject:
        status = fresh.get("status") or {}
        generation = fresh["metadata"].get("generation")
        conditions = st.set_condition(
            status.get("conditions") or [], adapter_status.CONDITION, ready, reason, message, st.now_iso(), generation
        )
        return {"adapters": entries, "conditions": conditions}

    await asyncio.to_thread(_publish, memo, ref, compute)


def _without_adapter_status(fresh: JsonObject) -> JsonObject | None:
    status = fresh.get("status") or {}
    conditions = status.get("conditions") or []
    kept = [c for c in conditions if c.get("type") != adapter_status.CONDITION]
    if "adapters" not in status and len(kept) == len(conditions):
        return None
    return {"adapters": None, "conditions": kept}


@kopf.on.event(GROUP, VERSION, PLURAL, id="service-deleted")
async def service_deleted(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """End the daemons of a deleted InferenceService (no finalizer made kopf do it: lifetimes)
    and forget its status lock (one per service ever seen would otherwise stay). Async: it sets
    the daemons' asyncio.Event on their own loop."""
    if event["type"] == "DELETED":
        meta = body["metadata"]
        lifetimes.object_deleted(memo, meta["uid"])
        with _STATUS_LOCKS_GUARD:  # a write still holding it keeps its own reference
            (memo.get("status_locks") or {}).pop((meta["namespace"], meta["name"]), None)
        registry: scale_to_zero.Registry | None = memo.get("scale_to_zero")
        if registry is not None:
            registry.forget(meta["namespace"], meta["name"])


from .autoscaler import handlers as _autoscaler  # noqa: E402,F401

# Every daemon is registered by now (the autoscaler's just above): none needs a finalizer.
lifetimes.release_finalizers()
