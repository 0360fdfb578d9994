"""The serving container for `runtime.engine: vllm`: vLLM's OpenAI-compatible server.

One vLLM process per pod drives all of the pod's GPUs with tensor parallelism
(`--tensor-parallel-size` = `resources.gpu.count`). It serves the OpenAI API (/v1/*), /health
and its Prometheus metrics (`vllm:*`, /metrics) on one port. Every argument is one
`--flag=value` token, so no value (a model name, a user's engine argument) can ever be read
as a flag of its own.
"""

from __future__ import annotations

import math

from ..jsontypes import JsonObject
from ..models import TracingSpec
from .adapters import lora_args, lora_enabled, lora_env, vllm_mounts
from .common import Owner
from .storage import MODEL_VOLUME, uses_cache_claim

CONTAINER = "vllm"
# vLLM's compiled graphs and kernels (VLLM_CACHE_ROOT): half of a CPU start is torch.compile.
COMPILE_CACHE_DIR = "/var/cache/vllm"
# Without a cache claim: the pod's /tmp volume, which outlives the container's restarts.
POD_COMPILE_CACHE_DIR = "/tmp/vllm-cache"
COMPILE_CACHE_PREFIX = "vllm-cache"
# The module rather than the `vllm` CLI: the same in every image, whatever the distribution's name.
COMMAND = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
HEALTH_PATH = "/health"
# vLLM finishes the generations it is streaming when it stops; a long completion takes a while.
VLLM_TERMINATION_GRACE_SECONDS = 60
PROBE_PERIOD_SECONDS = 10


def tensor_parallel_size(owner: Owner) -> int:
    return max(owner.spec.resources.gpu.count, 1)


def vllm_args(owner: Owner, model_dir: str) -> list[str]:
    """The server's command line from the spec; the user's engine arguments come last and were
    validated (models.vllm_arg_problem) not to touch any flag set here."""
    runtime = owner.spec.runtime
    args = [
        f"--model={model_dir}",
        f"--served-model-name={owner.model_name}",
        f"--tensor-parallel-size={tensor_parallel_size(owner)}",
        "--host=0.0.0.0",
        f"--port={runtime.port}",
    ]
    if runtime.max_model_len is not None:
        args.append(f"--max-model-len={runtime.max_model_len}")
    if lora_enabled(owner.spec):
        args += lora_args(owner.spec)
    if runtime.tracing is not None:
        args.append(f"--otlp-traces-endpoint={runtime.tracing.endpoint}")
    return args + list(runtime.args)


def tracing_env(tracing: TracingSpec | None) -> list[JsonObject]:
    """vLLM's OTLP exporter over HTTP (its default is gRPC), sampling as runtime.tracing says
    (the OpenTelemetry SDK's own variables: vLLM builds its tracer provider from them)."""
    if tracing is None:
        return []
    return [
        {"name": "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "value": "http/protobuf"},
        {"name": "OTEL_TRACES_SAMPLER", "value": "parentbased_traceidratio"},
        {"name": "OTEL_TRACES_SAMPLER_ARG", "value": str(tracing.sampling_ratio)},
    ]


def vllm_env(env: list[JsonObject], cache_dir: str) -> list[JsonObject]:
    """The pod's environment plus what vLLM needs under a read-only root filesystem: a
    writable HOME, its compile cache in `cache_dir` (see `compile_cache`), and no Hub access
    (the model is already on disk). Idle kept-alive connections stay open 75 s, as the model
    server's do: with vLLM's own 5 s, a proxy or client reusing one as vLLM closed it got a reset."""
    ours = [
        {"name": "HOME", "value": "/tmp"},
        {"name": "HF_HUB_OFFLINE", "value": "1"},
        {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
        {"name": "VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "value": "75"},
        {"name": "VLLM_CACHE_ROOT", "value": cache_dir},
    ]
    names = {e["name"] for e in env}
    return [e for e in ours if e["name"] not in names] + env


def compile_cache(owner: Owner) -> tuple[str, list[JsonObject]]:
    """Where vLLM keeps its compile cache, and the mount that puts it there.

    With `model.cachePvc` it is on the claim, under vllm-cache/NAME, so the second replica and
    every restart reuse what the first compiled (vLLM keys its entries on the model, the
    engine's configuration and its own version, so a change compiles afresh beside them). Each
    InferenceService has a directory of its own: the cache holds code vLLM runs. Otherwise it
    is the pod's /tmp volume, which container restarts keep."""
    if not uses_cache_claim(owner.spec.model):
        return POD_COMPILE_CACHE_DIR, []
    mount = {"name": MODEL_VOLUME, "mountPath": COMPILE_CACHE_DIR, "subPath": f"{COMPILE_CACHE_PREFIX}/{owner.name}"}
    return COMPILE_CACHE_DIR, [mount]


def _probe(period: int, failures: int) -> JsonObject:
    return {
        "httpGet": {"path": HEALTH_PATH, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def vllm_container(
    owner: Owner,
    model_dir: str,
    env: list[JsonObject],
    resources: JsonObject,
    mounts: list[JsonObject],
) -> JsonObject:
    runtime = owner.spec.runtime
    cache_dir, cache_mounts = compile_cache(owner)
    env = vllm_env(env, cache_dir) + tracing_env(runtime.tracing)
    if lora_enabled(owner.spec):
        env = lora_env(env)
        cache_mounts += vllm_mounts()
    return {
        "name": CONTAINER,
        "image": owner.image,
        "imagePullPolicy": runtime.image_pull_policy,
        "command": list(COMMAND),
        "args": vllm_args(owner, model_dir),
        "ports": [{"name": "http", "containerPort": runtime.port, "protocol": "TCP"}],
        "env": env,
        "resources": resources,
        "volumeMounts": mounts + cache_mounts,
        # Loading weights and compiling kernels of a large model takes minutes.
        "startupProbe": _probe(PROBE_PERIOD_SECONDS, math.ceil(runtime.startup_timeout_seconds / PROBE_PERIOD_SECONDS)),
        "livenessProbe": _probe(10, 3),
        "readinessProbe": _probe(5, 2),
    }
