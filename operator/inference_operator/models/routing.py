"""Gateway routing to the pods: an InferencePool and its endpoint picker, an HTTPRoute."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from .base import SpecModel, cel, cel_rules
from .names import HOSTNAME_PATTERN, DnsLabel, DnsSubdomain


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
    """Routing through a Gateway API gateway, besides the Service: an InferencePool with its
    endpoint picker (load-aware routing for LLMs), and an HTTPRoute. Neither by default."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            "!has(self.endpointPicker) || (has(self.inferencePool) && self.inferencePool)",
            "routing.endpointPicker needs routing.inferencePool: true",
            ".endpointPicker",
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
    http_route: HTTPRouteSpec | None = Field(
        None,
        description="Emit a Gateway API HTTPRoute (gateway.networking.k8s.io/v1) to the service (or to its "
        "InferencePool); a canary rollout then splits traffic by its weights.",
    )
