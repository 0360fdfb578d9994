"""What serves the model (the bundled model server or vLLM): the engine table (what each engine
exports and supports), and the flags and variables the operator sets on its command line (which
runtime.args and runtime.env may therefore not set).

An engine is one entry here (`ENGINES`), one in the PromQL layer (`prometheus.promql.SERIES`: the
names of its series) and one among the builders (`builders.engines.PODS`: its containers);
tests/operator/test_engine_table.py holds every engine to all three.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from enum import StrEnum

from .base import flag_prefixes

DEFAULT_IMAGE = "ghcr.io/rocm-inference/model-server:0.1.0"
# vLLM's ROCm build of its OpenAI-compatible server; the operator's --vllm-image overrides it.
DEFAULT_VLLM_IMAGE = "docker.io/vllm/vllm-openai-rocm:v0.32.0"

# Flags of `model_server serve` the operator sets itself (builders/model_server.server_args) or that
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


@dataclass(frozen=True)
class EngineTraits:
    """What the spec may ask of one engine; the CRD's rules and the builders read it here."""

    # The scaling metrics it exports: a metric of another engine would never have data.
    metrics: frozenset[Metric]
    # The latencies a canary can be judged on (a quantile in ms); the first is the default.
    canary_metrics: tuple[Metric, ...]
    # It answers /metrics on its API port (no separate metrics port in the pod).
    metrics_on_api_port: bool = False
    # runtime.grpcPort: it serves the Open Inference Protocol over gRPC.
    grpc: bool = False
    # runtime.lora and spec.adapters: LoRA adapters loaded at run time.
    lora: bool = False
    # runtime.maxModelLen: a context length to cap.
    max_model_len: bool = False
    # resources.gpu.nodes > 1: one replica spread over several nodes.
    multi_node: bool = False
    # routing.router: the vLLM router in front of its replicas (it speaks the OpenAI API).
    router: bool = False


ENGINES: dict[Engine, EngineTraits] = {
    Engine.MODEL_SERVER: EngineTraits(
        metrics=frozenset(
            {Metric.LATENCY_P95_MS, Metric.LATENCY_P99_MS, Metric.QUEUE_DEPTH, Metric.RPS, Metric.GPU_UTILIZATION}
        ),
        canary_metrics=(Metric.LATENCY_P95_MS, Metric.LATENCY_P99_MS),
        grpc=True,
    ),
    Engine.VLLM: EngineTraits(
        metrics=frozenset(
            {
                Metric.TTFT_P95_MS,
                Metric.ITL_P95_MS,
                Metric.E2E_LATENCY_P95_MS,
                Metric.REQUESTS_WAITING,
                Metric.KV_CACHE_USAGE,
            }
        ),
        canary_metrics=(Metric.TTFT_P95_MS, Metric.ITL_P95_MS, Metric.E2E_LATENCY_P95_MS),
        metrics_on_api_port=True,
        lora=True,
        max_model_len=True,
        multi_node=True,
        router=True,
    ),
}
DEFAULT_ENGINE = Engine.MODEL_SERVER


def engines_where(trait: Callable[[EngineTraits], bool]) -> tuple[Engine, ...]:
    return tuple(engine for engine, traits in ENGINES.items() if trait(traits))


def metrics_in_order(metrics: Collection[Metric]) -> list[Metric]:
    """`metrics` in the order Metric declares them (rules and messages read the same each time)."""
    return [metric for metric in Metric if metric in metrics]


def metrics_per_engine(allowed: Callable[[EngineTraits], Collection[Metric]]) -> str:
    """`a, b or c for modelServer; d or e for vllm`: a rule's message, a field's description."""

    def listed(engine: Engine) -> str:
        names = [m.value for m in metrics_in_order(allowed(ENGINES[engine]))]
        return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]

    return "; ".join(f"{listed(engine)} for {engine.value}" for engine in ENGINES)


def engine_names(engines: tuple[Engine, ...]) -> str:
    """`vllm`, or `modelServer or vllm`: the engines in a rule's message."""
    return " or ".join(engines)


def cel_engine_in(engines: tuple[Engine, ...], runtime: str = "self") -> str:
    """CEL: the `engine` of the object at `runtime` (a RuntimeSpec, or a spec's `self.runtime`)
    is one of `engines`, an unset engine (or runtime) being the default one."""
    if DEFAULT_ENGINE in engines:
        others = tuple(engine for engine in ENGINES if engine not in engines)
        return f"!({cel_engine_in(others, runtime)})" if others else "true"
    if not engines:
        return "false"
    guards = ([f"has({runtime})"] if runtime != "self" else []) + [f"has({runtime}.engine)"]
    values = ", ".join(f"'{engine.value}'" for engine in engines)
    test = f"{runtime}.engine == {values}" if len(engines) == 1 else f"{runtime}.engine in [{values}]"
    return " && ".join([*guards, test])


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


# One `--flag` or `--flag=value` naming (a prefix of) a reserved flag; `.key`/`+` are vLLM's
# JSON-argument syntax for the same flag. Shared with the CRD's CEL rule.
VLLM_RESERVED_ARG_PATTERN = "^--(" + "|".join(flag_prefixes(f) for f in VLLM_RESERVED_FLAGS) + ")([.+=][\\s\\S]*)?$"
VLLM_ARGS_MESSAGE = "runtime.args for engine vllm"
VLLM_MULTI_NODE_ARG_PATTERN = "^--(" + "|".join(flag_prefixes(f) for f in VLLM_MULTI_NODE_FLAGS) + ")([.+=][\\s\\S]*)?$"
