"""Scale to zero: the objects that put the activator in a service's path while it has no ready replica.

The activator (`python -m model_server activator`, installed by the chart) holds requests for a
service at zero, wakes it and answers them once a replica is Ready. It is in the path only while
the service has no ready replica, as Knative's is: kube-proxy routes every EndpointSlice labelled
`kubernetes.io/service-name: NAME`, not only the ones the EndpointSlice controller writes, so one
more slice, NAME-activator, with the activator pods' addresses sends NAME's traffic there, and
deleting it takes the activator out again. The activator reaches the pods through NAME-private
(the same pods, without that slice), and a ready answer through it means a Ready pod.

A slice names only its own namespace's Services, and the activator takes the hosts and the
upstream from those Service objects, never from this slice's annotation (which only tunes the
waiting, within the activator's own caps).

With routing.router the clients' Service is NAME-router (status.url), so the slice leads
NAME-router, and the activator's way on is NAME-router-private: the router's pods, not the
workers, so the held requests go through the router like every other. The router's pods go to
zero with the workers (builders/router.py) and come back with them; a router pod is Ready only
once its /readiness answers 200, which it does once it has discovered a healthy worker. So
kube-proxy sends NAME-router-private's traffic only to router pods that can place a request, and
the activator's poll of the router's /readiness through it answers 200 only then: a held request
is never released into the router's own 503 for want of a worker. The slice stays until the
router and the workers both have a ready replica (`ready_on_path`). The wake goes
to the InferenceService that owns NAME-router-private (the activator reads it from the owner
reference: the Service's name is NAME-router, not NAME).

A prefill/decode pair (disaggregation.scaleToZero) is at zero as the router is: the slice leads
NAME-router while either role is asked for zero or any of the three has no ready replica, and the
wake brings both roles back in one write (scale_to_zero.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from ..jsontypes import JsonObject
from ..kinds import ENDPOINT_SLICE, SERVICE
from ..models import NAME_MAX_LENGTH, InferenceServiceSpec, ScaleToZeroSpec, SpecError
from .common import ROUTER_SUFFIX, Owner, Role, object_meta, router_pod_labels, serving_labels
from .service import HTTP_PORT

# The EndpointSlice controller keeps slices with its own managed-by value; kube-proxy reads all.
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
MANAGED_BY = "activator.inference.rocm.dev"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
ROUTE_ANNOTATION = "inference.rocm.dev/activator"
# Written by the activator when a request waits at zero; the operator scales to one at once.
WAKE_ANNOTATION = "inference.rocm.dev/wake"
PRIVATE_SUFFIX = "-private"
SLICE_SUFFIX = "-activator"
# The pods' own ready paths (the model server's; the vLLM front answers the same one).
READY_PATH = "/health/ready"
# The router's: 200 once it has a healthy worker to send a request to, 503 before.
ROUTER_READY_PATH = "/readiness"


@dataclass(frozen=True)
class ActivatorEndpoints:
    """Where the activator pods listen: their ready addresses, the HTTP port and the gRPC port
    (0: the activator has none)."""

    addresses: tuple[str, ...]
    port: int
    grpc_port: int = 0

    @classmethod
    def from_slices(cls, slices: Sequence[JsonObject]) -> ActivatorEndpoints:
        """The ready (and not terminating) addresses of the activator Service's slices, and its
        ports named `http` and `grpc`."""
        addresses: set[str] = set()
        ports = {"http": 0, "grpc": 0}
        for item in slices:
            if item.get("addressType", "IPv4") != "IPv4":
                continue  # the slice it is copied into is IPv4
            for entry in item.get("ports") or []:
                if entry.get("name") in ports and entry.get("port"):
                    ports[entry["name"]] = int(entry["port"])
            for endpoint in item.get("endpoints") or []:
                conditions = endpoint.get("conditions") or {}
                if conditions.get("ready") is not False and not conditions.get("terminating"):
                    addresses.update(endpoint.get("addresses") or [])
        return cls(tuple(sorted(addresses)), ports["http"], ports["grpc"])

    @property
    def usable(self) -> bool:
        return bool(self.addresses) and self.port > 0


def ready_on_path(status: JsonObject) -> int | None:
    """The ready replicas a request on its way in can reach: the service's readyReplicas, or,
    for a service of several workloads (status.roles: the predictor and its router), the
    fewest any one of them has, since a request passes each."""
    roles = status.get("roles")
    if not roles:
        ready = status.get("readyReplicas")
        return None if ready is None else int(ready)
    return min(int(role.get("readyReplicas") or 0) for role in roles)


def scale_to_zero_of(spec: InferenceServiceSpec) -> ScaleToZeroSpec | None:
    """The service's scale to zero: autoscaling.scaleToZero, or the prefill/decode pair's
    (disaggregation.scaleToZero)."""
    if spec.disaggregation is not None:
        return spec.disaggregation.scale_to_zero
    return None if spec.autoscaling is None else spec.autoscaling.scale_to_zero


def scales_to_zero(owner: Owner) -> bool:
    return scale_to_zero_of(owner.spec) is not None


def asked_replicas(spec: InferenceServiceSpec) -> int:
    """The replicas the spec asks of the path's workloads: spec.replicas, or with
    spec.disaggregation the fewer of the two roles' (a request needs a pod of each)."""
    pd = spec.disaggregation
    return spec.replicas if pd is None else min(pd.prefill.replicas, pd.decode.replicas)


