"""Scale to zero at the edges: the activator's slice of each service, and the wake.

A service with `autoscaling.scaleToZero` has NAME-activator (builders/activator.py) exactly while
it is asked for zero replicas or has no ready replica, and the activator has a ready pod; it is
kept from three events: a reconcile, a change of the service's Deployment (its ready count), and a
change of the activator's own pods (their addresses, in every slice). Without the slice (no
activator installed, or none ready) a service at zero refuses connections, as any Service without
endpoints does.

Why here and not in reconcile's pipeline (stages/scale_to_zero.py, which adds NAME-private to the
desired set and decides what this slice should be): the slice follows the ready count and the
activator's addresses, which change without a change of the spec and so without a reconcile,
and it must follow them within the status write that reports the count (`handlers/shared.py:
follow_activator`, under the service's status lock), never a count read before a later write.
Its kind is therefore not reconciled (`Kind.reconciled`): the prune leaves it, and this module
deletes it.

The activator goes in the path with the scale-to-zero decision, not when the last replica stops
being ready (as Knative's activator does): in between, the last pod drains and then stops
listening, and the ready count reaches the status only after the Deployment controller and an
event, seconds later on a busy node. A request that came then was refused.

With routing.router the slice leads NAME-router (builders/activator.py), and the path is ready
only once both the workers and the router have a ready replica (`ready_on_path`): a worker
Ready before any router pod has found it leaves NAME-router without a ready endpoint.

The wake: the activator writes the `inference.rocm.dev/wake` annotation when a request waits; the
operator then sets one replica through the scale subresource at once, instead of at the
autoscaler's next tick; for a prefill/decode pair, one replica of each role in one merge patch
(`wake_patch`): a request needs both.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .builders.activator import ActivatorEndpoints, Wake, ready_on_path, scales_to_zero, slice_name
from .builders.common import Owner
from .builders.disaggregation import replicas_patch, role_replicas
from .jsontypes import JsonObject
from .k8s import KubeApi, Ref
from .kinds import ENDPOINT_SLICE, INFERENCE_SERVICE
from .models import InferenceServiceSpec
from .reconcile import Action, Change, owned_by
from .settings import SCALER_MANAGER
from .stages.scale_to_zero import activator_slice

__all__ = ["ready_on_path"]  # the path's ready count, which the handlers read from here


def sync_slice(
    api: KubeApi, owner: Owner, ready_replicas: int | None, activator: ActivatorEndpoints | None
) -> Change | None:
    """Apply or delete NAME-activator as `activator_slice` says; the write made, if any."""
    ref = Ref.to(ENDPOINT_SLICE, owner.namespace, slice_name(owner.name))
    live = api.get(ref)
    desired = activator_slice(owner, ready_replicas, activator)
    if desired is not None:
        if live is not None and _same(live, desired):
            return None
        api.apply(desired)
        return Change(Action.CREATED if live is None else Action.UPDATED, ENDPOINT_SLICE.kind, ref.name)
    if live is not None and owned_by(live, owner.uid) and api.delete(ref):
        return Change(Action.DELETED, ENDPOINT_SLICE.kind, ref.name)
    return None


def _same(live: JsonObject, desired: JsonObject) -> bool:
    def essence(obj: JsonObject) -> tuple[object, ...]:
        meta = obj.get("metadata") or {}
        return (obj.get("endpoints"), obj.get("ports"), meta.get("annotations"), meta.get("labels"))

    live_view = {**live, "metadata": {**live["metadata"], "annotations": _ours(live, desired, "annotations")}}
    live_view["metadata"]["labels"] = _ours(live, desired, "labels")
    return essence(live_view) == essence(desired)


def _ours(live: JsonObject, desired: JsonObject, key: str) -> JsonObject:
    """The live object's labels or annotations that the desired object sets (others are not ours)."""
    mine = desired["metadata"].get(key) or {}
    theirs = live["metadata"].get(key) or {}
    return {k: theirs[k] for k in mine if k in theirs}


def wake_replicas(owner: Owner, current_replicas: int, wake: Wake, zero_since: datetime | None) -> int | None:
    """The replicas a wake sets: one for a scale-to-zero service at zero asked after it got
    there, else None (nothing to write). The annotation stays on the object: one written before
    the last scale to zero is history, not a request waiting now. Both times are in whole
    seconds: a wake in the second of the decision counts (the activator is in the path from the
    decision on; taken for history, that request would wait for the activator's next wake, 30 s)."""
    if not scales_to_zero(owner) or current_replicas != 0 or wake.at is None:
        return None
    if zero_since is not None and wake.at < zero_since:
        return None
    return 1


def wake_patch(spec: InferenceServiceSpec, replicas: int) -> tuple[JsonObject, str | None]:
    """The write that wakes the service, and its subresource: spec.replicas through the scale
    subresource (as the autoscaler writes it); with spec.disaggregation, every role at zero set to
    `replicas` in one merge patch, so a held request wakes both roles of the pair at once."""
    if spec.disaggregation is None:
        return {"spec": {"replicas": replicas}}, "scale"
    return replicas_patch({role: replicas for role, n in role_replicas(spec).items() if n == 0}), None


def wake(api: KubeApi, namespace: str, name: str, spec: InferenceServiceSpec, replicas: int) -> None:
    """Write the woken replica count (`wake_patch`)."""
    patch, subresource = wake_patch(spec, replicas)
    api.patch(Ref.to(INFERENCE_SERVICE, namespace, name), patch, subresource, field_manager=SCALER_MANAGER)


@dataclass
class Registry:
    """What the handlers share: the activator's endpoints and the scale-to-zero services with
    their ready counts. kopf hands each object a shallow copy of the operator's memo, so the
    registry is made once at startup and is then the same object for every handler."""

    activator: ActivatorEndpoints | None = None
    services: dict[tuple[str, str], tuple[Owner, int | None]] = field(default_factory=dict)

    def remember(self, owner: Owner, ready_replicas: int | None) -> bool:
        """Record a service's state; whether to sync its slice (it scales to zero, or it did
        and its slice may still be there)."""
        key = (owner.namespace, owner.name)
        if scales_to_zero(owner):
            self.services[key] = (owner, ready_replicas)
            return True
        return self.services.pop(key, None) is not None

    def knows(self, namespace: str, name: str) -> bool:
        return (namespace, name) in self.services

    def resync(self, api: KubeApi, lock: Callable[[str, str], AbstractContextManager[Any]]) -> list[Change]:
        """Every known scale-to-zero service's slice against the activator's current endpoints,
        each under `lock(namespace, name)`, the service's status lock: its ready count read and
        its slice written between two status writes, never across one (a count read before a
        write, synced after that write's own sync, put the slice back as it was)."""
        changes = []
        for key in list(self.services):
            with lock(*key):
                known = self.services.get(key)
                if known is not None and (change := sync_slice(api, *known, self.activator)) is not None:
                    changes.append(change)
        return changes

    def forget(self, namespace: str, name: str) -> None:
        self.services.pop((namespace, name), None)
