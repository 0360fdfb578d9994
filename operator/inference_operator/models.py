"""The InferenceService spec (and status) as pydantic models: the one source of the schema.

The CRD in crds/ is generated from these models by `inference_operator.crd`: field types,
defaults, bounds, patterns, descriptions and the CEL rules (`x-kubernetes-validations`, declared
next to the model they check with `cel(...)`) all live here. Builders never invent a default of
their own, they read it from here.
"""

from __future__ import annotations

import functools
import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, field_validator, model_validator
from pydantic.alias_generators import to_camel

from .cel_rules import evaluate_rules
from .jsontypes import JsonObject

GROUP = "inference.rocm.dev"
VERSION = "v1alpha1"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SHORT_NAME = "ris"
API_VERSION = f"{GROUP}/{VERSION}"

GPU_RESOURCE = "amd.com/gpu"
# The AMD DRA driver's DeviceClass (ROCm/k8s-gpu-dra-driver, GPU Operator 1.5+).
DRA_DEVICE_CLASS = "gpu.amd.com"
# Compute x memory partition modes as the device plugin and the DRA driver name them (the
# lower-cased sysfs current_compute_partition and current_memory_partition joined by "_").
PARTITION_PATTERN = r"^(spx|dpx|tpx|qpx|cpx)_(nps1|nps2|nps4|nps8)$"
DEFAULT_IMAGE = "ghcr.io/rocm-inference/model-server:0.1.0"
# vLLM's ROCm build of its OpenAI-compatible server; the operator's --vllm-image overrides it.
DEFAULT_VLLM_IMAGE = "docker.io/vllm/vllm-openai-rocm:v0.32.0"
DEFAULT_PROMETHEUS_URL = "http://prometheus-operated.monitoring:9090"

# A non-negative Kubernetes quantity: decimal or binary SI suffix, or an exponent.
QUANTITY_PATTERN = r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
# A path segment that is not `.` or `..` (RE2, as the API server's patterns: no lookahead).
PATH_SEGMENT = r"([^/.\s][^/\s]*|\.[^/.\s][^/\s]*|\.\.[^/\s]+)"
# hf://ORG/NAME[@REVISION]: a Hugging Face Hub repository, at a branch, tag or commit.
HF_URI_PATTERN = r"hf://[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*(@[A-Za-z0-9][-A-Za-z0-9_./]*)?"
# pvc://CLAIM/PATH becomes a volume subPath, which the API server refuses with `..` in it.
MODEL_URI_PATTERN = (
    rf"^(pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/{PATH_SEGMENT})*/?|(s3|https?|oci)://\S+|{HF_URI_PATTERN})$"
)
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
IMAGE_PATTERN = r"^\S+$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# Label keys and values, as the API server checks them (pods would be refused otherwise).
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# Model names and versions reach the server's command line and URL paths: no leading '-' or '.',
# no '=', '/' or spaces, so a value can never be read as a flag or a path.
SAFE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"

# Names as the API server (or the model server) takes them; a field adds its description.
DnsLabel = Annotated[str, Field(pattern=DNS_LABEL_PATTERN, max_length=63)]
DnsSubdomain = Annotated[str, Field(pattern=DNS_SUBDOMAIN_PATTERN, max_length=253)]
SafeName = Annotated[str, Field(pattern=SAFE_NAME_PATTERN, max_length=63)]
# A GPU node label's value as AMD's node labeller writes it (product name, family).
NodeLabelValue = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$", max_length=63)]
# Flags of `model_server serve` the operator sets itself (builders/deployment.server_args) or that
# must keep their default for probes and the Service (--host): runtime.args may not set them,
# nor any prefix of them (argparse accepts an unambiguous prefix: `--po 1` is `--port 1`).
OPERATOR_FLAGS = (
    "--model",
    "--model-name",
    "--model-version",
    "--format",
    "--host",
    "--port",
    "--metrics-port",
    "--grpc-port",
    "--providers",
    "--max-batch-size",
    "--max-delay-ms",
    "--max-queue",
    "--shutdown-delay",
    "--drain-timeout",
    # runtime.tracing: traces leave only for the endpoint its author wrote there.
    "--otlp-traces-endpoint",
    "--trace-sample-ratio",
)
# Environment the operator sets, or that would override what it sets: GPU selection (HIP also
# honours CUDA_VISIBLE_DEVICES and GPU_DEVICE_ORDINAL) and the server's env form of its flags.
OPERATOR_ENV = (
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "MODEL_NAME",
    "MODEL_SERVER_MODEL",
    "MODEL_SERVER_MODEL_NAME",
    "MODEL_SERVER_MODEL_VERSION",
    "MODEL_SERVER_FORMAT",
    "MODEL_SERVER_HOST",
    "MODEL_SERVER_PORT",
    "MODEL_SERVER_METRICS_PORT",
    "MODEL_SERVER_GRPC_PORT",
    "MODEL_SERVER_PROVIDERS",
    "MODEL_SERVER_MAX_BATCH_SIZE",
    "MODEL_SERVER_MAX_DELAY_MS",
    "MODEL_SERVER_MAX_QUEUE",
    "MODEL_SERVER_SHUTDOWN_DELAY_S",
    "MODEL_SERVER_DRAIN_TIMEOUT_S",
    "MODEL_SERVER_OTLP_TRACES_ENDPOINT",
    "MODEL_SERVER_TRACE_SAMPLE_RATIO",
    "OTEL_K8S_POD_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    # The model fetcher's Hub access: only from model.huggingFace, which the operator checks.
    "HF_TOKEN",
    "HF_ENDPOINT",
    "HF_HOME",
    "MODEL_FETCH_ALLOW_HTTP_TOKEN",
    # vLLM's adapter endpoints: opened by the operator only with the guard in front (spec.adapters).
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
    # vLLM's trace export, from runtime.tracing.
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
)
# An InferenceService's name is its Service's, Deployment's and its label values: a DNS-1035 label.
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
NAME_MAX_LENGTH = 63
NAME_MESSAGE = (
    f"metadata.name must be a DNS-1035 label of at most {NAME_MAX_LENGTH} characters: lowercase letters, "
    "digits and '-', starting with a letter and ending with a letter or digit (it names the Service)"
)
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$"
)


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, Any]:
    """A CEL rule for the API server, as the `json_schema_extra` of a model or field.

    The API server also evaluates each rule against every `default:` in the schema as written and
    on objects that lack optional fields: guard every field a rule reads with `has()`.
    """
    entry: dict[str, Any] = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return {"x-kubernetes-validations": [entry]}


