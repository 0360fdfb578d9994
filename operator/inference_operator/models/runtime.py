"""The serving container: engine, image, providers, batching, ports, tracing, env and args."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from .base import SpecModel, cel, cel_list, cel_rules, cel_string, prefixes_pattern
from .engines import (
    CHECKED_ARGS,
    DEFAULT_ENGINE,
    OPERATOR_ENV,
    OPERATOR_FLAGS,
    Engine,
    args_message,
    cel_engine_in,
    engine_names,
    engines_where,
)
from .names import IMAGE_PATTERN


class ExecutionProvider(StrEnum):
    MIGRAPHX = "MIGraphXExecutionProvider"
    ROCM = "ROCMExecutionProvider"
    CUDA = "CUDAExecutionProvider"
    CPU = "CPUExecutionProvider"


class BatchingSpec(SpecModel):
    """Dynamic batching of the model server (engine modelServer): concurrent requests are run as one
    batch on the runtime, up to a size and after a short wait; vLLM batches by itself."""

    max_batch_size: int = Field(
        16,
        ge=1,
        le=1024,
        description="Most requests (rows of the batch dimension) run in one batch on the runtime (--max-batch-size).",
    )
    max_delay_ms: float = Field(
        5,
        ge=0,
        le=1000,
        description="Milliseconds a request may wait for others to join its batch (--max-delay-ms); 0 runs each "
        "batch as soon as the runtime is free. A longer wait gives larger batches and adds to latency.",
    )
    max_queue: int = Field(
        256,
        ge=1,
        le=100_000,
        description="Requests waiting for a batch per replica (--max-queue); beyond them a request is refused with "
        "429, so overload is answered at once rather than queued without bound.",
    )


class EnvVar(SpecModel):
    """An environment variable of the serving container."""

    name: str = Field(
        pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$",
        max_length=256,
        description="Variable name; those the operator sets (GPU selection, the server's own settings, Hub and "
        "tracing variables) are refused.",
    )
    # 64 variables of at most 4 KiB: a pod spec stays far below etcd's object size limit.
    value: str = Field("", max_length=4096, description="Variable value, taken literally (no $(VAR) expansion).")


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


_LORA = engines_where(lambda traits: traits.lora)
_GRPC = engines_where(lambda traits: traits.grpc)
_MAX_MODEL_LEN = engines_where(lambda traits: traits.max_model_len)

# The LoRA ranks vLLM accepts (--max-lora-rank).
LoraRank = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]


class LoraSpec(SpecModel):
    """How many LoRA adapters vLLM holds at once, and how large they may be."""

    max_loras: int = Field(4, ge=1, le=256, description="Adapters one batch may use at once (--max-loras).")
    max_lora_rank: LoraRank = Field(
        16, description="Largest adapter rank (--max-lora-rank); a larger one fails to load."
    )


# runtime.tracing.endpoint: where the serving container posts its spans. Not the pod itself nor
# the node: in a vLLM pod loopback is what the adapters guard trusts, and a link-local address is
# the cloud's metadata service. A host is an ASCII DNS name, a dotted IPv4 address or a bracketed
# IPv6 one (no percent-encoding, no Unicode a resolver would fold into `localhost`).
TRACING_ENDPOINT_PATTERN = r"^https?://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?(/[^?#\s]*)?$"
_AFTER_HOST = r"(:[0-9]*)?(/.*)?$"
# Loopback, link-local and unspecified hosts: localhost names, 169.254.0.0/16, and IPv6 literals
# whose first group is zero (::1, ::, ::ffff:127.0.0.1 and every other form with an IPv4 inside)
# or in fe80::/10.
TRACING_LOCAL_HOST = (
    r"(?i)^https?://((([a-z0-9-]+\.)*localhost|localhost\.localdomain|ip6-localhost|ip6-loopback)\.?"
    r"|169\.254\.[0-9]+\.[0-9]+|\[(0{0,4}:|fe[89ab][0-9a-f]:)[^\]]*\])" + _AFTER_HOST
)
# A host whose last label is a number is read as an IPv4 address, whatever its form (2130706433,
# 0x7f.1, 0177.0.0.1, 127.1): it must then be four decimal numbers, the first neither 0 nor 127.
TRACING_NUMERIC_HOST = r"(?i)^https?://([a-z0-9-]*\.)*([0-9]+|0x[0-9a-f]*)\.?" + _AFTER_HOST
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_FIRST_OCTET = r"(25[0-5]|2[0-4][0-9]|1[013-9][0-9]|12[0-689]|[1-9][0-9]|[1-9])"
TRACING_DOTTED_HOST = rf"^https?://{_FIRST_OCTET}(\.{_OCTET}){{3}}" + _AFTER_HOST
TRACING_LOCAL_MESSAGE = (
    "runtime.tracing.endpoint must not name the pod or its node: no loopback, link-local or unspecified address, "
    "no localhost name, and an IPv4 address written as four decimal numbers"
)
TRACING_PORT_MESSAGE = (
    "runtime.tracing.endpoint must not be on a port of the pod's own (runtime.port, runtime.metricsPort, "
    "runtime.grpcPort)"
)


# CEL: whether the endpoint names one of the pod's own ports (each where the spec has it) after
# its host. The port is compared as a number: a string or regex built from a port (`string(p)`) is
# priced by the API server as unbounded, far above a rule's budget.
_OWN_PORTS = " + ".join(f"(has(self.{field}) ? [self.{field}] : [])" for field in ("port", "metricsPort", "grpcPort"))
_AUTHORITY = "self.tracing.endpoint.split('/')[2]"
_ENDPOINT_PORT = f"int({_AUTHORITY}.split(':')[size({_AUTHORITY}.split(':')) - 1])"
TRACING_WITH_PORT = r"^https?://[^/]*:[0-9]+(/|$)"
_ON_OWN_PORT = (
    f"self.tracing.endpoint.matches({cel_string(TRACING_WITH_PORT)}) && ({_OWN_PORTS}).exists(p, p == {_ENDPOINT_PORT})"
)


class TracingSpec(SpecModel):
    """Where the serving container sends its OpenTelemetry traces (OTLP over HTTP)."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            f"!has(self.endpoint) || !self.endpoint.matches({cel_string(TRACING_LOCAL_HOST)})"
            f" && (!self.endpoint.matches({cel_string(TRACING_NUMERIC_HOST)})"
            f" || self.endpoint.matches({cel_string(TRACING_DOTTED_HOST)}))",
            TRACING_LOCAL_MESSAGE,
            ".endpoint",
        )
    )

    endpoint: str = Field(
        # A URL to post traces to: http or https, a host, an optional port and path; no user info,
        # query or fragment. Only this service's serving container sends there (never the
        # operator, nor a container that holds a credential).
        pattern=TRACING_ENDPOINT_PATTERN,
        max_length=2048,
        description="OTLP/HTTP traces URL of a collector, e.g. http://otel-collector.observability:4318/v1/traces; "
        "the model server sends a span per request (queue wait, batch, runtime, encoding), vLLM its own request "
        "spans. Not a loopback, link-local or unspecified address, nor a port of the pod's own.",
    )
    sampling_ratio: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Share of new traces recorded; a caller's traceparent decides for the traces it continues.",
    )


