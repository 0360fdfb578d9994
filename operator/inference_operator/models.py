"""The InferenceService spec as pydantic models.

These models mirror the CRD's openAPIV3Schema field for field (a test keeps the two in step)
and are the single place where defaults live in Python: builders never invent a default of
their own, they read it from here.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

GROUP = "inference.rocm.dev"
VERSION = "v1alpha1"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SHORT_NAME = "ris"
API_VERSION = f"{GROUP}/{VERSION}"

GPU_RESOURCE = "amd.com/gpu"
DEFAULT_IMAGE = "ghcr.io/rocm-inference/model-server:0.1.0"
DEFAULT_PROMETHEUS_URL = "http://prometheus-operated.monitoring:9090"

# A non-negative Kubernetes quantity: decimal or binary SI suffix, or an exponent.
QUANTITY_PATTERN = r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
MODEL_URI_PATTERN = r"^(pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/\S*)?|(s3|https?|oci)://\S+)$"
IMAGE_PATTERN = r"^\S+$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# Label keys and values, as the API server checks them (pods would be refused otherwise).
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$"
)


class _Spec(BaseModel):
    """Base for spec models: camelCase on the wire, unknown fields are an error."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )


Quantity = Annotated[str, Field(pattern=QUANTITY_PATTERN)]