def cel_rules(*rules: dict[str, Any]) -> dict[str, Any]:
    """Several `cel(...)` rules on one node."""
    return {"x-kubernetes-validations": [r for rule in rules for r in rule["x-kubernetes-validations"]]}


# Rules on the whole object (the CRD's root); at the root, CEL sees metadata.name and generateName.
RESOURCE_VALIDATIONS = cel(
    f"!has(self.metadata) || !has(self.metadata.name) || size(self.metadata.name) <= {NAME_MAX_LENGTH}"
    f" && self.metadata.name.matches('{NAME_PATTERN}')",
    NAME_MESSAGE,
)


class _Spec(BaseModel):
    """Base for spec models: camelCase on the wire, unknown fields are an error, and the CEL rules
    declared on a model or its fields hold (run here as the API server runs them, not rewritten)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )

    @model_validator(mode="after")
    def _cel_rules_hold(self) -> Self:
        declared = _declared_rules(type(self))
        if declared:
            data = self.model_dump(by_alias=True, mode="json", exclude_none=True)
            for key, rules in declared:
                if key is None or key in data:
                    if problems := evaluate_rules(rules, data if key is None else data[key]):
                        raise ValueError(problems[0])
        return self


@functools.cache
def _declared_rules(model: type[BaseModel]) -> list[tuple[str | None, list[dict[str, Any]]]]:
    """(None for the model or a field's alias, its rules) for every `cel(...)` on `model`."""

    def rules(extra: object) -> list[dict[str, Any]]:
        found = extra.get("x-kubernetes-validations") if isinstance(extra, dict) else None
        return [r for r in found if isinstance(r, dict)] if isinstance(found, list) else []

    declared: list[tuple[str | None, list[dict[str, Any]]]] = [
        (None, rules(model.model_config.get("json_schema_extra")))
    ]
    for name, field in model.model_fields.items():
        declared.append((field.alias or name, rules(field.json_schema_extra)))
    return [(key, found) for key, found in declared if found]


def _quantity(value: object) -> object:
    """Accept YAML numbers for quantities (`cpu: 8`) and keep them as strings, as the API does."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return str(value)
    return value


# int-or-string on the wire (`cpu: 8` or `cpu: 500m`), a string in Python.
Quantity = Annotated[
    str,
    Field(pattern=QUANTITY_PATTERN),
    BeforeValidator(_quantity),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
        }
    ),
]


class ModelFormat(StrEnum):
    ONNX = "onnx"
    TORCHSCRIPT = "torchscript"


class ExecutionProvider(StrEnum):
    MIGRAPHX = "MIGraphXExecutionProvider"
    ROCM = "ROCMExecutionProvider"
    CUDA = "CUDAExecutionProvider"
    CPU = "CPUExecutionProvider"


class Engine(StrEnum):
    """What serves the model: the bundled model server, or vLLM for LLMs."""

    MODEL_SERVER = "modelServer"
    VLLM = "vllm"


class Metric(StrEnum):
    LATENCY_P95_MS = "latencyP95Ms"
    LATENCY_P99_MS = "latencyP99Ms"
    QUEUE_DEPTH = "queueDepth"
    RPS = "rps"
    GPU_UTILIZATION = "gpuUtilization"
    # vLLM's own metrics (engine: vllm).
    TTFT_P95_MS = "ttftP95Ms"
    ITL_P95_MS = "itlP95Ms"
    E2E_LATENCY_P95_MS = "e2eLatencyP95Ms"
    REQUESTS_WAITING = "requestsWaiting"
    KV_CACHE_USAGE = "kvCacheUsage"


# Which metrics each engine exports; a metric of the other engine would never have data.
ENGINE_METRICS: dict[Engine, frozenset[Metric]] = {
    Engine.MODEL_SERVER: frozenset(
        {Metric.LATENCY_P95_MS, Metric.LATENCY_P99_MS, Metric.QUEUE_DEPTH, Metric.RPS, Metric.GPU_UTILIZATION}
    ),
    Engine.VLLM: frozenset(
        {
            Metric.TTFT_P95_MS,
            Metric.ITL_P95_MS,
            Metric.E2E_LATENCY_P95_MS,
            Metric.REQUESTS_WAITING,
            Metric.KV_CACHE_USAGE,
        }
    ),
}

# vLLM flags the operator sets from the spec (or that would move the server off its port, or
# read more flags from a file): runtime.args may not set them, nor an abbreviation of them
# (vLLM's argument parser accepts unambiguous prefixes and `_` for `-`).
VLLM_RESERVED_FLAGS = (
    "model",
    "served-model-name",
    "tensor-parallel-size",
    "max-model-len",
    "host",
    "port",
    "uds",
    "config",
    # LoRA: sized by runtime.lora, adapters from spec.adapters, and the guard of their endpoints.
    "enable-lora",
    "max-loras",
    "max-lora-rank",
    "lora-modules",
    "middleware",
    # Trace export: runtime.tracing.
    "otlp-traces-endpoint",
)
VLLM_ARG_PATTERN = r"^--[A-Za-z0-9][-_A-Za-z0-9.+]*(=[\s\S]*)?$"
# vLLM flags a multi-node replica (resources.gpu.nodes > 1) sets: the pipeline across nodes and
# the multiprocessing bootstrap between them; runtime.args may not set them there.
VLLM_MULTI_NODE_FLAGS = (
    "pipeline-parallel-size",
    "distributed-executor-backend",
    "nnodes",
    "node-rank",
    "master-addr",
    "master-port",
    "headless",
    "data-parallel-size",
)


def _prefixes(flag: str) -> str:
    """A regex matching every non-empty prefix of `flag`, `-` or `_` between words."""
    chars = ["[-_]" if c == "-" else c for c in flag]
    pattern = ""
    for c in reversed(chars[1:]):
        pattern = f"({c}{pattern})?"
    return chars[0] + pattern


# One `--flag` or `--flag=value` naming (a prefix of) a reserved flag; `.key`/`+` are vLLM's
# JSON-argument syntax for the same flag. Shared with the CRD's CEL rule.
VLLM_RESERVED_ARG_PATTERN = "^--(" + "|".join(_prefixes(f) for f in VLLM_RESERVED_FLAGS) + ")([.+=][\\s\\S]*)?$"
VLLM_ARGS_MESSAGE = "runtime.args for engine vllm"
VLLM_MULTI_NODE_ARG_PATTERN = "^--(" + "|".join(_prefixes(f) for f in VLLM_MULTI_NODE_FLAGS) + ")([.+=][\\s\\S]*)?$"


class AutoscalingMode(StrEnum):
    BUILTIN = "builtin"
    HPA = "hpa"
    KEDA = "keda"


SHA256_MESSAGE = "model.sha256 applies to http(s):// model URIs, which name one file"


class HuggingFaceSpec(_Spec):
    """Access to the Hugging Face Hub for hf:// models: a token and, for mirrors, an endpoint."""

    token_secret: DnsSubdomain | None = Field(
        None,
        description="Name of a Secret in the namespace holding the Hub token (exposed as HF_TOKEN).",
    )
    token_key: str = Field(
        "token", pattern=r"^[-._a-zA-Z0-9]+$", max_length=253, description="Key of the token in that Secret."
    )
    endpoint: str | None = Field(
        None,
        pattern=r"^https?://\S+$",
        max_length=2048,
        description="Hub endpoint (HF_ENDPOINT), e.g. an in-house mirror; the public Hub when unset.",
    )


CACHE_PVC_MESSAGE = "model.cachePvc applies to fetched models (s3://, http(s)://, hf://), not pvc:// or oci://"


class ModelSpec(_Spec):
    """Where the model lives and how to load it."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "!has(self.sha256) || (has(self.uri) && self.uri.startsWith('http'))",
                SHA256_MESSAGE,
                ".sha256",
            ),
            cel(
                "!has(self.cachePvc) || !has(self.uri)"
                " || !(self.uri.startsWith('pvc://') || self.uri.startsWith('oci://'))",
                CACHE_PVC_MESSAGE,
                ".cachePvc",
            ),
        )
    )

    uri: str = Field(
        pattern=MODEL_URI_PATTERN,
        max_length=2048,
        description="pvc://CLAIM/PATH mounts a claim read-only; s3://, http(s)://, oci:// and hf://ORG/NAME[@REVISION] "
        "are fetched by an init container.",
    )
    format: ModelFormat = ModelFormat.ONNX
    version: SafeName | None = Field(
        None,
        description="Model version to serve (a directory of the model repository); the highest version found "
        "when unset.",
    )
    name: SafeName | None = Field(
        None,
        description="Model name in the inference API and metrics; defaults to the InferenceService's name.",
    )
    hugging_face: HuggingFaceSpec | None = Field(
        None, description="Hub token and endpoint for hf:// URIs (the model's and the adapters')."
    )
    cache_pvc: DnsLabel | None = Field(
        None,
        description="A (ReadWriteMany) PersistentVolumeClaim to keep fetched models on: replicas and restarts reuse "
        "the copy instead of downloading again. Without it each pod fetches into an emptyDir.",
    )

    sha256: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{64}$",
        description="SHA-256 (hex) of the file an http(s):// URI names; the init container refuses any other "
        "content before the server sees it.",
    )

    @property
    def scheme(self) -> str:
        return self.uri.split("://", 1)[0]


class BatchingSpec(_Spec):
    max_batch_size: Annotated[int, Field(ge=1, le=1024)] = 16
    max_delay_ms: Annotated[float, Field(ge=0, le=1000)] = 5
    max_queue: Annotated[int, Field(ge=1, le=100_000)] = 256


class EnvVar(_Spec):
    name: str = Field(pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", max_length=256)
    # 64 variables of at most 4 KiB: a pod spec stays far below etcd's object size limit.
    value: str = Field("", max_length=4096)


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _prefixes_pattern(words: tuple[str, ...]) -> str:
    """An RE2 pattern for every prefix of every word (the empty one too): one regex per argument
    is far cheaper for a CEL evaluator than a loop over the words."""
    trie: dict[str, Any] = {}
    for word in words:
        assert re.fullmatch(r"[a-z0-9-]+", word), word  # nothing to escape, in RE2 or in a CEL string
        node = trie
        for char in word:
            node = node.setdefault(char, {})

    def optional(node: dict[str, Any]) -> str:
        return "(?:" + "|".join(char + optional(sub) for char, sub in node.items()) + ")?" if node else ""

    return optional(trie)


_ARGS_MESSAGE = "runtime.args must not set the flags the operator sets (use the spec's fields): " + ", ".join(
    OPERATOR_FLAGS
)
_ENV_MESSAGE = "runtime.env must not set the variables the operator sets (GPUs: resources.gpu.visibleDevices): " + (
    ", ".join(OPERATOR_ENV)
)


def _default_providers() -> list[ExecutionProvider]:
    # MIGraphX is AMD's supported ONNX Runtime path; the ROCm provider left ONNX Runtime in 1.23
    # and is only an opt-in fallback for images that still carry onnxruntime-rocm <= 1.22.
    return [ExecutionProvider.MIGRAPHX, ExecutionProvider.CPU]


def _cel_string(pattern: str) -> str:
    """`pattern` as a single-quoted CEL string literal."""
    return "'" + pattern.replace("\\", "\\\\").replace("'", "\\'") + "'"


_IS_VLLM = "has(self.engine) && self.engine == 'vllm'"

# The LoRA ranks vLLM accepts (--max-lora-rank).
LoraRank = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]
# hf://ORG/NAME[@REVISION] or s3://BUCKET/PATH: a directory of PEFT adapter files.
ADAPTER_URI_PATTERN = rf"^({HF_URI_PATTERN}|s3://[a-z0-9][-a-z0-9.]*[a-z0-9](/\S*)?)$"


class LoraSpec(_Spec):
    """How many LoRA adapters vLLM holds at once, and how large they may be."""

    max_loras: int = Field(4, ge=1, le=256, description="Adapters one batch may use at once (--max-loras).")
    max_lora_rank: LoraRank = Field(
        16, description="Largest adapter rank (--max-lora-rank); a larger one fails to load."
    )


class AdapterSpec(_Spec):
    """A LoRA adapter of the base model, served by name through the OpenAI API (engine vllm)."""

    name: str = Field(
        pattern=SAFE_NAME_PATTERN,
        max_length=63,
        description="The name clients ask for (the OpenAI `model` field); not the base model's.",
    )
    uri: str = Field(
        pattern=ADAPTER_URI_PATTERN,
        max_length=2048,
        description="hf://ORG/NAME[@REVISION] (with model.huggingFace's token and endpoint) or s3://BUCKET/PATH: "
        "a PEFT LoRA adapter's directory (adapter_config.json and its weights).",
    )


class TracingSpec(_Spec):
    """Where the serving container sends its OpenTelemetry traces (OTLP over HTTP)."""

    endpoint: str = Field(
        # A URL to post traces to: http or https, a host, an optional path; no user info, query or
        # fragment. Only this service's serving container sends there (never the operator, nor a
        # container that holds a credential).
        pattern=r"^https?://[^/?#@\s]+(/[^?#\s]*)?$",
        max_length=2048,
        description="OTLP/HTTP traces URL of a collector, e.g. http://otel-collector.observability:4318/v1/traces; "
        "the model server sends a span per request (queue wait, batch, runtime, encoding), vLLM its own request "
        "spans.",
    )
    sampling_ratio: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Share of new traces recorded; a caller's traceparent decides for the traces it continues.",
    )


class RuntimeSpec(_Spec):
    """The serving container: engine, image, providers, batching and probes."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "!has(self.port) || !has(self.metricsPort) || self.port != self.metricsPort",
                "runtime.port and runtime.metricsPort must differ",
            ),
            cel(f"!has(self.lora) || ({_IS_VLLM})", "runtime.lora applies to engine vllm only", ".lora"),
            cel(
                f"!has(self.grpcPort) || !({_IS_VLLM})",
                "runtime.grpcPort applies to engine modelServer only: vLLM serves no gRPC inference protocol",
                ".grpcPort",
            ),
            cel(
                "!has(self.grpcPort) || ((!has(self.port) || self.grpcPort != self.port)"
                " && (!has(self.metricsPort) || self.grpcPort != self.metricsPort))",
                "runtime.grpcPort must differ from runtime.port and runtime.metricsPort",
                ".grpcPort",
            ),
            cel(
                f"!has(self.maxModelLen) || ({_IS_VLLM})",
                "runtime.maxModelLen applies to engine vllm only",
                ".maxModelLen",
            ),
            cel(
                f"!({_IS_VLLM}) || !has(self.args) || self.args.all(a, a.matches({_cel_string(VLLM_ARG_PATTERN)})"
                f" && !a.matches({_cel_string(VLLM_RESERVED_ARG_PATTERN)}))",
                f"{VLLM_ARGS_MESSAGE}: each entry is --flag or --flag=value, and none may set a flag the operator sets "
                f"({', '.join('--' + f for f in VLLM_RESERVED_FLAGS)}, or an abbreviation)",
                ".args",
            ),
        )
    )

    engine: Engine = Field(
        Engine.MODEL_SERVER,
        description="modelServer runs the bundled server (ONNX/TorchScript, batching); vllm runs vLLM's "
        "OpenAI-compatible server for LLMs (tensor parallel over resources.gpu.count).",
    )
    image: str | None = Field(
        None,
        pattern=IMAGE_PATTERN,
        max_length=512,
        description="Serving image; the operator's model-server or vLLM image (per engine) when unset.",
    )
    max_model_len: int | None = Field(
        None,
        ge=16,
        le=10_000_000,
        description="vllm: longest context (prompt + output tokens) per request (--max-model-len); the model's own "
        "limit when unset.",
    )
    lora: LoraSpec | None = Field(
        None,
        description="vllm: serve LoRA adapters (spec.adapters), loaded and unloaded without a restart; on with "
        "these sizes whenever spec.adapters has one.",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    execution_providers: list[ExecutionProvider] = Field(
        default_factory=_default_providers,
        min_length=1,
        max_length=4,
        description="ONNX Runtime execution providers in order of preference; unavailable ones are skipped at "
        "load time.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    batching: BatchingSpec = Field(default_factory=BatchingSpec)
    port: Annotated[int, Field(ge=1, le=65535)] = 8080
    metrics_port: Annotated[int, Field(ge=1, le=65535)] = 9090
    grpc_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="The Open Inference Protocol over gRPC (inference.GRPCInferenceService, for Triton's and "
        "KServe's gRPC clients) on this port of the pod and the Service (KServe uses 8081); engine modelServer "
        "only. Off when unset.",
    )
    tracing: TracingSpec | None = Field(
        None, description="OpenTelemetry traces of the serving container; off when unset."
    )
    startup_timeout_seconds: int = Field(
        600,
        ge=10,
        le=7200,
        description="How long a replica may take to load and warm up its model before it is restarted.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=64,
        description="Extra environment of the model server; the variables the operator sets are refused.",
        json_schema_extra=cel(f"self.all(e, !has(e.name) || !(e.name in {_cel_list(OPERATOR_ENV)}))", _ENV_MESSAGE),
    )
    args: list[Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=list,
        max_length=64,
        description="Extra flags of the model server, or vLLM engine arguments (each one --flag or --flag=value); "
        "the flags the operator sets (and their prefixes) are refused.",
        json_schema_extra=cel(
            "self.all(a, !a.matches('^--"
            + _prefixes_pattern(tuple(f.removeprefix("--") for f in OPERATOR_FLAGS))
            + "(=|$)'))",
            _ARGS_MESSAGE,
        ),
    )


class GpuAllocation(StrEnum):
    """How a pod gets its GPUs: the device plugin's extended resource, or a DRA ResourceClaim."""

    DEVICE_PLUGIN = "devicePlugin"
    DRA = "dra"


class ResourceNaming(StrEnum):
    """The device plugin's --resource_naming_strategy: `single` advertises every GPU and partition
    as amd.com/gpu; `mixed` advertises partitions as amd.com/<compute>_<memory>."""

    SINGLE = "single"
    MIXED = "mixed"


_DEVICES = "self.visibleDevices.split(',')"


class GpuSpec(_Spec):
    """AMD GPUs (or GPU partitions) per replica, how they are allocated and which may be used."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "!has(self.count) || self.count > 0"
                " || !(has(self.productName) || has(self.family) || has(self.vram) || has(self.partition))",
                "GPU placement fields are set but resources.gpu.count is 0",
            ),
            cel(
                f"!has(self.visibleDevices) || !has(self.count) || size({_DEVICES}) == self.count",
                "resources.gpu.visibleDevices must list exactly resources.gpu.count devices",
                ".visibleDevices",
            ),
            cel(
                f"!has(self.visibleDevices) || !has(self.count) || {_DEVICES}.all(d, int(d) < self.count)",
                "resources.gpu.visibleDevices may only name devices 0 to resources.gpu.count-1 (indices within the "
                "pod's own GPUs)",
                ".visibleDevices",
            ),
            cel(
                f"!has(self.visibleDevices) || {_DEVICES}.all(d, {_DEVICES}.exists_one(e, int(e) == int(d)))",
                "resources.gpu.visibleDevices must not name a device twice",
                ".visibleDevices",
            ),
        )
    )

    count: int = Field(
        1,
        ge=0,
        le=16,
        description="GPUs (or GPU partitions) per replica: amd.com/gpu, amd.com/<partition> under mixed naming, "
        "or the count of a DRA claim; 0 runs on CPU. With nodes > 1: per node.",
    )
    nodes: int = Field(
        1,
        ge=1,
        le=64,
        description="vllm: nodes one replica spans. Above 1 each replica is a LeaderWorkerSet group of this many "
        "pods (leaderworkerset.x-k8s.io/v1): tensor parallel over count GPUs within a node, pipeline parallel "
        "across nodes, the leader serving the API; autoscaling adds and removes whole groups.",
    )
    allocation: GpuAllocation | None = Field(
        None,
        description="devicePlugin asks for an extended resource; dra for a ResourceClaim of deviceClassName "
        "(resource.k8s.io/v1, Kubernetes 1.34+). Unset: the operator's default (chart value gpu.allocation).",
    )
    resource_naming: ResourceNaming | None = Field(
        None,
        description="The device plugin's resource naming strategy on the cluster: mixed turns partition into "
        "the resource amd.com/<partition>. Unset: the operator's default (chart value gpu.resourceNaming).",
    )
    device_class_name: DnsSubdomain = Field(
        DRA_DEVICE_CLASS,
        description="DeviceClass of the DRA claim (allocation dra).",
    )
    product_name: NodeLabelValue | None = Field(
        None,
        description="Product name, e.g. AMD_Instinct_MI300X_OAM: node label amd.com/gpu.product-name, or the "
        "DRA attribute productName.",
    )
    family: NodeLabelValue | None = Field(
        None,
        description="GPU family, e.g. AI: node label amd.com/gpu.family, or the DRA attribute family.",
    )
    vram: str | None = Field(
        None,
        pattern=r"^[0-9]+[GM]$",
        max_length=16,
        description="Memory per GPU or partition, e.g. 192G: node label amd.com/gpu.vram, or the DRA capacity "
        "memory rounded the same way.",
    )
    partition: str | None = Field(
        None,
        pattern=PARTITION_PATTERN,
        max_length=32,
        description="Compute and memory partition mode, e.g. cpx_nps4: the resource amd.com/<partition> under "
        "mixed naming, the node label amd.com/gpu.compute-memory-partition under single naming, or the DRA "
        "attribute partitionProfile.",
    )
    visible_devices: str | None = Field(
        None,
        pattern=r"^[0-9]+(,[0-9]+)*$",
        max_length=64,
        description="Order of the pod's GPUs for ROCR_VISIBLE_DEVICES, a permutation of 0..count-1 (the default); "
        "HIP_VISIBLE_DEVICES is always 0..count-1 of those.",
    )
    supplemental_groups: list[Annotated[int, Field(ge=1, le=4294967295)]] | None = Field(
        None,
        max_length=8,
        description="Pod supplemental groups that may open /dev/kfd and /dev/dri/renderD* (the host's video and "
        "render GIDs); never 0, and only those the platform allows (chart value policy.supplementalGroups). Unset: "
        "the operator's default (chart value gpu.supplementalGroups).",
    )


class ResourcesSpec(_Spec):
    gpu: GpuSpec = Field(default_factory=GpuSpec)
    cpu: Quantity = "4"
    memory: Quantity = "16Gi"
    shm_size: Quantity = Field("8Gi", description="Size of the memory-backed /dev/shm.")


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


class ScaleToZeroSpec(_Spec):
    """Scale to zero replicas when idle, and back on the first request (autoscaling.minReplicas 0).

    At zero the service's requests go to the activator (installed by the chart), which holds each
    one, wakes the service and answers it once a replica is Ready."""

    idle_seconds: int = Field(
        300, ge=10, le=86400, description="Seconds without a request after which the service goes to zero replicas."
    )
    max_wait_seconds: int = Field(
        600,
        ge=1,
        le=3600,
        description="The longest a request held at zero waits for a Ready replica (a cold start: image pull, "
        "model fetch, compilation); past it the activator answers 503 with Retry-After.",
    )
    max_held_requests: int = Field(
        1000, ge=1, le=100000, description="Requests held at once for this service; beyond them: 429."
    )


class AutoscalingSpec(_Spec):
    """Latency-SLO autoscaling; absent means a fixed `spec.replicas`."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
                "autoscaling.minReplicas must be <= autoscaling.maxReplicas",
                ".minReplicas",
            ),
            cel(
                "(has(self.minReplicas) && self.minReplicas == 0) == has(self.scaleToZero)",
                "autoscaling.minReplicas 0 and autoscaling.scaleToZero go together: scaleToZero says when to go "
                "to zero and how long a request may wait for the first replica",
                ".scaleToZero",
            ),
            cel(
                "!has(self.scaleToZero) || !has(self.mode) || self.mode == 'builtin'",
                "autoscaling.scaleToZero needs mode builtin: an HPA cannot go below one replica, and KEDA "
                "would wake the service only after its next Prometheus poll while the first request waits",
                ".mode",
            ),
        )
    )

    mode: AutoscalingMode = Field(
        AutoscalingMode.BUILTIN,
        description="builtin runs the operator's own loop; hpa and keda emit an HPA or a KEDA ScaledObject instead.",
    )
    min_replicas: int = Field(1, ge=0, description="0 scales the service to zero when idle (with scaleToZero).")
    max_replicas: Annotated[int, Field(ge=1, le=1000)]
    metric: Metric = Metric.LATENCY_P95_MS
    target: float = Field(
        gt=0,
        description="Target value of the metric per replica (ms for latency, requests for queueDepth, req/s for "
        "rps, percent for gpuUtilization).",
    )
    prometheus_url: str = Field(
        DEFAULT_PROMETHEUS_URL,
        # A base URL: the operator appends /api/v1/query itself. No user info, query or fragment,
        # so the URL cannot steer a request anywhere but a Prometheus query path.
        pattern=r"^https?://[^/?#@\s]+(/[^?#\s]*)?$",
        max_length=2048,
        description="Base URL of the Prometheus HTTP API (scheme, host, port, optional path prefix); "
        "it must be on the operator's allowed list (chart value prometheus.allowedUrls).",
    )
    prometheus_auth: PrometheusAuth | None = None
    interval_seconds: Annotated[int, Field(ge=1, le=3600)] = 15
    window_seconds: int = Field(60, ge=10, le=3600, description="Range of the PromQL rate() window.")
    tolerance: Annotated[float, Field(ge=0, lt=1)] = 0.1
    scale_down_stabilization_seconds: Annotated[int, Field(ge=0, le=3600)] = 300
    scale_up: ScalingRule = Field(default_factory=ScalingRule)
    scale_down: ScalingRule = Field(default_factory=ScalingRule)
    scale_to_zero: ScaleToZeroSpec | None = Field(
        None, description="Go to zero replicas when idle and back on the first request (with minReplicas 0)."
    )


