"""Owned objects' events: an object deleted or edited by hand is put back (at most a few writes
a minute per service), and the workload's rollout is mirrored in the service's status."""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any, TypeGuard

import kopf
import urllib3
from kubernetes.client.exceptions import ApiException

from .. import credentials, metrics, ownership, policy, scale_to_zero
from ..builders.common import SPEC_HASH_ANNOTATION, STATUS_ROLES, Role, role_of
from ..jsontypes import JsonObject
from ..k8s import KubeApi
from ..kinds import INFERENCE_SERVICE, KINDS, WORKLOAD_KINDS
from ..models import SpecError, parse_spec
from ..reconcile import Action, ApplyRefused, ForeignObjectError, Result
from ..settings import MANAGER
from ..status import Problem, compute_status, spec_problem
from .bookkeeping import SeenWorkloads
from .shared import (
    KEPT_PROBLEMS,
    announce_pods,
    announce_readiness,
    by_label,
    follow_activator,
    isvc_ref,
    normal_event,
    observe,
    publish,
    reconcile_checked,
    serves_at_zero,
)

# At most this many drift repairs of one InferenceService's objects per window; more wait,
# so a fight with another controller costs a few writes a minute, not a write storm.
REPAIR_BURST = 3
# The workloads whose events the status follows.
MIRRORED_ROLES = STATUS_ROLES | {Role.CANARY}
REPAIR_WINDOW_SECONDS = 30.0


def _controller_owner(body: kopf.Body) -> JsonObject | None:
    refs: list[JsonObject] = body["metadata"].get("ownerReferences") or []
    return next(
        (
            r
            for r in refs
            if r.get("kind") == INFERENCE_SERVICE.kind
            and r.get("apiVersion") == INFERENCE_SERVICE.api_version
            and r.get("controller")
        ),
        None,
    )


def _suspect(body: kopf.Body) -> str | None:
    """Why an owned object may have drifted, judged from the object alone (no API call)."""
    if SPEC_HASH_ANNOTATION not in (body["metadata"].get("annotations") or {}):
        return "annotations edited"
    managers = ownership.foreign_spec_managers(dict(body), MANAGER)
    return "fields changed by " + ", ".join(managers) if managers else None


RepairTimes = collections.defaultdict[tuple[str, str], collections.deque[float]]


def _repair_times(memo: kopf.Memo, key: tuple[str, str]) -> collections.deque[float]:
    """When this InferenceService's recent repairs wrote something (only those count), whichever
    owned object's event asked: `memo.repair_times` is made at startup, for every object's copy."""
    repairs: RepairTimes = memo.repair_times
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


def _repair(memo: kopf.Memo, isvc: JsonObject, why: str, logger: kopf.Logger) -> tuple[Result | None, Problem | None]:
    """Reconcile an InferenceService whose owned object was deleted or edited by hand.

    Not when a credential its pods would carry is no longer allowed: then the problem says why.
    """
    try:
        # A repair renders the current spec: the platform's policy holds here too, or deleting
        # an owned object would roll out what the reconcile handler refused.
        _, result = reconcile_checked(memo, isvc)
    except policy.PolicyViolation as exc:
        logger.warning("not repaired (%s): %s", why, exc)
        return None, Problem(exc.reason, str(exc))
    except credentials.CredentialsRefused as exc:
        logger.warning("not repaired (%s): %s", why, exc.message)
        return None, Problem(exc.reason, exc.message)
    except (SpecError, ForeignObjectError, ApplyRefused) as exc:
        logger.info("not repaired (%s): %s", why, exc)  # the reconcile handler reports it
        return None, None
    for change in result.writes:
        normal_event(isvc, Action.REPAIRED, f"{change.describe()}: {why}")
    logger.info("repair after %s: %s", why, ", ".join(c.describe() for c in result.writes) or "nothing to do")
    return result, None