def routed(owner: Owner) -> bool:
    """Clients reach the service through its router (routing.router): NAME-router."""
    return owner.spec.routing.router is not None


def entry_service_name(owner: Owner) -> str:
    """The Service the service's clients call (status.url), which the slice leads while at
    zero: NAME, or NAME-router with routing.router."""
    return owner.name + ROUTER_SUFFIX if routed(owner) else owner.name


def private_service_name(name: str) -> str:
    return name + PRIVATE_SUFFIX


def slice_name(name: str) -> str:
    """The slice's own name: NAME-activator whichever Service it leads (its label says which),
    so turning the router on or off at zero moves the one slice rather than leave another."""
    return name + SLICE_SUFFIX


def check_names(name: str, router: bool = False) -> None:
    """The derived names must still be DNS labels: refuse a name too long for them."""
    entry = name + ROUTER_SUFFIX if router else name
    longest = NAME_MAX_LENGTH - max(len(entry) - len(name) + len(PRIVATE_SUFFIX), len(SLICE_SUFFIX))
    if len(name) > longest:
        raise SpecError(
            "metadata.name",
            f"{name!r} is longer than {longest} characters, which autoscaling.scaleToZero needs "
            f"(it names the Service {private_service_name(entry)!r})",
        )


def build_private_service(owner: Owner) -> JsonObject:
    """The activator's upstream, the entry Service's pods without the activator's slice:
    NAME-private, the model pods' http port (and grpc port, runtime.grpcPort); with
    routing.router NAME-router-private, the router pods' http port."""
    check_names(owner.name, routed(owner))
    ports: list[JsonObject] = [{"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"}]
    grpc_port = None if routed(owner) else owner.spec.runtime.grpc_port
    if grpc_port is not None:
        ports.append(
            {"name": "grpc", "port": grpc_port, "targetPort": "grpc", "protocol": "TCP", "appProtocol": "grpc"}
        )
    selector = router_pod_labels(owner.name) if routed(owner) else serving_labels(owner)
    return {
        **SERVICE.header(),
        "metadata": object_meta(owner, private_service_name(entry_service_name(owner)), role=Role.ACTIVATOR),
        "spec": {"type": "ClusterIP", "selector": selector, "ports": ports},
    }


def route_settings(owner: Owner, scale_to_zero: ScaleToZeroSpec) -> JsonObject:
    """What the activator may be told about waiting for this service (it clamps each value).
    Every engine's pods answer READY_PATH (vLLM's through its front); a router its own."""
    return {
        "maxWaitSeconds": scale_to_zero.max_wait_seconds,
        "maxHeld": scale_to_zero.max_held_requests,
        "readyPath": ROUTER_READY_PATH if routed(owner) else READY_PATH,
    }


def build_activator_slice(owner: Owner, activator: ActivatorEndpoints) -> JsonObject:
    """NAME-activator: the entry Service's traffic (NAME's, or NAME-router's) to the activator
    pods, on the Service's `http` port, and on its `grpc` port when the service has one
    (runtime.grpcPort, never with a router) and the activator listens for gRPC: kube-proxy
    pairs a slice's ports with the Service's by name."""
    zero = scale_to_zero_of(owner.spec)
    assert zero is not None
    check_names(owner.name, routed(owner))
    meta = object_meta(
        owner,
        slice_name(owner.name),
        {ROUTE_ANNOTATION: json.dumps(route_settings(owner, zero))},
        role=Role.ACTIVATOR,
    )
    entry = entry_service_name(owner)
    meta["labels"] = {**meta["labels"], SERVICE_NAME_LABEL: entry, MANAGED_BY_LABEL: MANAGED_BY}
    return {
        **ENDPOINT_SLICE.header(),
        "metadata": meta,
        "addressType": "IPv4",
        "endpoints": [
            {"addresses": [address], "conditions": {"ready": True, "serving": True, "terminating": False}}
            for address in activator.addresses
        ],
        "ports": [
            {"name": "http", "port": activator.port, "protocol": "TCP"},
            *(
                [{"name": "grpc", "port": activator.grpc_port, "protocol": "TCP", "appProtocol": "grpc"}]
                if owner.spec.runtime.grpc_port is not None and activator.grpc_port and not routed(owner)
                else []
            ),
        ],
    }


@dataclass(frozen=True)
class Wake:
    """A wake request read from the annotation: when the activator asked."""

    at: datetime | None

    @classmethod
    def of(cls, annotations: JsonObject | None) -> Wake:
        value = (annotations or {}).get(WAKE_ANNOTATION)
        try:
            return cls(datetime.fromisoformat(str(value).replace("Z", "+00:00")) if value else None)
        except ValueError:
            return cls(None)  # a hand-written value wakes nothing and breaks nothing
