"""InferenceService (routing.httpRoute) → Gateway API HTTPRoute.

The route sends its Gateways' requests for its hostnames to the service: to the Service, or
to the InferencePool with `routing.inferencePool` (whose endpoint picker chooses the pod), or to
the router's Service NAME-router with `routing.router`.
While a canary runs behind a route, its backends become the two arms' Services, weighted
by the step's percentage (`weighted`): the split is exact per request, whatever the sizes
of the arms. With autoscaling.scaleToZero the route rewrites the Host to the Service's
in-cluster name, the one the activator answers for at zero. Only fields of the v1 (standard
channel) schema are set.
"""

from __future__ import annotations

import copy

from ..jsontypes import JsonObject
from ..kinds import HTTP_ROUTE, INFERENCE_POOL, SERVICE
from .activator import scales_to_zero
from .canary import CANARY, STABLE, arm_name
from .common import ROUTER_SUFFIX, Owner, object_meta, service_url
from .service import HTTP_PORT


def _service_backend(name: str, weight: int) -> JsonObject:
    return {"group": SERVICE.group, "kind": SERVICE.kind, "name": name, "port": HTTP_PORT, "weight": weight}


def build_http_route(owner: Owner) -> JsonObject:
    route = owner.spec.routing.http_route
    if route is None:
        raise ValueError("an HTTPRoute is built only for routing.httpRoute")
    parents: list[JsonObject] = []
    for parent in route.parent_refs:
        ref: JsonObject = {"group": HTTP_ROUTE.group, "kind": "Gateway", "name": parent.name}
        if parent.namespace:
            ref["namespace"] = parent.namespace
        if parent.section_name:
            ref["sectionName"] = parent.section_name
        parents.append(ref)
    if owner.spec.routing.inference_pool:
        backend: JsonObject = {"group": INFERENCE_POOL.group, "kind": INFERENCE_POOL.kind, "name": owner.name}
    elif owner.spec.routing.router is not None:
        backend = _service_backend(owner.name + ROUTER_SUFFIX, 1)  # the router picks the pod
    else:
        backend = _service_backend(owner.name, 1)
    rule: JsonObject = {"matches": [{"path": {"type": "PathPrefix", "value": "/"}}], "backendRefs": [backend]}
    if scales_to_zero(owner):
        # At zero the Service's endpoints are the activator's, which knows a service by its
        # in-cluster name: the route's public hostname would be a stranger to it.
        host = service_url(owner).removeprefix("http://")
        rule["filters"] = [{"type": "URLRewrite", "urlRewrite": {"hostname": host}}]
    spec: JsonObject = {"parentRefs": parents, "rules": [rule]}
    if route.hostnames:
        spec["hostnames"] = list(route.hostnames)
    return {**HTTP_ROUTE.header(), "metadata": object_meta(owner), "spec": spec}


def weighted(route: JsonObject, owner_name: str, canary_weight: int) -> JsonObject:
    """`route` split between the arms: NAME-canary gets `canary_weight` percent."""
    split = copy.deepcopy(route)
    split["spec"]["rules"][0]["backendRefs"] = [
        _service_backend(arm_name(owner_name, STABLE), 100 - canary_weight),
        _service_backend(arm_name(owner_name, CANARY), canary_weight),
    ]
    return split