def _quantity(value: object) -> object:
    """Accept YAML numbers for quantities (`cpu: 8`) and keep them as strings, as the API does."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return str(value)
    return value


class ModelFormat(StrEnum):
    ONNX = "onnx"
    TORCHSCRIPT = "torchscript"


class ExecutionProvider(StrEnum):
    MIGRAPHX = "MIGraphXExecutionProvider"
    ROCM = "ROCMExecutionProvider"
    CUDA = "CUDAExecutionProvider"
    CPU = "CPUExecutionProvider"


class Metric(StrEnum):
    LATENCY_P95_MS = "latencyP95Ms"
    LATENCY_P99_MS = "latencyP99Ms"
    QUEUE_DEPTH = "queueDepth"
    RPS = "rps"
    GPU_UTILIZATION = "gpuUtilization"


class AutoscalingMode(StrEnum):
    BUILTIN = "builtin"
    HPA = "hpa"
    KEDA = "keda"


class ModelSpec(_Spec):
    """Where the model lives and how to load it."""

    uri: Annotated[str, Field(pattern=MODEL_URI_PATTERN)]
    format: ModelFormat = ModelFormat.ONNX
    version: str | None = None
    name: Annotated[str | None, Field(pattern=r"^[a-zA-Z0-9_.-]+$", max_length=63)] = None

    @property
    def scheme(self) -> str:
        return self.uri.split("://", 1)[0]


class BatchingSpec(_Spec):
    max_batch_size: Annotated[int, Field(ge=1, le=1024)] = 16
    max_delay_ms: Annotated[float, Field(ge=0, le=1000)] = 5
    max_queue: Annotated[int, Field(ge=1, le=100_000)] = 256


class EnvVar(_Spec):
    name: Annotated[str, Field(pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")]
    value: str = ""


def _default_providers() -> list[ExecutionProvider]:
    return [ExecutionProvider.MIGRAPHX, ExecutionProvider.ROCM, ExecutionProvider.CPU]


class RuntimeSpec(_Spec):
    """The model-server container: image, providers, batching and probes."""

    image: Annotated[str, Field(pattern=IMAGE_PATTERN, max_length=512)] = DEFAULT_IMAGE
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    execution_providers: Annotated[list[ExecutionProvider], Field(min_length=1)] = Field(
        default_factory=_default_providers
    )
    batching: BatchingSpec = Field(default_factory=BatchingSpec)
    port: Annotated[int, Field(ge=1, le=65535)] = 8080
    metrics_port: Annotated[int, Field(ge=1, le=65535)] = 9090
    startup_timeout_seconds: Annotated[int, Field(ge=10, le=7200)] = 600
    env: list[EnvVar] = Field(default_factory=list)
    args: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _distinct_ports(self) -> RuntimeSpec:
        if self.port == self.metrics_port:
            raise ValueError("runtime.port and runtime.metricsPort must differ")
        return self


class GpuSpec(_Spec):
    """AMD GPUs per replica, and which nodes may host them (AMD GPU labeller labels)."""

    count: Annotated[int, Field(ge=0, le=16)] = 1
    product_name: Annotated[str | None, Field(pattern=r"^[A-Za-z0-9_.-]+$")] = None
    family: Annotated[str | None, Field(pattern=r"^[A-Za-z0-9_.-]+$")] = None
    vram: Annotated[str | None, Field(pattern=r"^[0-9]+[GM]$")] = None
    partition: Annotated[str | None, Field(pattern=r"^[a-z]+_[a-z0-9]+$")] = None
    visible_devices: Annotated[str | None, Field(pattern=r"^[0-9]+(,[0-9]+)*$")] = None

    @model_validator(mode="after")
    def _placement_needs_gpus(self) -> GpuSpec:
        placed = [f for f in ("product_name", "family", "vram", "partition") if getattr(self, f)]
        if self.count == 0 and placed:
            names = ", ".join(to_camel(f) for f in placed)
            raise ValueError(f"resources.gpu.{names} set but resources.gpu.count is 0")
        if self.visible_devices is not None:
            if len(self.visible_devices.split(",")) != self.count:
                raise ValueError("resources.gpu.visibleDevices must list exactly resources.gpu.count devices")
        return self


class ResourcesSpec(_Spec):
    gpu: GpuSpec = Field(default_factory=GpuSpec)
    cpu: Quantity = "4"
    memory: Quantity = "16Gi"
    shm_size: Quantity = "8Gi"

    @field_validator("cpu", "memory", "shm_size", mode="before")
    @classmethod
    def _coerce_quantity(cls, value: object) -> object:
        return _quantity(value)


class ScalingRule(_Spec):
    """At most `pods` or `percent` of current replicas per `periodSeconds` (the larger wins)."""

    pods: Annotated[int, Field(ge=1)] = 4
    percent: Annotated[int, Field(ge=1)] = 100
    period_seconds: Annotated[int, Field(ge=1, le=1800)] = 15


class SecretKeyRef(_Spec):
    name: Annotated[str, Field(min_length=1)]
    key: Annotated[str, Field(min_length=1)]


class PrometheusAuth(_Spec):
    bearer_token_secret: SecretKeyRef | None = None
    ca_secret: SecretKeyRef | None = None


class AutoscalingSpec(_Spec):
    """Latency-SLO autoscaling; absent means a fixed `spec.replicas`."""

    mode: AutoscalingMode = AutoscalingMode.BUILTIN
    min_replicas: Annotated[int, Field(ge=1)] = 1
    max_replicas: Annotated[int, Field(ge=1, le=1000)]
    metric: Metric = Metric.LATENCY_P95_MS
    target: Annotated[float, Field(gt=0)]
    prometheus_url: Annotated[str, Field(pattern=r"^https?://.+")] = DEFAULT_PROMETHEUS_URL
    prometheus_auth: PrometheusAuth | None = None
    interval_seconds: Annotated[int, Field(ge=1, le=3600)] = 15
    window_seconds: Annotated[int, Field(ge=10, le=3600)] = 60
    tolerance: Annotated[float, Field(ge=0, lt=1)] = 0.1
    scale_down_stabilization_seconds: Annotated[int, Field(ge=0, le=3600)] = 300
    scale_up: ScalingRule = Field(default_factory=ScalingRule)
    scale_down: ScalingRule = Field(default_factory=ScalingRule)

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError("autoscaling.minReplicas must be <= autoscaling.maxReplicas")
        return self


LabelValue = Annotated[str, Field(pattern=LABEL_VALUE_PATTERN, max_length=63)]


class SchedulingSpec(_Spec):
    node_selector: dict[str, LabelValue] = Field(default_factory=dict)
    priority_class_name: Annotated[str | None, Field(pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)] = None
    service_account_name: Annotated[str | None, Field(pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)] = None

    @field_validator("node_selector")
    @classmethod
    def _label_keys(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not re.match(LABEL_KEY_PATTERN, key) or len(key.rsplit("/", 1)[-1]) > 63:
                raise ValueError(f"scheduling.nodeSelector key {key!r} is not a valid label key")
        return value


class InferenceServiceSpec(_Spec):
    """`spec` of an InferenceService."""

    replicas: Annotated[int, Field(ge=0, le=1000)] = 1
    model: ModelSpec
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    autoscaling: AutoscalingSpec | None = None
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)

    @model_validator(mode="after")
    def _gpu_providers(self) -> InferenceServiceSpec:
        gpu_only = set(self.runtime.execution_providers) - {ExecutionProvider.CPU}
        if (
            self.resources.gpu.count == 0
            and gpu_only
            and ExecutionProvider.CPU not in (self.runtime.execution_providers)
        ):
            raise ValueError("runtime.executionProviders has no CPUExecutionProvider but resources.gpu.count is 0")
        return self


class SpecError(ValueError):
    """A spec the operator cannot act on; `field` names where, `message` says why."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


def parse_spec(spec: dict) -> InferenceServiceSpec:
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