LabelValue = Annotated[str, Field(pattern=LABEL_VALUE_PATTERN, max_length=63)]


class SchedulingSpec(_Spec):
    node_selector: dict[str, LabelValue] = Field(
        default_factory=dict,
        max_length=32,
        json_schema_extra=cel(
            "self.all(k, size(k) <= 317 && k.matches('" + LABEL_KEY_PATTERN.replace("\\", "\\\\") + "'))",
            "scheduling.nodeSelector keys must be valid label keys",
        ),
    )
    priority_class_name: DnsSubdomain | None = None
    service_account_name: DnsSubdomain | None = None
    automount_service_account_token: bool = Field(
        False,
        description="Mount the service account's API token in the model-server pods; off, since the server "
        "needs no Kubernetes API.",
    )


class ScorerWeights(_Spec):
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


class EndpointPickerSpec(_Spec):
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


# A Gateway API hostname (a DNS name, or one wildcard label first), as HTTPRoute accepts it.
HOSTNAME_PATTERN = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class ParentRef(_Spec):
    """A Gateway the route attaches to (the Gateway's own allowedRoutes decide whether it may)."""

    name: DnsSubdomain
    namespace: DnsLabel | None = Field(None, description="The Gateway's namespace; the service's when unset.")
    section_name: DnsSubdomain | None = Field(None, description="One listener of the Gateway; all when unset.")


