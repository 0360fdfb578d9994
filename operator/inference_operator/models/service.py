"""`spec` of an InferenceService: the models above put together, with the rules across them, and
the one way a raw spec is read (`parse_spec`)."""

from __future__ import annotations

from collections.abc import Callable, Collection

from pydantic import ConfigDict, Field, field_validator

from ..jsontypes import JsonObject
from .autoscaling import AutoscalingSpec
from .base import SpecModel, cel, cel_rules, cel_string
from .disaggregation import RULES as DISAGGREGATION_RULES
from .disaggregation import DisaggregationSpec
from .engines import (
    DEFAULT_ENGINE,
    ENGINES,
    MULTI_NODE_ARGS,
    Metric,
    Traits,
    cel_engine_in,
    engine_names,
    engines_where,
    metrics_in_order,
    metrics_per_engine,
)
from .model import AdapterSpec, ModelSpec
from .names import SpecError
from .resources import ResourcesSpec, SchedulingSpec
from .rollout import RolloutSpec
from .routing import RoutingSpec
from .runtime import RuntimeSpec


def _per_engine(field: str, allowed: Callable[[Traits], Collection[Metric]]) -> str:
    """CEL: `field` is among what the spec's engine allows (`e1 ? field in [..] : ... default's`)."""
    rule = f"{field} in [{', '.join(repr(m.value) for m in metrics_in_order(allowed(ENGINES[DEFAULT_ENGINE].traits)))}]"
    for engine in reversed([e for e in ENGINES if e != DEFAULT_ENGINE]):
        listed = ", ".join(repr(m.value) for m in metrics_in_order(allowed(ENGINES[engine].traits)))
        rule = f"({cel_engine_in((engine,), 'self.runtime')}) ? {field} in [{listed}] : {rule}"
    return rule


_MULTI_NODE = (
    "has(self.resources) && has(self.resources.gpu) && has(self.resources.gpu.nodes) && self.resources.gpu.nodes > 1"
)
_MULTI_NODE_ENGINES = engines_where(lambda traits: traits.multi_node)
_ADAPTER_ENGINES = engines_where(lambda traits: traits.lora)
_ROUTER_ENGINES = engines_where(lambda traits: traits.router)
_ROUTER = "has(self.routing) && has(self.routing.router)"


