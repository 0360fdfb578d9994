"""Routing to the pods: an InferencePool and its endpoint picker, the vLLM router, an HTTPRoute."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from .base import SpecModel, cel, cel_rules
from .names import HOSTNAME_PATTERN, DnsLabel, DnsSubdomain, Quantity


class ScorerWeights(SpecModel):
    """Weights of the endpoint picker's scorers: each pod's score is their weighted sum, and the
    highest wins. 0 leaves a scorer out. The defaults are the Inference Extension's own (queue 2,
    KV cache 2, prefix cache 3) plus LoRA affinity 1."""

    prefix_cache: int = Field(
        3, ge=0, le=100, description="prefix-cache-scorer: prefer the pod that served the longest prefix of the prompt."
    )
    queue: int = Field(2, ge=0, le=100, description="queue-scorer: prefer the pod with fewer waiting requests.")
    kv_cache_utilization: int = Field(
        2, ge=0, le=100, description="kv-cache-utilization-scorer: prefer the pod with more free KV cache."
    )
    lora_affinity: int = Field(
        1, ge=0, le=100, description="lora-affinity-scorer: prefer a pod that has the request's LoRA adapter loaded."
    )


class EndpointPickerSpec(SpecModel):
    """The endpoint picker (EPP) that routes the pool's requests: deployed by the operator as
    NAME-epp, or one installed separately (`name`)."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "!has(self.name) || !has(self.weights)",
                "routing.endpointPicker.weights configure the picker the operator deploys, not an external one (name)",
                ".weights",
            ),
            cel(
                "has(self.name) || !has(self.port) || self.port != 9090",
                "routing.endpointPicker.port 9090 is the deployed picker's metrics port",
                ".port",
            ),
        )
    )

    name: DnsLabel | None = Field(
        None,
        description="Service of an endpoint picker installed separately; unset, the operator deploys one as NAME-epp.",
    )
    port: int = Field(9002, ge=1, le=65535, description="Service port of the endpoint picker's ext-proc.")
    failure_mode: Literal["FailOpen", "FailClose"] = Field(
        "FailClose", description="What the gateway does when the picker does not answer."
    )
    weights: ScorerWeights | None = Field(
        None, description="Scorer weights of the picker the operator deploys; the defaults when unset."
    )


class RouterPolicy(StrEnum):
    """How the router picks a replica for a request (vllm-router's --policy)."""

    CACHE_AWARE = "cacheAware"
    ROUND_ROBIN = "roundRobin"
    POWER_OF_TWO = "powerOfTwo"
    CONSISTENT_HASH = "consistentHash"


class RouterResourcesSpec(SpecModel):
    """The router's container: requests equal limits, so it is never throttled below them."""

    cpu: Quantity = Field("1", description="CPU of each router replica (request and limit).")
    memory: Quantity = Field(
        "1Gi", description="Memory of each router replica (request and limit): its prefix trees live in it."
    )


class RouterSpec(SpecModel):
    """The vLLM project's router (vllm-router) in front of the replicas, deployed as NAME-router:
    it finds the service's ready vLLM pods by label and sends each request to one of them by
    `policy`; status.url and the HTTPRoute then lead to it."""

    policy: RouterPolicy = Field(
        RouterPolicy.CACHE_AWARE,
        description="cacheAware: the replica that served the longest prefix of the prompt (its KV cache holds "
        "it), unless the load is too uneven; roundRobin: each in turn; powerOfTwo: the less loaded of two drawn "
        "at random; consistentHash: by a hash of the request's session or user.",
    )
    replicas: int = Field(
        2, ge=1, le=32, description="Router replicas; with more than one, a PodDisruptionBudget keeps one up."
    )
    resources: RouterResourcesSpec = Field(
        default_factory=RouterResourcesSpec, description="CPU and memory of each router replica."
    )
    request_timeout_seconds: int = Field(
        600, ge=1, le=86400, description="How long the router waits for a replica's whole answer to a request."
    )
    max_concurrent_requests: int = Field(
        256, ge=1, le=65536, description="Requests each router replica relays at once; the next ones queue."
    )
    queue_size: int = Field(
        128,
        ge=0,
        le=65536,
        description="Requests each router replica holds beyond maxConcurrentRequests; beyond it, 429 at once.",
    )


class ParentRef(SpecModel):
    """A Gateway the route attaches to (the Gateway's own allowedRoutes decide whether it may)."""

    name: DnsSubdomain = Field(description="Name of the Gateway.")
    namespace: DnsLabel | None = Field(None, description="The Gateway's namespace; the service's when unset.")
    section_name: DnsSubdomain | None = Field(None, description="One listener of the Gateway; all when unset.")


class HTTPRouteSpec(SpecModel):
    """A Gateway API HTTPRoute to the service, NAME: its requests for `hostnames` through the
    parent Gateways. A canary rollout splits it by weights, exactly, instead of by replicas."""

    parent_refs: list[ParentRef] = Field(
        min_length=1, max_length=32, description="Gateways (and listeners) the route attaches to; at least one."
    )
    hostnames: list[Annotated[str, Field(pattern=HOSTNAME_PATTERN, max_length=253)]] = Field(
        default_factory=list, max_length=16, description="Hosts the route answers; every host when empty."
    )


class RoutingSpec(SpecModel):
    """Routing to the pods besides the Service: through a Gateway API gateway (an InferencePool
    with its endpoint picker for load-aware routing, and an HTTPRoute), or through the vLLM
    router in front of the replicas. None of them by default."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "!has(self.endpointPicker) || (has(self.inferencePool) && self.inferencePool)",
                "routing.endpointPicker needs routing.inferencePool: true",
                ".endpointPicker",
            ),
            cel(
                "!has(self.router) || !has(self.inferencePool) || !self.inferencePool",
                "routing.router and routing.inferencePool each choose the replica of every request: "
                "use one or the other",
                ".router",
            ),
        )
    )

    inference_pool: bool = Field(
        False,
        description="Emit a Gateway API Inference Extension InferencePool (inference.networking.k8s.io/v1) "
        "selecting the pods, so an inference gateway can route to them by queue and KV-cache load.",
    )
    endpoint_picker: EndpointPickerSpec | None = Field(
        None,
        description="The InferencePool's endpoint picker (needs inferencePool: true); unset, the operator deploys "
        "one as NAME-epp with the default weights.",
    )
    router: RouterSpec | None = Field(
        None,
        description="Deploy the vLLM router (engine vllm) as NAME-router in front of the replicas: it sends each "
        "request to a replica by its policy, by default the one whose prefix cache holds the prompt.",
    )
    http_route: HTTPRouteSpec | None = Field(
        None,
        description="Emit a Gateway API HTTPRoute (gateway.networking.k8s.io/v1) to the service (or to its "
        "InferencePool, or its router); a canary rollout then splits traffic by its weights.",
    )