class HTTPRouteSpec(_Spec):
    """A Gateway API HTTPRoute to the service, NAME: its requests for `hostnames` through the
    parent Gateways. A canary rollout splits it by weights, exactly, instead of by replicas."""

    parent_refs: list[ParentRef] = Field(min_length=1, max_length=32)
    hostnames: list[Annotated[str, Field(pattern=HOSTNAME_PATTERN, max_length=253)]] = Field(
        default_factory=list, max_length=16, description="Hosts the route answers; every host when empty."
    )


class RoutingSpec(_Spec):
    """Gateway routing to the pods."""

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
    endpoint_picker: EndpointPickerSpec | None = None
    http_route: HTTPRouteSpec | None = Field(
        None,
        description="Emit a Gateway API HTTPRoute (gateway.networking.k8s.io/v1) to the service (or to its "
        "InferencePool); a canary rollout then splits traffic by its weights.",
    )


_VLLM_METRICS = ", ".join(f"'{m.value}'" for m in sorted(ENGINE_METRICS[Engine.VLLM]))


class RolloutStrategy(StrEnum):
    ROLLING = "rolling"
    CANARY = "canary"


# The latency metrics a canary can be judged on, per engine (a quantile in ms).
CANARY_METRICS: dict[Engine, tuple[Metric, ...]] = {
    Engine.MODEL_SERVER: (Metric.LATENCY_P95_MS, Metric.LATENCY_P99_MS),
    Engine.VLLM: (Metric.TTFT_P95_MS, Metric.ITL_P95_MS, Metric.E2E_LATENCY_P95_MS),
}