class RuntimeSpec(SpecModel):
    """The serving container: which engine serves the model and in which image, ONNX Runtime's
    execution providers, batching, ports, startup budget, tracing, and extra environment and
    flags."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "!has(self.port) || !has(self.metricsPort) || self.port != self.metricsPort",
                "runtime.port and runtime.metricsPort must differ",
            ),
            cel(
                f"!has(self.lora) || ({cel_engine_in(_LORA)})",
                f"runtime.lora applies to engine {engine_names(_LORA)} only",
                ".lora",
            ),
            cel(
                f"!has(self.grpcPort) || ({cel_engine_in(_GRPC)})",
                f"runtime.grpcPort applies to engine {engine_names(_GRPC)} only: "
                "vLLM serves no gRPC inference protocol",
                ".grpcPort",
            ),
            cel(
                f"!has(self.tracing) || !has(self.tracing.endpoint) || !({_ON_OWN_PORT})",
                TRACING_PORT_MESSAGE,
                ".tracing.endpoint",
            ),
            cel(
                "!has(self.grpcPort) || ((!has(self.port) || self.grpcPort != self.port)"
                " && (!has(self.metricsPort) || self.grpcPort != self.metricsPort))",
                "runtime.grpcPort must differ from runtime.port and runtime.metricsPort",
                ".grpcPort",
            ),
            cel(
                f"!has(self.maxModelLen) || ({cel_engine_in(_MAX_MODEL_LEN)})",
                f"runtime.maxModelLen applies to engine {engine_names(_MAX_MODEL_LEN)} only",
                ".maxModelLen",
            ),
            *(
                cel(
                    f"!({cel_engine_in((engine,))}) || !has(self.args)"
                    f" || self.args.all(a, a.matches({cel_string(args.pattern)})"
                    f" && !a.matches({cel_string(reserved)}))",
                    f"{args_message(engine)}: each entry is --flag or --flag=value, and none may set a flag the "
                    f"operator sets ({', '.join('--' + f for f in args.flags)}, or an abbreviation)",
                    ".args",
                )
                for engine, (args, reserved) in CHECKED_ARGS.items()
            ),
        )
    )

    engine: Engine = Field(
        DEFAULT_ENGINE,
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
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        "IfNotPresent", description="When the kubelet pulls runtime.image (the container's imagePullPolicy)."
    )
    execution_providers: list[ExecutionProvider] = Field(
        default_factory=_default_providers,
        min_length=1,
        max_length=4,
        description="ONNX Runtime execution providers in order of preference; unavailable ones are skipped at "
        "load time.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    batching: BatchingSpec = Field(default_factory=BatchingSpec)
    port: int = Field(
        8080,
        ge=1,
        le=65535,
        description="Container port of the inference API (REST, the Open Inference Protocol; vLLM's OpenAI API), "
        "also probed for health; the Service serves it on port 80 (http). Must differ from metricsPort.",
    )
    metrics_port: int = Field(
        9090,
        ge=1,
        le=65535,
        description="Port of Prometheus /metrics: the model server's container port and the Service's port "
        "metrics (engine vllm answers /metrics on runtime.port, so there it is the Service's port only). Must "
        "differ from port.",
    )
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
        json_schema_extra=cel(f"self.all(e, !has(e.name) || !(e.name in {cel_list(OPERATOR_ENV)}))", _ENV_MESSAGE),
    )
    args: list[Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=list,
        max_length=64,
        description="Extra flags of the model server, or vLLM engine arguments (each one --flag or --flag=value); "
        "the flags the operator sets (and their prefixes) are refused.",
        json_schema_extra=cel(
            "self.all(a, !a.matches('^--"
            + prefixes_pattern(tuple(f.removeprefix("--") for f in OPERATOR_FLAGS))
            + "(=|$)'))",
            _ARGS_MESSAGE,
        ),
    )
