"""kopf handlers: the I/O edge between the API server and the pure parts of the operator.

State lives in the objects (spec-hash annotations, status), never in this process, so any
replica of the operator can pick up where another stopped.
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn

import kopf
import urllib3
from kubernetes.client.exceptions import ApiException

from . import credentials, metrics, peering
from . import status as st
from .builders import selector_string, service_url
from .builders.common import MANAGER, Owner
from .k8s import KubeApi, Ref, load_api_client
from .models import API_VERSION, GROUP, KIND, PLURAL, VERSION, SpecError, parse_spec
from .reconcile import ForeignObjectError, reconcile

# Problems a Deployment event cannot clear (a spec change, or for a refused credential the next
# re-check, can): Deployment events keep them.
SPEC_PROBLEMS = ("InvalidSpec", "ResourceConflict", "ApplyFailed", *credentials.REFUSALS)


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
    # HA: a priority of this replica's own and the keep-alive lifetime (see peering.py).
    peering.apply_peering_env(settings)
    # A malformed Prometheus allow-list stops the operator here, not on every reconcile.
    credentials.CredentialPolicy.from_env()
    if getattr(memo, "api", None) is None:
        memo.api = KubeApi(load_api_client())


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The same sources as the kubernetes client: in-cluster account, else KUBECONFIG."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


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


def _normal_event(body: kopf.Body | dict, reason: str, message: str) -> None:
    """A Normal event; kopf.info would obey posting.level, which keeps log lines out."""
    kopf.event(body, type="Normal", reason=reason, message=message)


def _publish(api: KubeApi, body: kopf.Body | dict, new_status: dict) -> dict:
    """Write only the status keys that changed; an unchanged status costs no write."""
    meta = body["metadata"]
    changes = st.status_changes(body.get("status"), new_status)
    if changes:
        api.patch_status(Ref(API_VERSION, KIND, meta["namespace"], meta["name"]), changes)
    return changes


def _spec_problem(status: dict | None) -> st.Problem | None:
    for condition in (status or {}).get("conditions") or []:
        if condition.get("type") == st.DEGRADED and condition.get("status") == "True":
            if condition.get("reason") in SPEC_PROBLEMS:
                return st.Problem(condition["reason"], condition.get("message", ""))
    return None


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
@metrics.instrumented("reconcile")
def reconcile_service(
    body: kopf.Body, meta: kopf.Meta, spec: kopf.Spec, memo: kopf.Memo, logger: logging.Logger, retry: int = 0, **_: Any
) -> None:
    try:
        _reconcile_service(memo.api, body, meta, spec, logger)
    except (ApiException, urllib3.exceptions.HTTPError) as exc:
        raise _temporary(exc, retry) from exc


def _reconcile_service(api: KubeApi, body: kopf.Body, meta: kopf.Meta, spec: kopf.Spec, logger: logging.Logger) -> None:
    name, namespace, generation = meta["name"], meta["namespace"], meta.get("generation")
    problem: st.Problem | None = None
    recheck: float | None = None
    try:
        parsed = parse_spec(dict(spec))
        result = reconcile(api, name, namespace, meta["uid"], parsed)
    except credentials.CredentialsRefused as exc:
        # Cleared by labelling a Secret or configuring the operator, not only by a spec change.
        problem, recheck = st.Problem(exc.reason, exc.message), credentials.RECHECK_SECONDS
    except SpecError as exc:
        problem = st.Problem("InvalidSpec", str(exc))
    except ForeignObjectError as exc:
        problem = st.Problem("ResourceConflict", str(exc))
    except ApiException as exc:
        if exc.status not in (400, 422):
            raise
        problem = st.Problem("ApplyFailed", f"API rejected an owned object: {exc.body or exc.reason}")
    if problem is not None:
        _give_up(api, body, generation, problem, logger, recheck)

    for change in result.writes:
        _normal_event(body, change.action.value, change.describe())
    owner = Owner(name=name, namespace=namespace, uid=meta["uid"], spec=parsed)
    new_status = st.compute_status(body.get("status"), result.deployment, generation, result.problem) | {
        "observedGeneration": generation,
        "url": service_url(owner),
        "selector": selector_string(owner),
    }
    changed = _publish(api, body, new_status)
    logger.info(
        "reconciled generation %s: %d writes (%s), status keys changed: %s",
        generation,
        len(result.writes),
        ", ".join(c.describe() for c in result.writes) or "none",
        ", ".join(sorted(changed)) or "none",
    )
    if result.problem is not None:
        # Fixed outside the spec (e.g. by labelling a Secret): look again after a while.
        kopf.warn(body, reason=result.problem.reason, message=result.problem.message)
        raise kopf.TemporaryError(result.problem.message, delay=credentials.RECHECK_SECONDS)


def _give_up(
    api: KubeApi,
    body: kopf.Body,
    generation: int | None,
    problem: st.Problem,
    logger: logging.Logger,
    recheck: float | None = None,
) -> NoReturn:
    """Record a problem only a spec change can fix, then stop retrying until that change (or,
    with `recheck`, look again after that many seconds)."""
    status = st.compute_status(body.get("status"), None, generation, problem)
    try:
        _publish(api, body, status | {"observedGeneration": generation})
    except ApiException as exc:
        if exc.status not in (400, 422):
            raise  # transient: retry the whole handler, which records it next time
        logger.warning("could not record %s in status: %s", problem.reason, exc.reason)
    kopf.warn(body, reason=problem.reason, message=problem.message)
    if recheck is not None:
        raise kopf.TemporaryError(problem.message, delay=recheck)
    raise kopf.PermanentError(problem.message)


def _controller_owner(body: kopf.Body) -> dict | None:
    for ref in body["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == KIND and ref.get("apiVersion") == API_VERSION and ref.get("controller"):
            return ref
    return None


@kopf.on.event("apps", "v1", "deployments", labels={"app.kubernetes.io/managed-by": MANAGER})
@metrics.instrumented("deployment_event")
def deployment_event(
    event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, retry: int = 0, **_: Any
) -> None:
    """Mirror the Deployment's rollout into its InferenceService; recreate it if deleted."""
    owner_ref = _controller_owner(body)
    if owner_ref is None:
        return
    api: KubeApi = memo.api
    namespace = body["metadata"]["namespace"]
    try:
        isvc = api.get(Ref(API_VERSION, KIND, namespace, owner_ref["name"]))
        if isvc is None or isvc["metadata"].get("uid") != owner_ref.get("uid"):
            return
        if isvc["metadata"].get("deletionTimestamp"):
            return
        deployment: dict | None = dict(body)
        previous = isvc.get("status")
        problem = _spec_problem(previous)
        if event["type"] == "DELETED":
            deployment, refused = _restore(api, isvc, logger)
            problem = refused or problem
        new_status = st.compute_status(previous, deployment, isvc["metadata"].get("generation"), problem)
        _publish(api, isvc, new_status)
    except (ApiException, urllib3.exceptions.HTTPError) as exc:
        raise _temporary(exc, retry) from exc
    _announce_readiness(isvc, previous, new_status)


