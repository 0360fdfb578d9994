"""The objects a canary adds beside the stable ones: the candidate's Deployment, and the
Services that address each arm alone (for an HTTPRoute's weights).

The stable Deployment's selector cannot change, so the arms differ by a pod label: the
candidate's pods are `track: canary`; with `routing.httpRoute`, the stable pods are
`track: stable`, so that a Service can select them without the candidate's.
"""

from __future__ import annotations

import copy

from ..jsontypes import JsonObject
from ..models import NAME_MAX_LENGTH, RolloutStrategy
from .common import ROLE_LABEL, Owner, Role

TRACK_LABEL = "inference.rocm.dev/track"
CANARY = "canary"
STABLE = "stable"


def arm_name(owner_name: str, track: str) -> str:
    return f"{owner_name}-{track}"


def labels_stable_pods(owner: Owner) -> bool:
    """Whether the stable pods carry `track: stable`: only where a route splits by weights,
    so that other services' pods keep their template (a new label would roll them)."""
    return owner.spec.rollout.strategy == RolloutStrategy.CANARY and owner.spec.routing.http_route is not None


def arm_services_fit(owner_name: str) -> bool:
    """Service names are DNS labels: NAME-stable must fit in 63 characters."""
    return len(arm_name(owner_name, STABLE)) <= NAME_MAX_LENGTH


def canary_deployment(desired: JsonObject, replicas: int) -> JsonObject:
    """The candidate revision beside the stable Deployment: NAME-canary, its pods labelled
    `track: canary` (the Service selects both arms; the stable Deployment's selector is kept)."""
    canary = copy.deepcopy(desired)
    meta = canary["metadata"]
    meta["name"] = arm_name(meta["name"], CANARY)
    meta["labels"] = {**meta["labels"], ROLE_LABEL: str(Role.CANARY)}
    canary["spec"]["selector"]["matchLabels"][TRACK_LABEL] = CANARY
    canary["spec"]["template"]["metadata"]["labels"][TRACK_LABEL] = CANARY
    canary["spec"]["replicas"] = replicas
    return canary


def arm_service(service: JsonObject, track: str) -> JsonObject:
    """The service's Service narrowed to one arm's pods: NAME-stable or NAME-canary."""
    arm = copy.deepcopy(service)
    arm["metadata"]["name"] = arm_name(arm["metadata"]["name"], track)
    arm["metadata"]["labels"] = {**arm["metadata"]["labels"], ROLE_LABEL: str(Role.CANARY)}
    arm["spec"]["selector"][TRACK_LABEL] = track
    return arm