def _canary_metrics(engine: Engine) -> str:
    return ", ".join(f"'{m.value}'" for m in CANARY_METRICS[engine])


class CanaryAnalysis(_Spec):
    """How a canary is judged, from Prometheus, on the canary's pods alone."""

    metric: Metric | None = Field(
        None,
        description="Latency metric judged: latencyP95Ms or latencyP99Ms (modelServer), ttftP95Ms, itlP95Ms or "
        "e2eLatencyP95Ms (vllm); unset: latencyP95Ms, or ttftP95Ms for vllm.",
    )
    max_latency_ms: float = Field(gt=0, le=3_600_000, description="A check fails when the metric is above this.")
    max_error_ratio: float = Field(
        0.05, ge=0, le=1, description="A check fails when more than this share of the canary's requests got a 5xx."
    )
    min_requests: int = Field(
        20, ge=1, le=1_000_000, description="Requests the canary must have served in the window for a verdict."
    )
    failure_limit: int = Field(2, ge=1, le=100, description="Failed checks in a row that roll the canary back.")
    interval_seconds: int = Field(15, ge=1, le=3600, description="Seconds between checks.")
    window_seconds: int = Field(60, ge=10, le=3600, description="Range of the checks' rate() window.")
    prometheus_url: str | None = Field(
        None,
        pattern=r"^https?://[^/?#@\s]+(/[^?#\s]*)?$",
        max_length=2048,
        description="Base URL of the Prometheus HTTP API; unset: autoscaling.prometheusUrl, else "
        f"{DEFAULT_PROMETHEUS_URL}. It must be on the operator's allowed list.",
    )


