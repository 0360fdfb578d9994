"""The canary stage: the desired set with the Deployments a canary rollout asks for.

The stable Deployment keeps the revision it runs until the candidate is promoted, the candidate
runs beside it as NAME-canary while it is judged, and behind a route that can address each arm
alone, the arms' Services NAME-stable and NAME-canary join the set and the route is weighted
between them (builders/canary.py, builders/http_route.py make those objects; rollout.py decides
where the rollout stands). The one read is the stable Deployment as it runs, at the stage's edge
(`stage`); the rest are transforms of the set.
"""

from __future__ import annotations

import dataclasses

from ..builders.canary import CANARY, STABLE, TRACK_LABEL, arm_service, arm_services_fit, canary_deployment
from ..builders.common import Owner, Role, role_of
from ..builders.http_route import weighted
from ..jsontypes import JsonObject
from ..kinds import DEPLOYMENT, HTTP_ROUTE, SERVICE, in_apply_order
from ..models import CanarySpec, RolloutStrategy
from ..rollout import (
    arms,
    canary_replicas,
    kept_stable,
    live_revision,
    manifest_digest,
    unverified,
)
from .base import Cluster, Context, Staged, unhashed


def is_predictor_deployment(obj: JsonObject, name: str) -> bool:
    """The service's own Deployment, the one a canary rollout revises (not its picker's)."""
    return bool(obj["kind"] == DEPLOYMENT.kind and role_of(obj, name) == Role.PREDICTOR)


def canary_spec(owner: Owner) -> CanarySpec | None:
    """The canary the spec asks for (None: the Deployment rolls the usual way)."""
    rollout = owner.spec.rollout
    return rollout.canary if rollout.strategy == RolloutStrategy.CANARY else None


def stage(cluster: Cluster, owner: Owner, objects: list[JsonObject], context: Context) -> Staged:
    """The stage: the live stable Deployment read (only with a canary strategy), then `with_arms`."""
    index = next((i for i, obj in enumerate(objects) if is_predictor_deployment(obj, owner.name)), None)
    if index is None:
        return Staged(objects)
    live = cluster.live(objects[index]) if canary_spec(owner) is not None else None
    return with_arms(cluster, owner, objects, index, live, context)


def with_arms(
    cluster: Cluster, owner: Owner, objects: list[JsonObject], index: int, live: JsonObject | None, context: Context
) -> Staged:
    """`objects` with the arms the rollout asks for, given the predictor's Deployment at `index`
    and `live`, the stable one as it runs; and where the rollout stands (None without a canary)."""
    desired = objects[index]
    canary = canary_spec(owner)
    desired_revision = live_revision(desired) or ""
    plan = arms(canary, desired_revision, live_revision(live), context.rollout, context.now, manifest_digest(desired))
    wanted = list(objects)
    if not plan.stable_follows_spec:
        kept = kept_stable(live, desired, plan.state.stable_digest) if live is not None else None
        if kept is None:
            plan = unverified(desired_revision, manifest_digest(desired))
        else:
            wanted[index] = context.mark(kept)
    weight = plan.canary_weight
    if weight is None:
        return Staged(wanted, plan.state if canary is not None else None)
    # The spec's count where it sets one, else the HPA's or KEDA's on the live Deployment.
    stable_replicas = int(desired["spec"].get("replicas") or (live or {}).get("spec", {}).get("replicas") or 1)
    by_route = route_can_split(cluster, owner, wanted, wanted[index])
    replicas = canary_replicas(stable_replicas, weight, exact_split=by_route)
    wanted.append(context.mark(canary_deployment(unhashed(desired), replicas)))
    if by_route:
        wanted = split_by_route(wanted, owner.name, weight, context)
    traffic = "httpRoute" if by_route else "replicas"
    return Staged(in_apply_order(wanted), dataclasses.replace(plan.state, traffic=traffic))


def route_can_split(cluster: Cluster, owner: Owner, objects: list[JsonObject], stable: JsonObject) -> bool:
    """Whether the route's weights can split this canary: a served HTTPRoute to Services (not
    a pool), and stable pods a Service can select alone (a stable Deployment from before the
    route has no `track: stable`: its canary is split by replicas, the next one by weights)."""
    route = next((obj for obj in objects if obj["kind"] == HTTP_ROUTE.kind), None)
    labels = stable["spec"]["template"]["metadata"].get("labels") or {}
    return (
        route is not None
        and not owner.spec.routing.inference_pool
        and labels.get(TRACK_LABEL) == STABLE
        and arm_services_fit(owner.name)
        and cluster.serves(HTTP_ROUTE)
    )


def split_by_route(objects: list[JsonObject], name: str, weight: int, context: Context) -> list[JsonObject]:
    """`objects` with NAME-stable and NAME-canary Services and the route weighted between them."""
    split = []
    for obj in objects:
        if obj["kind"] == HTTP_ROUTE.kind:
            split.append(context.mark(weighted(unhashed(obj), name, weight)))
            continue
        split.append(obj)
        if obj["kind"] == SERVICE.kind and obj["metadata"]["name"] == name:
            split += [context.mark(arm_service(unhashed(obj), track)) for track in (STABLE, CANARY)]
    return split
