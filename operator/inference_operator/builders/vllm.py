"""The serving containers for `runtime.engine: vllm`: vLLM's OpenAI-compatible server, and
the front that is its only way in.

One vLLM process per pod drives all of the pod's GPUs with tensor parallelism
(`--tensor-parallel-size` = `resources.gpu.count`). It serves the OpenAI API (/v1/*), /health
and its Prometheus metrics (`vllm:*`, /metrics) on one port, on loopback only: vLLM's server
bounds neither connections, header fields nor bodies, so the pod's `http` port is the front's
(`model_server front`, a native sidecar in the operator's image), which holds the model
server's limits and relays to vLLM. The kubelet's probes of vLLM go through the front too.
Every argument is one `--flag=value` token, so no value (a model name, a user's engine
argument) can ever be read as a flag of its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import Decimal

from ..engines.vllm import VLLM
from ..jsontypes import JsonObject
from ..models import TracingSpec
from .adapters import lora_args, lora_enabled, lora_env, vllm_mounts
from .common import Owner, engine_port
from .compile_cache import AITER, MIOPEN, TRITON, CompileCache, compile_cache
from .storage import quantity_value
from .tracing import resource_env

CONTAINER = VLLM.container
# vLLM's compiled graphs and kernels (VLLM_CACHE_ROOT): half of a CPU start is torch.compile.
COMPILE_CACHE_DIR = "/var/cache/vllm"
# Without a cache claim: the pod's /tmp volume, which outlives the container's restarts.
POD_COMPILE_CACHE_DIR = "/tmp/vllm-cache"
COMPILE_CACHE_PREFIX = "vllm-cache"
# vLLM puts its first SIGTERM handler in place only after its imports (seconds of a free core,
# longer under a pod's CPU limit: more than the preStop's sleep; docs/measurements.md has the
# figures), and PID 1 drops a signal it has no handler for: as its container's PID 1, a vLLM deleted while
# it imported ran on, loaded its model and held its GPUs until the SIGKILL at the end of its
# grace period. PID 1 is this instead, as tini would be, in the image's own Python: it starts
# vLLM as its child, passes on SIGTERM and SIGINT (a child dies of one it has no handler for
# yet), reaps orphans, and exits with vLLM's status.
INIT_SCRIPT = """import os, signal, sys
engine, pending = 0, []
def forward(signum, frame):
    if not engine:
        pending.append(signum)
        return
    try:
        os.kill(engine, signum)
    except ProcessLookupError:
        pass
for stop in (signal.SIGTERM, signal.SIGINT):
    signal.signal(stop, forward)
engine = os.posix_spawnp(sys.argv[1], sys.argv[1:], os.environ)
for signum in pending:
    os.kill(engine, signum)
while True:
    pid, status = os.wait()
    if pid == engine:
        code = os.waitstatus_to_exitcode(status)
        sys.exit(128 - code if code < 0 else code)
"""


def under_init(command: list[str]) -> list[str]:
    """`command` run under INIT_SCRIPT, which is PID 1 in its stead."""
    return ["python3", "-c", INIT_SCRIPT, *command]


# The module rather than the `vllm` CLI: the same in every image, whatever the distribution's name.
ENGINE_COMMAND = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
COMMAND = under_init(ENGINE_COMMAND)
# A multi-node group's workers: the CLI (`vllm serve --headless`); the API server module the
# leader runs has no headless mode.
WORKER_COMMAND = under_init(["python3", "-m", "vllm.entrypoints.cli.main", "serve"])
HEALTH_PATH = "/health"
# vLLM finishes the generations it is streaming when it stops; a long completion takes a while.
VLLM_TERMINATION_GRACE_SECONDS = 60
PROBE_PERIOD_SECONDS = 10
# vLLM keeps answering this long after the pod is deleted, while endpoints drop it (it closes its
# listener at SIGTERM, and the front can only answer 503 for a request that comes after).
PRE_STOP_SECONDS = 5
# The preStop hook, in two steps over the pod's loopback (never through a proxy): first the front
# is told to drain (front.DRAIN_PATH): each answer closes its connection, so clients on kept-alive
# connections move to other replicas while vLLM still answers; a second before the sleep ends, it
# closes the connections still idle, before vLLM stops taking requests. (Closing the idle ones at
# once raced clients sending their next request on them: 2 of 36 streams failed on the tier.) A
# front that does not answer delays nothing.
PRE_STOP_SCRIPT = """import http.client, time
def drain(path):
    try:
        front = http.client.HTTPConnection("127.0.0.1", {port}, timeout=2)
        front.request("GET", path)
        front.getresponse().read()
    except OSError:
        pass
