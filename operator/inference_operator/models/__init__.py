"""The InferenceService spec (and status) as pydantic models: the one source of the schema.

The CRD in crds/ is generated from these models by `inference_operator.crd`: field types,
defaults, bounds, patterns, descriptions and the CEL rules (`x-kubernetes-validations`, declared
next to the model they check with `cel(...)`) all live here. Builders never invent a default of
their own, they read it from here.

One module per part of the spec, as KServe splits its API types, layered bottom up (the import
contracts in pyproject.toml hold them to it):

    names        the resource's identity; names, labels and quantities as the API server takes them
    base         SpecModel, the base of every spec model, and `cel(...)`, the rules it declares
    engines      the engine table (what modelServer and vllm export and support), the flags and
                 variables the operator sets
    model        where the model and its LoRA adapters come from (spec.model, spec.adapters)
    runtime      the serving container (spec.runtime)
    resources    GPUs, CPU, memory, scheduling (spec.resources, spec.scheduling)
    autoscaling  spec.autoscaling, scale to zero included
    routing      spec.routing: InferencePool, endpoint picker, HTTPRoute
    rollout      spec.rollout: rolling or canary
    disaggregation  spec.disaggregation: the prefill and decode roles, the KV connector
    service      InferenceServiceSpec, its rules across parts, and parse_spec
    status       the status schema

The rest of the operator imports these names from `inference_operator.models`.
"""