def _restore(api: KubeApi, isvc: dict, logger: logging.Logger) -> tuple[dict | None, st.Problem | None]:
    """Someone deleted our Deployment while its InferenceService lives: put it back, unless a
    credential it would carry is no longer allowed (then the problem says why)."""
    try:
        parsed = parse_spec(isvc.get("spec") or {})
    except SpecError:
        return None, None
    meta = isvc["metadata"]
    try:
        result = reconcile(api, meta["name"], meta["namespace"], meta["uid"], parsed)
    except credentials.CredentialsRefused as exc:
        logger.warning("not restored: %s", exc.message)
        return None, st.Problem(exc.reason, exc.message)
    for change in result.writes:
        _normal_event(isvc, change.action.value, change.describe() + " (was deleted)")
    logger.info("restored %s", ", ".join(c.describe() for c in result.writes) or "nothing")
    return result.deployment, None


def _ready(status: dict | None) -> str | None:
    for condition in (status or {}).get("conditions") or []:
        if condition.get("type") == st.READY:
            return condition.get("status")
    return None


def _announce_readiness(isvc: dict, previous: dict | None, new: dict) -> None:
    """An event when the service becomes ready, a warning when a ready one stops being so."""
    before, after = _ready(previous), _ready(new)
    if before == after or (after != "True" and before != "True"):
        return
    condition = next(c for c in new["conditions"] if c["type"] == st.READY)
    if after == "True":
        _normal_event(isvc, "Ready", condition["message"])
    else:
        kopf.warn(isvc, reason=condition["reason"], message=condition["message"])


from .autoscaler import handlers as _autoscaler  # noqa: E402,F401
