"""The scale-to-zero stage: NAME-private, the activator's way to the pods, joins the desired set.

Scale to zero adds two objects. NAME-private (builders/activator.py) is a desired object like any
other: this stage puts it beside NAME's Service, and reconcile applies and prunes it. NAME-activator,
the EndpointSlice that puts the activator in NAME's path, is wanted only while the service has no
ready replica and the activator has a ready pod (`activator_slice`, decided here too): both change
between reconciles, with the Deployment's ready count and the activator's pods, so
scale_to_zero.py keeps that slice from those events rather than from the spec.
"""

from __future__ import annotations

from ..builders.activator import (
    ActivatorEndpoints,
    asked_replicas,
    build_activator_slice,
    build_private_service,
    scales_to_zero,
)
from ..builders.common import Owner
from ..jsontypes import JsonObject
from ..kinds import SERVICE, in_apply_order
from .base import Cluster, Context, Staged


def stage(cluster: Cluster, owner: Owner, objects: list[JsonObject], context: Context) -> Staged:
    """The stage: it reads nothing."""
    return Staged(with_private_service(owner, objects, context))


def with_private_service(owner: Owner, objects: list[JsonObject], context: Context) -> list[JsonObject]:
    """`objects` with NAME-private right after NAME's Service (the Service the activator holds
    requests for), when the service scales to zero."""
    if not scales_to_zero(owner):
        return objects
    private = context.mark(build_private_service(owner))
    index = next(
        (i for i, obj in enumerate(objects) if obj["kind"] == SERVICE.kind and obj["metadata"]["name"] == owner.name),
        None,
    )
    if index is None:
        return in_apply_order([*objects, private])
    return [*objects[: index + 1], private, *objects[index + 1 :]]


def activator_slice(
    owner: Owner, ready_replicas: int | None, activator: ActivatorEndpoints | None
) -> JsonObject | None:
    """NAME-activator as it should be now, or None: NAME's traffic goes to the activator while
    zero replicas are asked for or none is ready, and there is an activator to go to."""
    at_zero = asked_replicas(owner.spec) == 0 or not ready_replicas
    if not scales_to_zero(owner) or not at_zero or activator is None or not activator.usable:
        return None
    return build_activator_slice(owner, activator)