class InferenceServiceSpec(SpecModel):
    """The desired state of an InferenceService: the model, what serves it (runtime) on which GPUs
    (resources), how many replicas (replicas or autoscaling), where they run (scheduling), how
    requests reach them (routing), how a change rolls out (rollout), and its LoRA adapters."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "!has(self.resources) || !has(self.resources.gpu) || !has(self.resources.gpu.count)"
                " || self.resources.gpu.count > 0"
                " || !has(self.runtime) || !has(self.runtime.executionProviders)"
                " || 'CPUExecutionProvider' in self.runtime.executionProviders",
                "runtime.executionProviders has no CPUExecutionProvider but resources.gpu.count is 0",
                ".runtime.executionProviders",
            ),
            cel(
                "!has(self.autoscaling) || !has(self.autoscaling.metric)"
                f" || ({_per_engine('self.autoscaling.metric', lambda traits: traits.metrics)})",
                "autoscaling.metric must be one the engine exports: "
                + metrics_per_engine(lambda traits: traits.metrics),
                ".autoscaling.metric",
            ),
            cel(
                "!has(self.rollout) || !has(self.rollout.canary) || !has(self.rollout.canary.analysis)"
                " || !has(self.rollout.canary.analysis.metric)"
                f" || ({_per_engine('self.rollout.canary.analysis.metric', lambda traits: traits.canary_metrics)})",
                "rollout.canary.analysis.metric must be a latency the engine exports: "
                + metrics_per_engine(lambda traits: traits.canary_metrics),
                ".rollout.canary.analysis.metric",
            ),
            cel(
                "!has(self.model) || !has(self.model.huggingFace)"
                " || (has(self.model.uri) && self.model.uri.startsWith('hf://'))"
                " || (has(self.adapters) && self.adapters.exists(a, has(a.uri) && a.uri.startsWith('hf://')))",
                "model.huggingFace applies to hf:// models and adapters only",
                ".model.huggingFace",
            ),
            cel(
                f"{_MULTI_NODE} ? ({cel_engine_in(_MULTI_NODE_ENGINES, 'self.runtime')}) : true",
                f"resources.gpu.nodes above 1 needs runtime.engine {engine_names(_MULTI_NODE_ENGINES)}",
                ".resources.gpu.nodes",
            ),
            cel(
                f"{_MULTI_NODE}"
                " ? !(has(self.rollout) && has(self.rollout.strategy) && self.rollout.strategy == 'canary')"
                " && !(has(self.adapters) && size(self.adapters) > 0) : true",
                "resources.gpu.nodes above 1 does not take a canary rollout or adapters yet",
                ".resources.gpu.nodes",
            ),
            *(
                cel(
                    f"{_MULTI_NODE} && has(self.runtime) && has(self.runtime.args)"
                    f" ? self.runtime.args.all(a, !a.matches({cel_string(pattern)})) : true",
                    "runtime.args may not set what a multi-node replica sets: "
                    + ", ".join("--" + f for f in flags)
                    + " (or an abbreviation)",
                    ".runtime.args",
                )
                for flags, pattern in MULTI_NODE_ARGS.values()
            ),
            cel(
                "!has(self.adapters) || size(self.adapters) == 0"
                f" || ({cel_engine_in(_ADAPTER_ENGINES, 'self.runtime')})",
                f"spec.adapters needs runtime.engine {engine_names(_ADAPTER_ENGINES)}",
                ".adapters",
            ),
            cel(
                "!has(self.autoscaling) || !has(self.autoscaling.scaleToZero)"
                " || !has(self.routing) || !has(self.routing.inferencePool) || !self.routing.inferencePool",
                "autoscaling.scaleToZero holds requests at the Service, and an InferencePool's gateway sends them "
                "to the pods directly: at zero they would fail; use routing.httpRoute or the Service",
                ".autoscaling.scaleToZero",
            ),
            cel(
                f"!({_ROUTER}) || ({cel_engine_in(_ROUTER_ENGINES, 'self.runtime')})",
                f"routing.router needs runtime.engine {engine_names(_ROUTER_ENGINES)}",
                ".routing.router",
            ),
            cel(
                f"!({_ROUTER}) || !has(self.rollout) || !has(self.rollout.strategy)"
                " || self.rollout.strategy != 'canary'",
                "routing.router does not take a canary rollout yet: it spreads requests by prefix cache and load "
                "over every ready replica, so the canary's share of traffic would not be the step's weight",
                ".routing.router",
            ),
            *DISAGGREGATION_RULES,
        )
    )

    replicas: int = Field(
        1,
        ge=0,
        le=1000,
        description="Desired replicas; written by the autoscaler (scale subresource) when spec.autoscaling is set.",
    )
    model: ModelSpec
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    autoscaling: AutoscalingSpec | None = Field(
        None, description="Latency-SLO autoscaling; without it the service keeps spec.replicas."
    )
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    routing: RoutingSpec = Field(default_factory=RoutingSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    adapters: list[AdapterSpec] = Field(
        default_factory=list,
        max_length=64,
        description="LoRA adapters served beside the model (engine vllm), each by its name; added and removed in "
        "running replicas without a restart, and loaded by a new replica before it turns Ready. Their state "
        "per replica is in status.adapters.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    disaggregation: DisaggregationSpec | None = Field(
        None,
        description="Prefill/decode disaggregation (engine vllm, with routing.router): NAME-prefill computes "
        "prompts, NAME-decode generates, a KV connector moves the cache between them, each role with its own "
        "replicas, resources and autoscaling.",
    )

    @field_validator("adapters")
    @classmethod
    def _unique_adapters(cls, adapters: list[AdapterSpec]) -> list[AdapterSpec]:
        names = [a.name for a in adapters]
        if len(set(names)) != len(names):
            raise ValueError("adapter names must be unique")
        return adapters


def parse_spec(spec: JsonObject) -> InferenceServiceSpec:
    """Validate a raw `spec` mapping; raise SpecError naming the first bad field."""
    from pydantic import ValidationError

    try:
        return InferenceServiceSpec.model_validate(spec)
    except ValidationError as exc:
        err = exc.errors()[0]
        path = ".".join(str(p) for p in ("spec", *err["loc"]))
        message = err["msg"].removeprefix("Value error, ")
        if len(exc.errors()) > 1:
            message += f" (and {len(exc.errors()) - 1} more)"
        raise SpecError(path, message) from exc
