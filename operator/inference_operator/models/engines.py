"""What serves the model (the bundled model server or vLLM), what each engine exports, and the
flags and variables the operator sets on its command line (which runtime.args and runtime.env may
therefore not set).
"""

from __future__ import annotations

from enum import StrEnum

from .base import flag_prefixes

DEFAULT_IMAGE = "ghcr.io/rocm-inference/model-server:0.1.0"
# vLLM's ROCm build of its OpenAI-compatible server; the operator's --vllm-image overrides it.
DEFAULT_VLLM_IMAGE = "docker.io/vllm/vllm-openai-rocm:v0.32.0"

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


# One `--flag` or `--flag=value` naming (a prefix of) a reserved flag; `.key`/`+` are vLLM's
# JSON-argument syntax for the same flag. Shared with the CRD's CEL rule.
VLLM_RESERVED_ARG_PATTERN = "^--(" + "|".join(flag_prefixes(f) for f in VLLM_RESERVED_FLAGS) + ")([.+=][\\s\\S]*)?$"
VLLM_ARGS_MESSAGE = "runtime.args for engine vllm"
VLLM_MULTI_NODE_ARG_PATTERN = "^--(" + "|".join(flag_prefixes(f) for f in VLLM_MULTI_NODE_FLAGS) + ")([.+=][\\s\\S]*)?$"