from .autoscaling import (
    DEFAULT_PROMETHEUS_URL as DEFAULT_PROMETHEUS_URL,
)
from .autoscaling import (
    AutoscalingMode as AutoscalingMode,
)
from .autoscaling import (
    AutoscalingSpec as AutoscalingSpec,
)
from .autoscaling import (
    PrometheusAuth as PrometheusAuth,
)
from .autoscaling import (
    ScaleToZeroSpec as ScaleToZeroSpec,
)
from .autoscaling import (
    ScalingRule as ScalingRule,
)
from .autoscaling import (
    SecretKeyRef as SecretKeyRef,
)
from .base import (
    RESOURCE_VALIDATIONS as RESOURCE_VALIDATIONS,
)
from .base import (
    cel as cel,
)
from .base import (
    cel_rules as cel_rules,
)
from .disaggregation import (
    DecodeSpec as DecodeSpec,
)
from .disaggregation import (
    DisaggregationSpec as DisaggregationSpec,
)
from .disaggregation import (
    KvConnector as KvConnector,
)
from .disaggregation import (
    PrefillSpec as PrefillSpec,
)
from .engines import (
    DEFAULT_ENGINE as DEFAULT_ENGINE,
)
from .engines import (
    DEFAULT_IMAGE as DEFAULT_IMAGE,
)
from .engines import (
    ENGINES as ENGINES,
)
from .engines import (
    OPERATOR_ENV as OPERATOR_ENV,
)
from .engines import (
    OPERATOR_FLAGS as OPERATOR_FLAGS,
)
from .engines import (
    Engine as Engine,
)
from .engines import (
    Metric as Metric,
)
from .model import (
    ADAPTER_URI_PATTERN as ADAPTER_URI_PATTERN,
)
from .model import (
    CACHE_PVC_MESSAGE as CACHE_PVC_MESSAGE,
)
from .model import (
    SHA256_MESSAGE as SHA256_MESSAGE,
)
from .model import (
    AdapterSpec as AdapterSpec,
)
from .model import (
    HuggingFaceSpec as HuggingFaceSpec,
)
from .model import (
    ModelFormat as ModelFormat,
)
from .model import (
    ModelSpec as ModelSpec,
)
from .names import (
    API_VERSION as API_VERSION,
)
from .names import (
    DNS_LABEL_PATTERN as DNS_LABEL_PATTERN,
)
from .names import (
    DNS_SUBDOMAIN_PATTERN as DNS_SUBDOMAIN_PATTERN,
)
from .names import (
    GROUP as GROUP,
)
from .names import (
    HF_URI_PATTERN as HF_URI_PATTERN,
)
from .names import (
    HOSTNAME_PATTERN as HOSTNAME_PATTERN,
)
from .names import (
    IMAGE_PATTERN as IMAGE_PATTERN,
)
from .names import (
    KIND as KIND,
)
from .names import (
    LABEL_KEY_PATTERN as LABEL_KEY_PATTERN,
)
from .names import (
    LABEL_VALUE_PATTERN as LABEL_VALUE_PATTERN,
)
from .names import (
    MODEL_URI_PATTERN as MODEL_URI_PATTERN,
)
from .names import (
    NAME_MAX_LENGTH as NAME_MAX_LENGTH,
)
from .names import (
    NAME_MESSAGE as NAME_MESSAGE,
)
from .names import (
    NAME_PATTERN as NAME_PATTERN,
)
from .names import (
    PATH_SEGMENT as PATH_SEGMENT,
)
from .names import (
    PLURAL as PLURAL,
)
from .names import (
    QUANTITY_PATTERN as QUANTITY_PATTERN,
)
from .names import (
    SAFE_NAME_PATTERN as SAFE_NAME_PATTERN,
)
from .names import (
    SHORT_NAME as SHORT_NAME,
)
from .names import (
    VERSION as VERSION,
)
from .names import (
    DnsLabel as DnsLabel,
)
from .names import (
    DnsSubdomain as DnsSubdomain,
)
from .names import (
    Quantity as Quantity,
)
from .names import (
    SafeName as SafeName,
)
from .names import (
    SpecError as SpecError,
)
from .names import (
    check_name as check_name,
)
from .resources import (
    DRA_DEVICE_CLASS as DRA_DEVICE_CLASS,
)
from .resources import (
    GPU_RESOURCE as GPU_RESOURCE,
)
from .resources import (
    PARTITION_PATTERN as PARTITION_PATTERN,
)
from .resources import (
    GpuAllocation as GpuAllocation,
)
from .resources import (
    GpuSpec as GpuSpec,
)
from .resources import (
    LabelValue as LabelValue,
)
from .resources import (
    NodeLabelValue as NodeLabelValue,
)
from .resources import (
    ResourceNaming as ResourceNaming,
)
from .resources import (
    ResourcesSpec as ResourcesSpec,
)
from .resources import (
    SchedulingSpec as SchedulingSpec,
)
from .rollout import (
    CanaryAnalysis as CanaryAnalysis,
)
from .rollout import (
    CanarySpec as CanarySpec,
)
from .rollout import (
    RolloutSpec as RolloutSpec,
)
from .rollout import (
    RolloutStrategy as RolloutStrategy,
)
from .routing import (
    EndpointPickerSpec as EndpointPickerSpec,
)
from .routing import (
    HTTPRouteSpec as HTTPRouteSpec,
)
from .routing import (
    ParentRef as ParentRef,
)
from .routing import (
    RouterPolicy as RouterPolicy,
)
from .routing import (
    RouterSpec as RouterSpec,
)
from .routing import (
    RoutingSpec as RoutingSpec,
)
from .routing import (
    ScorerWeights as ScorerWeights,
)
from .runtime import (
    BatchingSpec as BatchingSpec,
)
from .runtime import (
    EnvVar as EnvVar,
)
from .runtime import (
    ExecutionProvider as ExecutionProvider,
)
from .runtime import (
    LoraRank as LoraRank,
)
from .runtime import (
    LoraSpec as LoraSpec,
)
from .runtime import (
    RuntimeSpec as RuntimeSpec,
)
from .runtime import (
    TracingSpec as TracingSpec,
)
from .service import (
    InferenceServiceSpec as InferenceServiceSpec,
)
from .service import (
    parse_spec as parse_spec,
)
from .status import (
    AdapterPodStatus as AdapterPodStatus,
)
from .status import (
    AdapterStatus as AdapterStatus,
)
from .status import (
    AutoscalerStatus as AutoscalerStatus,
)
from .status import (
    CanaryCheck as CanaryCheck,
)
from .status import (
    Condition as Condition,
)
from .status import (
    InferenceServiceStatus as InferenceServiceStatus,
)
from .status import (
    Int64 as Int64,
)
from .status import (
    RolloutStatus as RolloutStatus,
)
