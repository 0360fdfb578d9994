"""The bundled model server (`python -m model_server serve`): ONNX Runtime or TorchScript models
with dynamic batching, the Open Inference Protocol over HTTP and gRPC, metrics on a port of their
own; and its part of the pod: the serving container, its command line, probes and compile caches."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..jsontypes import JsonObject
from .base import (
    MIGRAPHX,
    MIOPEN,
    CacheSite,
    Engine,
    EnginePod,
    GpuGauge,
    GroupMembers,
    ImageSetting,
    Metric,
    PodGauge,
    PodRate,
    Quantile,
    ReservedArgs,
    ScalingName,
    Series,
    ServiceValues,
    SharedPod,
    Traits,
)

LATENCY_HISTOGRAM = "model_server_request_duration_seconds"
REQUESTS_TOTAL = "model_server_requests_total"
QUEUE_DEPTH = "model_server_queue_depth"
INFLIGHT = "model_server_inflight_requests"
GPU_UTILIZATION = "model_server_gpu_utilization_percent"
CONTAINER = "model-server"
# The image it runs, which also carries the model fetcher, the vLLM front and the adapters
# sidecar (the chart's images.modelServer).
DEFAULT_IMAGE = "ghcr.io/rocm-inference/model-server:0.1.0"
# What the server compiles (builders/compile_cache.py): on the cache claim, or in the pod's /tmp volume.
COMPILE_CACHE_DIR = "/var/cache/model-server"
COMPILE_CACHE_PREFIX = "model-server-cache"
POD_COMPILE_CACHE_DIR = "/tmp/model-server-cache"
PROBE_PERIOD_SECONDS = 10
# SIGTERM → the server keeps answering (unready) while endpoints catch up, then drains; both
# fit inside the grace period, so the kubelet never kills a pod with requests in flight. The
# grace period is no longer than that: the namespace controller waits out the longest grace
# period of a namespace's pods before it looks again, so every spare second of it is a second
# longer for every namespace deletion (docs/measurements.md#the-figures-behind-the-codes-limits).
SHUTDOWN_DELAY_SECONDS = 5
# The first second of it is the container's preStop sleep, so that the SIGTERM comes after it. A
# pod deleted as it starts (a rollout or a scale-down meeting a new pod) got its SIGTERM while the
# interpreter was still starting, before the server's first line could install a handler: PID 1
# drops a signal it has no handler for, and the server ran on until the SIGKILL at the end of the
# grace period (seen on the real-pods tier: docs/measurements.md#the-figures-behind-the-codes-limits).
PRE_STOP_SLEEP_SECONDS = 1
DRAIN_TIMEOUT_SECONDS = 20
# The process's own exit after the drain (runtimes released, uvicorn closed).
EXIT_MARGIN_SECONDS = 5
TERMINATION_GRACE_SECONDS = SHUTDOWN_DELAY_SECONDS + DRAIN_TIMEOUT_SECONDS + EXIT_MARGIN_SECONDS


@dataclass(frozen=True)
class ModelServer:
    engine: Engine = Engine.MODEL_SERVER
    traits: Traits = Traits(
        metrics=frozenset(
            {Metric.LATENCY_P95_MS, Metric.LATENCY_P99_MS, Metric.QUEUE_DEPTH, Metric.RPS, Metric.GPU_UTILIZATION}
        ),
        canary_metrics=(Metric.LATENCY_P95_MS, Metric.LATENCY_P99_MS),
        grpc=True,
    )
    series: Series = Series(
        model_label="model",
        request_latency=LATENCY_HISTOGRAM,
        answered=REQUESTS_TOTAL,
        holding=(INFLIGHT,),
        scraped=(QUEUE_DEPTH, REQUESTS_TOTAL),
        answers_by_code=REQUESTS_TOTAL,
        metrics={
            Metric.LATENCY_P95_MS: Quantile(LATENCY_HISTOGRAM, 0.95),
            Metric.LATENCY_P99_MS: Quantile(LATENCY_HISTOGRAM, 0.99),
            Metric.QUEUE_DEPTH: PodGauge(QUEUE_DEPTH),
            Metric.RPS: PodRate(REQUESTS_TOTAL),
            Metric.GPU_UTILIZATION: GpuGauge(GPU_UTILIZATION, on=(QUEUE_DEPTH, INFLIGHT)),
        },
    )
    scaling_names: Mapping[Metric, ScalingName] = field(
        default_factory=lambda: {
            Metric.LATENCY_P95_MS: ScalingName("model_server_request_latency_p95_ms", external=True),
            Metric.LATENCY_P99_MS: ScalingName("model_server_request_latency_p99_ms", external=True),
            Metric.QUEUE_DEPTH: ScalingName(QUEUE_DEPTH, external=False),
            # The adapter's default rule turns a `_total` counter into a `_per_second` rate.
            Metric.RPS: ScalingName("model_server_requests_per_second", external=False),
            # The GPU gauge has no model label.
            Metric.GPU_UTILIZATION: ScalingName(GPU_UTILIZATION, external=False, by_model=False),
        }
    )
    image: ImageSetting = ImageSetting(
        DEFAULT_IMAGE, "INFERENCE_OPERATOR_MODEL_SERVER_IMAGE", "model-server-image", "model-server image"
    )
    container: str = CONTAINER
    # Its flags the operator sets are the operator's own (models.engines.OPERATOR_FLAGS).
    args: ReservedArgs | None = None
    multi_node_flags: tuple[str, ...] = ()
    group: GroupMembers | None = None
    termination_grace_seconds: int = TERMINATION_GRACE_SECONDS
    # ROCm's compile caches for the model server (MIGraphX programs, MIOpen), in its cache
    # directory; the server makes the directories at start.
    compile_cache: CacheSite = CacheSite(
        COMPILE_CACHE_DIR, COMPILE_CACHE_PREFIX, POD_COMPILE_CACHE_DIR, MIGRAPHX | MIOPEN
    )

    def multi_node_args(self, nodes: int, rank: str, master_address: str, master_port: int) -> list[str]:
        raise ValueError("the model server runs on one node")

    def ranks(self, service: ServiceValues) -> int:
        """One server process runs the model on all of the pod's GPUs."""
        return 1

    def pod(self, service: ServiceValues, shared: SharedPod) -> EnginePod:
        return EnginePod(serving_container(service, shared))


