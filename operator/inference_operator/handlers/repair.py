"""Owned objects' events: an object deleted or edited by hand is put back (at most a few writes
a minute per service), and the workload's rollout is mirrored in the service's status."""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass
from typing import Any, TypeGuard

import kopf
import urllib3
from kubernetes.client.exceptions import ApiException

from .. import credentials, metrics, ownership, policy, scale_to_zero
from ..builders.common import SPEC_HASH_ANNOTATION, STATUS_ROLES, Role, role_of
from ..jsontypes import JsonObject
from ..k8s import KubeApi, Ref
from ..kinds import INFERENCE_SERVICE, KINDS, WORKLOAD_KINDS
from ..models import SpecError, parse_spec
from ..reconcile import Action, ApplyRefused, ForeignObjectError, Result
from ..settings import MANAGER
from ..status import Problem
from .bookkeeping import SeenWorkloads
from .shared import (
    Workloads,
    announce_pods,
    announce_readiness,
    by_label,
    by_ref,
    follow_activator,
    isvc_ref,
    kept_problem,
    normal_event,
    publish,
    reconcile_checked,
    refresh_status,
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


@dataclass(frozen=True)
class OwnedEvent:
    """One owned object's event, placed: whose it is, what may need repair, whether to mirror."""

    body: kopf.Body
    owner_ref: JsonObject
    # Why it may need a repair (deleted, edited), or None.
    why: str | None
    role: Role | None

    @property
    def namespace(self) -> str:
        return str(self.body["metadata"]["namespace"])

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, str(self.owner_ref["name"])

    @property
    def mirrored(self) -> bool:
        """A workload whose rollout the status follows: one it counts, or a canary's (whose pods
        it covers), not the picker's."""
        return self.body.get("kind") in WORKLOAD_KINDS and self.role in MIRRORED_ROLES

    @property
    def own(self) -> bool:
        """One of the workloads the status counts (SeenWorkloads keeps their versions)."""
        return self.role in STATUS_ROLES


@metrics.instrumented("owned_event")
async def owned_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """Repair an owned object that was deleted or edited; mirror a workload's rollout."""
    owner_ref = _controller_owner(body)
    if owner_ref is None:
        return
    why = f"{body.get('kind')} deleted" if event["type"] == "DELETED" else _suspect(body)
    owned = OwnedEvent(body, owner_ref, why, role_of(dict(body), owner_ref["name"]))
    # Nothing to repair, and no workload of the status's at a version it has not yet seen (or
    # that the reconcile which applied it is about to read): no news, no read.
    versions: SeenWorkloads | None = memo.get("seen_workloads")
    if why is None and (
        not owned.mirrored or (owned.own and versions is not None and not versions.is_news(dict(body)))
    ):
        return
    try:
        isvc, refused = await repair(memo, owned, logger) if why is not None else (None, None)
        if why is not None and isvc is None:
            return  # not the live owner's
        if owned.mirrored:
            await mirror(memo, owned, isvc, refused, logger)
    except (ApiException, urllib3.exceptions.HTTPError) as exc:
        logger.warning("owned %s event not handled: %s", body.get("kind"), exc)
    except SpecError:
        return  # the reconcile handler reports it


async def repair(memo: kopf.Memo, owned: OwnedEvent, logger: kopf.Logger) -> tuple[JsonObject | None, Problem | None]:
    """Reconcile the owner of an object deleted or edited by hand, at most REPAIR_BURST writing
    repairs a window. Returns the owner as read (None: not the live owner, nothing done) and why
    a repair was refused."""
    assert owned.why is not None
    isvc = await asyncio.to_thread(memo.api.get, isvc_ref(*owned.key))
    if not _is_live_owner(isvc, owned.owner_ref):
        return None, None
    await _await_repair_slot(memo, owned.key, logger)
    result, refused = await asyncio.to_thread(_repair, memo, isvc, owned.why, logger)
    if result is not None and result.writes:
        _repair_times(memo, owned.key).append(time.monotonic())
    return isvc, refused


async def mirror(
    memo: kopf.Memo, owned: OwnedEvent, isvc: JsonObject | None, refused: Problem | None, logger: kopf.Logger
) -> None:
    """Write the status its workloads (found by label) and pods now make, and follow the
    activator; `isvc` is the repair's read, still current (a repair writes no status)."""
    api: KubeApi = memo.api
    body, owner_ref, namespace = owned.body, owned.owner_ref, owned.namespace
    listed = by_label(api, (body["apiVersion"], body["kind"]), namespace, owner_ref["name"], owner_ref["uid"])

    def workloads(fresh: JsonObject) -> Workloads:
        """The workloads the status counts: this event's own when it is one and the status lists
        no several (`status.roles`: one read, as many as the events at a restart), else those
        found by label (a canary's event: the status is the stable's)."""
        if owned.role in STATUS_ROLES and not (fresh.get("status") or {}).get("roles"):
            return by_ref(api, {owned.role: Ref(body["apiVersion"], body["kind"], namespace, body["metadata"]["name"])})
        return listed

    seen: list[JsonObject] = []  # the service as the status write read it, if still the owner

    def mirrored(fresh: JsonObject) -> JsonObject | None:
        if not _is_live_owner(fresh, owner_ref):
            return None
        seen[:] = [fresh]
        if refused is None and (fresh.get("status") or {}).get("observedGeneration") != fresh["metadata"].get(
            "generation"
        ):
            # A reconcile of this generation is under way: its status write reads the
            # workload after this event (it waits for this write, or this for it).
            return None
        return refresh_status(api, fresh, workloads(fresh), refused or kept_problem(fresh))

    def follow(status: JsonObject) -> None:
        """The activator's slice, from the status as it stands after this write (or as the
        write read it, while a reconcile is under way: its own write follows later)."""
        registry: scale_to_zero.Registry | None = memo.get("scale_to_zero")
        fresh = seen[0] if seen else None
        if fresh is None or not (serves_at_zero(fresh) or (registry is not None and registry.knows(*owned.key))):
            return
        owner = memo.config.owner(owner_ref["name"], namespace, owner_ref["uid"], parse_spec(fresh["spec"]))
        follow_activator(memo, fresh, owner, status, logger)

    previous, new_status = await asyncio.to_thread(publish, memo, isvc_ref(*owned.key), mirrored, isvc, follow)
    if not seen:
        return
    versions: SeenWorkloads | None = memo.get("seen_workloads")
    if owned.own and versions is not None:
        versions.saw(dict(body))
    announce_readiness(seen[0], previous, new_status)
    announce_pods(seen[0], previous, new_status)


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