def _is_live_owner(isvc: JsonObject | None, owner_ref: JsonObject) -> TypeGuard[JsonObject]:
    """The InferenceService the owner reference names (not one deleted and made again under
    its name), and not being deleted."""
    meta = (isvc or {}).get("metadata") or {}
    return bool(meta) and meta.get("uid") == owner_ref.get("uid") and not meta.get("deletionTimestamp")


@metrics.instrumented("owned_event")
async def owned_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """Repair an owned object that was deleted or edited; mirror a Deployment's rollout."""
    owner_ref = _controller_owner(body)
    if owner_ref is None:
        return
    # The workloads its status counts, or a canary's (whose pods it covers): not the picker's.
    role = role_of(dict(body), owner_ref["name"])
    is_deployment = body.get("kind") in WORKLOAD_KINDS and role in MIRRORED_ROLES
    why = f"{body.get('kind')} deleted" if event["type"] == "DELETED" else _suspect(body)
    if why is None and not is_deployment:
        return
    # The service's own workload at a version its status already has, or that the reconcile
    # which applied it is about to read: no news, no read.
    own = role in STATUS_ROLES
    versions: SeenWorkloads | None = memo.get("seen_workloads")
    if why is None and own and versions is not None and not versions.is_news(dict(body)):
        return
    api: KubeApi = memo.api
    namespace = body["metadata"]["namespace"]
    ref = isvc_ref(namespace, owner_ref["name"])
    try:
        isvc: JsonObject | None = None
        refused: Problem | None = None
        if why is not None:
            isvc = await asyncio.to_thread(api.get, ref)
            if not _is_live_owner(isvc, owner_ref):
                return
            await _await_repair_slot(memo, (namespace, owner_ref["name"]), logger)
            result, refused = await asyncio.to_thread(_repair, memo, isvc, why, logger)
            if result is not None and result.writes:
                _repair_times(memo, (namespace, owner_ref["name"])).append(time.monotonic())
        if not is_deployment:
            return
        # The workloads the status counts, by label (a canary's event too: status is the stable's).
        workloads = by_label(api, (body["apiVersion"], body["kind"]), namespace, owner_ref["name"], owner_ref["uid"])
        seen: list[JsonObject] = []  # the service as the status write read it, if still the owner

        def mirrored(fresh: JsonObject) -> JsonObject | None:
            if not _is_live_owner(fresh, owner_ref):
                return None
            seen[:] = [fresh]
            status, generation = fresh.get("status") or {}, fresh["metadata"].get("generation")
            if refused is None and status.get("observedGeneration") != generation:
                # A reconcile of this generation is under way: its status write reads the
                # workload after this event (it waits for this write, or this for it).
                return None
            problem = refused or spec_problem(status, KEPT_PROBLEMS)
            state, pods = observe(api, workloads, namespace, status.get("selector"))
            return compute_status(status, state, generation, problem, pods=pods, serves_at_zero=serves_at_zero(fresh))

        key = (namespace, owner_ref["name"])

        def follow(status: JsonObject) -> None:
            """The activator's slice, from the status as it stands after this write (or as the
            write read it, while a reconcile is under way: its own write follows later)."""
            registry: scale_to_zero.Registry | None = memo.get("scale_to_zero")
            fresh = seen[0] if seen else None
            if fresh is None or not (serves_at_zero(fresh) or (registry is not None and registry.knows(*key))):
                return
            owner = memo.config.owner(owner_ref["name"], namespace, owner_ref["uid"], parse_spec(fresh["spec"]))
            follow_activator(memo, fresh, owner, status, logger)

        # The repair's read is still current (a repair writes no status); a mirror reads it here.
        previous, new_status = await asyncio.to_thread(publish, memo, ref, mirrored, isvc, follow)
        if not seen:
            return
        isvc = seen[0]
        if own and versions is not None:
            versions.saw(dict(body))
    except (ApiException, urllib3.exceptions.HTTPError) as exc:
        logger.warning("owned %s event not handled: %s", body.get("kind"), exc)
        return
    except SpecError:
        return  # the reconcile handler reports it
    announce_readiness(isvc, previous, new_status)
    announce_pods(isvc, previous, new_status)


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