class CanarySpec(_Spec):
    """The steps of a canary: traffic shares the candidate takes before it is promoted."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            "!has(self.steps) || (self.steps.isSorted()"
            " && self.steps.all(s, self.steps.indexOf(s) == self.steps.lastIndexOf(s)))",
            "rollout.canary.steps must be increasing traffic percentages",
            ".steps",
        )
    )

    steps: list[Annotated[int, Field(ge=1, le=99)]] = Field(
        default_factory=lambda: [10, 50],
        min_length=1,
        max_length=10,
        description="Percent of the traffic the candidate serves at each step; after the last, it is promoted.",
    )
    step_seconds: int = Field(
        60, ge=1, le=86400, description="At least this long per step, with a passing check at its end."
    )
    analysis: CanaryAnalysis


class RolloutSpec(_Spec):
    """How a change of the pods reaches the replicas."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            "!has(self.strategy) || self.strategy != 'canary' || has(self.canary)",
            "rollout.canary is required with strategy: canary",
            ".canary",
        )
    )

    strategy: RolloutStrategy = Field(
        RolloutStrategy.ROLLING,
        description="rolling: the Deployment's rolling update; canary: a candidate Deployment beside the stable "
        "one, promoted step by step while its latency and errors hold, rolled back when they do not.",
    )
    canary: CanarySpec | None = None


