"""The serving container for `runtime.engine: modelServer`: the bundled model server
(`python -m model_server serve`), its command line, probes and compile caches."""

from __future__ import annotations

import math

from ..engines.model_server import MODEL_SERVER
from ..jsontypes import JsonObject
from .common import Owner
from .compile_cache import MIGRAPHX, MIOPEN, CompileCache, compile_cache
from .storage import MODEL_DIR, TERMINATION_LOG
from .tracing import resource_env

CONTAINER = MODEL_SERVER.container
# What the server compiles (compile_cache.py): on the cache claim, or in the pod's /tmp volume.
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


def server_args(owner: Owner) -> list[str]:
    """The model-server command line that realises the spec (flags of `model_server serve`)."""
    spec = owner.spec
    runtime, batching = spec.runtime, spec.runtime.batching
    args = [
        "serve",
        "--model",
        MODEL_DIR,
        "--model-name",
        owner.model_name,
        "--format",
        spec.model.format.value,
        "--port",
        str(runtime.port),
        "--metrics-port",
        str(runtime.metrics_port),
        *(["--grpc-port", str(runtime.grpc_port)] if runtime.grpc_port is not None else []),
        "--providers",
        ",".join(p.value for p in runtime.execution_providers),
        "--max-batch-size",
        str(batching.max_batch_size),
        "--max-delay-ms",
        _number(batching.max_delay_ms),
        "--max-queue",
        str(batching.max_queue),
        "--shutdown-delay",
        str(SHUTDOWN_DELAY_SECONDS - PRE_STOP_SLEEP_SECONDS),
        "--drain-timeout",
        str(DRAIN_TIMEOUT_SECONDS),
    ]
    if spec.model.version:
        args += ["--model-version", spec.model.version]
    if runtime.tracing is not None:
        args += [
            "--otlp-traces-endpoint",
            runtime.tracing.endpoint,
            "--trace-sample-ratio",
            _number(runtime.tracing.sampling_ratio),
        ]
    return args + list(runtime.args)


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _http_probe(path: str, period: int, failures: int) -> JsonObject:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": 3,
        "failureThreshold": failures,
    }


def model_server_compile_cache(owner: Owner) -> CompileCache:
    """ROCm's compile caches for the model server (MIGraphX programs, MIOpen), in its cache
    directory: see compile_cache.py. The server makes the directories at start."""
    return compile_cache(owner, COMPILE_CACHE_DIR, COMPILE_CACHE_PREFIX, POD_COMPILE_CACHE_DIR, MIGRAPHX | MIOPEN)


def model_server_container(
    owner: Owner, env: list[JsonObject], resources: JsonObject, mounts: list[JsonObject]
) -> JsonObject:
    runtime = owner.spec.runtime
    cache = model_server_compile_cache(owner)
    return {
        "name": CONTAINER,
        "image": owner.image,
        "imagePullPolicy": runtime.image_pull_policy,
        "command": ["python", "-m", "model_server"],
        "args": server_args(owner),
        "ports": [
            {"name": "http", "containerPort": runtime.port, "protocol": "TCP"},
            {"name": "metrics", "containerPort": runtime.metrics_port, "protocol": "TCP"},
            *([{"name": "grpc", "containerPort": runtime.grpc_port, "protocol": "TCP"}] if runtime.grpc_port else []),
        ],
        "env": env + [e for e in cache.env if e["name"] not in {v["name"] for v in env}] + resource_env(owner),
        "resources": resources,
        "volumeMounts": mounts + cache.mounts,
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "File",
        "startupProbe": _http_probe(
            "/health/ready",
            PROBE_PERIOD_SECONDS,
            math.ceil(runtime.startup_timeout_seconds / PROBE_PERIOD_SECONDS),
        ),
        "livenessProbe": _http_probe("/health/live", 10, 3),
        "readinessProbe": _http_probe("/health/ready", 5, 2),
        "lifecycle": {"preStop": {"exec": {"command": pre_stop_command()}}},
    }


def pre_stop_command() -> list[str]:
    """The model server's preStop: a sleep in the image's own Python (see PRE_STOP_SLEEP_SECONDS)."""
    return ["python", "-c", f"import time; time.sleep({PRE_STOP_SLEEP_SECONDS})"]