drain("/front/drain")
time.sleep({first})
drain("/front/drain?idle=close")
time.sleep({last})
"""
# How long vLLM may finish what it is generating after SIGTERM (--shutdown-timeout): its default, 0,
# aborts every request in flight, cutting the streams a rolling update's old pod is sending. The
# rest of the grace period after the preStop sleep, less a margin for the process to exit.
DRAIN_SECONDS = VLLM_TERMINATION_GRACE_SECONDS - PRE_STOP_SECONDS - 5

FRONT = "front"
FRONT_MEMORY = "512Mi"
# The front's CPU: an eighth of vLLM's, within these. It relays every streamed token; a GPU
# node's vLLM with 16 CPUs gets a front of 2.
FRONT_CPU_MIN = Decimal("0.2")
FRONT_CPU_MAX = Decimal(2)


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
        "--host=127.0.0.1",
        f"--port={engine_port(owner.spec)}",
        f"--shutdown-timeout={DRAIN_SECONDS}",
    ]
    if runtime.max_model_len is not None:
        args.append(f"--max-model-len={runtime.max_model_len}")
    if lora_enabled(owner.spec):
        args += lora_args(owner.spec)
    if runtime.tracing is not None:
        args.append(f"--otlp-traces-endpoint={runtime.tracing.endpoint}")
    if owner.spec.routing.router is not None:
        # The router's cache-aware policy reads each prompt's tokens from /v1/completions/render
        # (and its chat twin), which vLLM serves only with its scale-out endpoints; without them
        # every request goes to the first replica. The front refuses the rest of those endpoints
        # (server/vllm_front/server.py: /inference/..., an abort of anyone's request).
        args.append("--enable-scale-out")
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


def vllm_env(env: list[JsonObject], cache_dir: str, caches: Sequence[JsonObject] = ()) -> list[JsonObject]:
    """The pod's environment plus what vLLM needs under a read-only root filesystem: a
    writable HOME, its compile caches in `cache_dir` (see `vllm_compile_cache`), and no Hub access
    (the model is already on disk). Idle kept-alive connections stay open 75 s, as the model
    server's do: with vLLM's own 5 s, a proxy or client reusing one as vLLM closed it got a reset."""
    ours = [
        {"name": "HOME", "value": "/tmp"},
        {"name": "HF_HUB_OFFLINE", "value": "1"},
        {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
        {"name": "VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "value": "75"},
        {"name": "VLLM_CACHE_ROOT", "value": cache_dir},
        *caches,
    ]
    names = {e["name"] for e in env}
    return [e for e in ours if e["name"] not in names] + env


def vllm_compile_cache(owner: Owner) -> CompileCache:
    """vLLM's compile cache (VLLM_CACHE_ROOT: half of a CPU start is torch.compile) and ROCm's
    (AITER, MIOpen, Triton) in one directory: see compile_cache.py. vLLM keys its entries on the
    model, the engine's configuration and its own version, so a change compiles afresh beside them."""
    return compile_cache(owner, COMPILE_CACHE_DIR, COMPILE_CACHE_PREFIX, POD_COMPILE_CACHE_DIR, AITER | MIOPEN | TRITON)