_MULTI_NODE = (
    "has(self.resources) && has(self.resources.gpu) && has(self.resources.gpu.nodes) && self.resources.gpu.nodes > 1"
)
_IS_VLLM_SPEC = "has(self.runtime) && has(self.runtime.engine) && self.runtime.engine == 'vllm'"


class InferenceServiceSpec(_Spec):
    """`spec` of an InferenceService."""

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
                " || ((has(self.runtime) && has(self.runtime.engine) && self.runtime.engine == 'vllm')"
                f" == (self.autoscaling.metric in [{_VLLM_METRICS}]))",
                "autoscaling.metric must be one the engine exports: ttftP95Ms, itlP95Ms, e2eLatencyP95Ms, "
                "requestsWaiting or kvCacheUsage for vllm; latencyP95Ms, latencyP99Ms, queueDepth, rps or "
                "gpuUtilization for modelServer",
                ".autoscaling.metric",
            ),
            cel(
                "!has(self.rollout) || !has(self.rollout.canary) || !has(self.rollout.canary.analysis)"
                " || !has(self.rollout.canary.analysis.metric)"
                " || ((has(self.runtime) && has(self.runtime.engine) && self.runtime.engine == 'vllm')"
                f" ? self.rollout.canary.analysis.metric in [{_canary_metrics(Engine.VLLM)}]"
                f" : self.rollout.canary.analysis.metric in [{_canary_metrics(Engine.MODEL_SERVER)}])",
                "rollout.canary.analysis.metric must be a latency the engine exports: latencyP95Ms or latencyP99Ms "
                "for modelServer; ttftP95Ms, itlP95Ms or e2eLatencyP95Ms for vllm",
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
                f"{_MULTI_NODE} ? ({_IS_VLLM_SPEC}) : true",
                "resources.gpu.nodes above 1 needs runtime.engine vllm",
                ".resources.gpu.nodes",
            ),
            cel(
                f"{_MULTI_NODE}"
                " ? !(has(self.rollout) && has(self.rollout.strategy) && self.rollout.strategy == 'canary')"
                " && !(has(self.adapters) && size(self.adapters) > 0) : true",
                "resources.gpu.nodes above 1 does not take a canary rollout or adapters yet",
                ".resources.gpu.nodes",
            ),
            cel(
                f"{_MULTI_NODE} && has(self.runtime) && has(self.runtime.args)"
                f" ? self.runtime.args.all(a, !a.matches({_cel_string(VLLM_MULTI_NODE_ARG_PATTERN)})) : true",
                "runtime.args may not set what a multi-node replica sets: "
                + ", ".join("--" + f for f in VLLM_MULTI_NODE_FLAGS)
                + " (or an abbreviation)",
                ".runtime.args",
            ),
            cel(
                "!has(self.adapters) || size(self.adapters) == 0"
                " || (has(self.runtime) && has(self.runtime.engine) && self.runtime.engine == 'vllm')",
                "spec.adapters needs runtime.engine vllm",
                ".adapters",
            ),
            cel(
                "!has(self.autoscaling) || !has(self.autoscaling.scaleToZero)"
                " || !has(self.routing) || !has(self.routing.inferencePool) || !self.routing.inferencePool",
                "autoscaling.scaleToZero holds requests at the Service, and an InferencePool's gateway sends them "
                "to the pods directly: at zero they would fail; use routing.httpRoute or the Service",
                ".autoscaling.scaleToZero",
            ),
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

    @field_validator("adapters")
    @classmethod
    def _unique_adapters(cls, adapters: list[AdapterSpec]) -> list[AdapterSpec]:
        names = [a.name for a in adapters]
        if len(set(names)) != len(names):
            raise ValueError("adapter names must be unique")
        return adapters