def server_args(service: ServiceValues, model_dir: str) -> list[str]:
    """The model-server command line that realises the spec (flags of `model_server serve`)."""
    args = [
        "serve",
        "--model",
        model_dir,
        "--model-name",
        service.model_name,
        "--format",
        service.model_format,
        "--port",
        str(service.port),
        "--metrics-port",
        str(service.metrics_port),
        *(["--grpc-port", str(service.grpc_port)] if service.grpc_port is not None else []),
        "--providers",
        ",".join(service.execution_providers),
        "--max-batch-size",
        str(service.max_batch_size),
        "--max-delay-ms",
        _number(service.max_delay_ms),
        "--max-queue",
        str(service.max_queue),
        "--shutdown-delay",
        str(SHUTDOWN_DELAY_SECONDS - PRE_STOP_SLEEP_SECONDS),
        "--drain-timeout",
        str(DRAIN_TIMEOUT_SECONDS),
    ]
    if service.model_version:
        args += ["--model-version", service.model_version]
    if service.tracing is not None:
        args += [
            "--otlp-traces-endpoint",
            service.tracing.endpoint,
            "--trace-sample-ratio",
            _number(service.tracing.sampling_ratio),
        ]
    return args + list(service.args)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _http_probe(path: str, period: int, failures: int) -> JsonObject:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": 3,
        "failureThreshold": failures,
    }


def serving_container(service: ServiceValues, shared: SharedPod) -> JsonObject:
    env, cache = shared.env, shared.compile_cache
    grpc = service.grpc_port
    return {
        "name": CONTAINER,
        "image": service.image,
        "imagePullPolicy": service.image_pull_policy,
        "command": ["python", "-m", "model_server"],
        "args": server_args(service, shared.model_dir),
        "ports": [
            {"name": "http", "containerPort": service.port, "protocol": "TCP"},
            {"name": "metrics", "containerPort": service.metrics_port, "protocol": "TCP"},
            *([{"name": "grpc", "containerPort": grpc, "protocol": "TCP"}] if grpc else []),
        ],
        "env": env + [e for e in cache.env if e["name"] not in {v["name"] for v in env}] + shared.trace_env,
        "resources": shared.resources,
        "volumeMounts": shared.mounts + cache.mounts,
        "terminationMessagePath": shared.termination_log,
        "terminationMessagePolicy": "File",
        "startupProbe": _http_probe(
            "/health/ready",
            PROBE_PERIOD_SECONDS,
            math.ceil(service.startup_timeout_seconds / PROBE_PERIOD_SECONDS),
        ),
        "livenessProbe": _http_probe("/health/live", 10, 3),
        "readinessProbe": _http_probe("/health/ready", 5, 2),
        "lifecycle": {"preStop": {"exec": {"command": pre_stop_command()}}},
    }


def pre_stop_command() -> list[str]:
    """The model server's preStop: a sleep in the image's own Python (see PRE_STOP_SLEEP_SECONDS)."""
    return ["python", "-c", f"import time; time.sleep({PRE_STOP_SLEEP_SECONDS})"]


MODEL_SERVER = ModelServer()
