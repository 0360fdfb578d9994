"""Pure functions from an InferenceService to the Kubernetes objects that realise it."""

from __future__ import annotations

from ..jsontypes import JsonObject
from ..kinds import OWNED_KINDS
from ..models import AutoscalingMode
from .adapters import build_adapters_config_map, lora_enabled
from .common import Owner, multi_node, selector_string, service_url
from .deployment import build_deployment, desired_replicas
from .disaggregation import build_disaggregation, disaggregated
from .endpoint_picker import build_endpoint_picker, deploys_endpoint_picker
from .gpu import build_resource_claim_template, needs_claim_template
from .hpa import build_hpa
from .http_route import build_http_route
from .inference_pool import build_inference_pool
from .keda import build_scaled_object, build_trigger_authentication
from .leader_worker_set import build_leader_worker_set
from .network_policy import build_network_policy, needs_network_policy
from .pdb import build_pdb, needs_pdb
from .router import build_router, deploys_router
from .service import build_service


def _predictor(owner: Owner) -> list[JsonObject]:
    """NAME's workload and what serves, guards and scales it."""
    objects = []
    if needs_claim_template(owner):
        objects.append(build_resource_claim_template(owner))  # before the pods that reference it
    if lora_enabled(owner.spec):
        objects.append(build_adapters_config_map(owner))  # before the pods that mount it
    if needs_network_policy(owner):
        objects.append(build_network_policy(owner))  # before the pods it lets in
    workload = build_leader_worker_set(owner) if multi_node(owner.spec) else build_deployment(owner)
    objects += [workload, build_service(owner)]
    if needs_pdb(owner):
        objects.append(build_pdb(owner))
    scaling = owner.spec.autoscaling
    if scaling is not None and scaling.mode == AutoscalingMode.HPA:
        objects.append(build_hpa(owner))
    elif scaling is not None and scaling.mode == AutoscalingMode.KEDA:
        if auth := build_trigger_authentication(owner):
            objects.append(auth)  # before the ScaledObject that refers to it
        objects.append(build_scaled_object(owner))
    return objects


def build_all(owner: Owner) -> list[JsonObject]:
    """Every object the spec asks for, in apply order; the stages (`stages/`) add what a
    feature derives from them (scale to zero's private Service, a canary's arms)."""
    if disaggregated(owner):  # the prefill and decode roles instead of NAME
        objects = [build_network_policy(owner)] if needs_network_policy(owner) else []
        objects += build_disaggregation(owner)
    else:
        objects = _predictor(owner)
    if owner.spec.routing.inference_pool:
        if deploys_endpoint_picker(owner):
            objects += build_endpoint_picker(owner)
        objects.append(build_inference_pool(owner))
    if deploys_router(owner):
        objects += build_router(owner)  # after the Service of the pods it routes to
    if owner.spec.routing.http_route is not None:
        objects.append(build_http_route(owner))  # after the Service or pool it routes to
    return objects


__all__ = [
    "OWNED_KINDS",
    "Owner",
    "build_all",
    "build_deployment",
    "build_endpoint_picker",
    "build_hpa",
    "build_http_route",
    "build_inference_pool",
    "build_leader_worker_set",
    "build_network_policy",
    "build_pdb",
    "build_resource_claim_template",
    "build_router",
    "build_scaled_object",
    "build_service",
    "desired_replicas",
    "needs_pdb",
    "selector_string",
    "service_url",
]