Int64 = Annotated[int, Field(json_schema_extra={"format": "int64"})]


class _Status(BaseModel):
    """Base for status models: what the operator writes, camelCase on the wire."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class Condition(_Status):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str | None = None
    message: str | None = None
    last_transition_time: datetime | None = None
    observed_generation: Int64 | None = None


class AutoscalerStatus(_Status):
    metric: str | None = None
    current_value: float | None = None
    latency_p95_ms: float | None = None
    desired_replicas: int | None = None
    last_scale_time: datetime | None = None
    reason: str | None = None


class CanaryCheck(_Status):
    """The last analysis of the canary's pods."""

    time: datetime | None = None
    latency_ms: float | None = None
    error_ratio: float | None = None
    requests: float | None = None
    verdict: str | None = None


class RolloutStatus(_Status):
    phase: str | None = Field(None, description="Stable, Progressing, Promoted or RolledBack.")
    stage: str | None = Field(None, description="What kubectl shows: canary 10%, promoted, rolled back.")
    revision: str | None = Field(None, description="Pod template hash of the candidate.")
    stable_revision: str | None = None
    step: int | None = None
    weight: int | None = Field(None, description="Percent of the traffic the step gives the candidate.")
    step_started: datetime | None = None
    failures: int | None = None
    message: str | None = None
    stable_digest: str | None = Field(None, description="Digest of the manifest the stable Deployment was given.")
    traffic: str | None = Field(
        None,
        description="How the canary's share is set: httpRoute (route weights, exact) or replicas (by its "
        "share of the pods behind the one Service, approximate).",
    )
    last_check: CanaryCheck | None = None


class AdapterPodStatus(_Status):
    pod: str
    state: str = Field(description="Pending, Loading, Ready or Failed on this replica.")
    reason: str | None = None


class AdapterStatus(_Status):
    name: str
    state: str = Field(description="Ready on every replica, Loading, or Failed on one (see pods).")
    ready_replicas: int | None = None
    replicas: int | None = Field(None, description="Running replicas asked.")
    pods: list[AdapterPodStatus] | None = Field(None, description="Per replica (the first 16).")


class InferenceServiceStatus(_Status):
    """`status` of an InferenceService (schema only: status.py writes it as plain mappings)."""

    observed_generation: Int64 | None = None
    replicas: int | None = None
    ready_replicas: int | None = None
    updated_replicas: int | None = None
    selector: str | None = Field(None, description="Label selector of the pods, for the scale subresource.")
    url: str | None = None
    conditions: list[Condition] | None = Field(
        None, json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}
    )
    autoscaler: AutoscalerStatus | None = None
    rollout: RolloutStatus | None = None
    adapters: list[AdapterStatus] | None = Field(
        None, json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}
    )


class SpecError(ValueError):
    """A spec the operator cannot act on; `field` names where, `message` says why."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


def check_name(name: str) -> None:
    """Raise SpecError unless `name` can name the Service and label the pods (as the CRD's rule)."""
    if len(name) > NAME_MAX_LENGTH or not re.match(NAME_PATTERN, name):
        raise SpecError("metadata.name", f"{name!r}: {NAME_MESSAGE.removeprefix('metadata.name ')}")


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