def _probe(port: int, period: int, failures: int) -> JsonObject:
    """vLLM's /health, asked through the front (the kubelet cannot reach loopback)."""
    return {
        "httpGet": {"path": HEALTH_PATH, "port": port},
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
    cache = vllm_compile_cache(owner)
    cache_mounts = list(cache.mounts)
    env = vllm_env(env, cache.directory, cache.env) + tracing_env(runtime.tracing) + resource_env(owner)
    if lora_enabled(owner.spec):
        env = lora_env(env)
        cache_mounts += vllm_mounts()
    return {
        "name": CONTAINER,
        "image": owner.image,
        "imagePullPolicy": runtime.image_pull_policy,
        "command": list(COMMAND),
        "args": vllm_args(owner, model_dir),
        "ports": [],
        "env": env,
        "resources": resources,
        "volumeMounts": mounts + cache_mounts,
        # Loading weights and compiling kernels of a large model takes minutes.
        "startupProbe": _probe(
            runtime.port, PROBE_PERIOD_SECONDS, math.ceil(runtime.startup_timeout_seconds / PROBE_PERIOD_SECONDS)
        ),
        "livenessProbe": _probe(runtime.port, 10, 3),
        "readinessProbe": _probe(runtime.port, 5, 2),
        "lifecycle": {"preStop": {"exec": {"command": pre_stop_command(runtime.port)}}},
    }


def pre_stop_script(front_port: int, seconds: float) -> str:
    """Drain the front, close its idle connections a second before `seconds` are over, end then."""
    last = min(1.0, seconds)
    return PRE_STOP_SCRIPT.format(port=front_port, first=seconds - last, last=last)


def pre_stop_command(front_port: int) -> list[str]:
    """vLLM's preStop: the front drains its connections over PRE_STOP_SECONDS."""
    return ["python3", "-c", pre_stop_script(front_port, PRE_STOP_SECONDS)]


def front_cpu(serving_cpu: str) -> str:
    """An eighth of the serving container's CPU, between FRONT_CPU_MIN and FRONT_CPU_MAX, in
    millicores."""
    serving = quantity_value(serving_cpu)
    cpu = FRONT_CPU_MAX if serving >= 8 * FRONT_CPU_MAX else max(serving / 8, FRONT_CPU_MIN)
    return f"{int(cpu * 1000)}m"


def _front_probe(path: str, period: int, failures: int) -> JsonObject:
    probe = {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, "timeoutSeconds": 2}
    return {**probe, "failureThreshold": failures}


def front_container(owner: Owner, security_context: JsonObject) -> JsonObject:
    """The native sidecar on the pod's `http` port that relays to vLLM (see the module doc). It
    starts before vLLM and stops after it, so vLLM's last streams reach their clients. It holds
    nothing of the author's: no env, no volume."""
    runtime = owner.spec.runtime
    amounts = {"cpu": front_cpu(owner.spec.resources.cpu), "memory": FRONT_MEMORY}
    return {
        "name": FRONT,
        "image": owner.fetcher_image,
        "restartPolicy": "Always",
        "command": ["python", "-m", "model_server", "front"],
        "args": [
            f"--upstream=http://127.0.0.1:{engine_port(owner.spec)}",
            f"--port={runtime.port}",
            f"--memory-limit-bytes={int(quantity_value(FRONT_MEMORY))}",
            f"--drain-timeout={VLLM_TERMINATION_GRACE_SECONDS}",
        ],
        "ports": [{"name": "http", "containerPort": runtime.port, "protocol": "TCP"}],
        # requests == limits: a pod is Guaranteed only when every container, sidecars included, is.
        "resources": {"requests": dict(amounts), "limits": dict(amounts)},
        "securityContext": security_context,
        "startupProbe": _front_probe("/health/live", 1, 30),
        "livenessProbe": _front_probe("/health/live", 10, 3),
        "readinessProbe": _front_probe("/health/ready", 5, 2),
    }
