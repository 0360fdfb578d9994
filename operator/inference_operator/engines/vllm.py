"""vLLM's OpenAI-compatible server for LLMs: tensor parallel over a node's GPUs, pipeline
parallel across nodes, LoRA adapters at run time, its metrics (`vllm:*`) on its API port; and its
part of the pod: vLLM's container, and the front that is its only way in.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from ..jsontypes import JsonObject
from ..quantities import quantity_value
from .base import (
    AITER,
    MIOPEN,
    TRITON,
    CacheSite,
    Engine,
    EnginePod,
    GroupMembers,
    ImageSetting,
    LoraWiring,
    Metric,
    PodGauge,
    Quantile,
    ReservedArgs,
    ScalingName,
    Series,
    ServiceValues,
    SharedPod,
    TraceExport,
    Traits,
)

# vLLM's metrics (as its OpenAI server exports them, V1 engine; the version tested is
# scripts/setup-vllm.sh's).
VLLM_TTFT = "vllm:time_to_first_token_seconds"
VLLM_ITL = "vllm:inter_token_latency_seconds"
VLLM_E2E = "vllm:e2e_request_latency_seconds"
VLLM_WAITING = "vllm:num_requests_waiting"
VLLM_RUNNING = "vllm:num_requests_running"
VLLM_KV_CACHE = "vllm:kv_cache_usage_perc"
VLLM_MODEL_LABEL = "model_name"
CONTAINER = "vllm"
# vLLM's image for ROCm (the chart's images.vllm).
DEFAULT_IMAGE = "docker.io/vllm/vllm-openai-rocm:v0.32.0"

# vLLM flags the operator sets from the spec (or that would move the server off its port, or
# read more flags from a file): runtime.args may not set them, nor an abbreviation of them
# (vLLM's argument parser accepts unambiguous prefixes and `_` for `-`).
RESERVED_FLAGS = (
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
ARG_PATTERN = r"^--[A-Za-z0-9][-_A-Za-z0-9.+]*(=[\s\S]*)?$"
# vLLM flags a multi-node replica (resources.gpu.nodes > 1) sets: the pipeline across nodes and
# the multiprocessing bootstrap between them; runtime.args may not set them there.
MULTI_NODE_FLAGS = (
    "pipeline-parallel-size",
    "distributed-executor-backend",
    "nnodes",
    "node-rank",
    "master-addr",
    "master-port",
    "headless",
    "data-parallel-size",
)


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


@dataclass(frozen=True)
class Vllm:
    engine: Engine = Engine.VLLM
    traits: Traits = Traits(
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
        openai_api=True,
    )
    series: Series = Series(
        model_label=VLLM_MODEL_LABEL,
        request_latency=VLLM_E2E,
        answered=f"{VLLM_E2E}_count",
        holding=(VLLM_RUNNING, VLLM_WAITING),
        scraped=(VLLM_WAITING, VLLM_RUNNING),
        metrics={
            Metric.TTFT_P95_MS: Quantile(VLLM_TTFT, 0.95),
            Metric.ITL_P95_MS: Quantile(VLLM_ITL, 0.95),
            Metric.E2E_LATENCY_P95_MS: Quantile(VLLM_E2E, 0.95),
            Metric.REQUESTS_WAITING: PodGauge(VLLM_WAITING),
            # Percent: vLLM exports a 0..1 fraction.
            Metric.KV_CACHE_USAGE: PodGauge(VLLM_KV_CACHE, scale=100),
        },
    )
    # vLLM's `vllm:` prefix is not a valid metric name in the custom metrics API.
    scaling_names: Mapping[Metric, ScalingName] = field(
        default_factory=lambda: {
            Metric.TTFT_P95_MS: ScalingName("vllm_time_to_first_token_p95_ms", external=True),
            Metric.ITL_P95_MS: ScalingName("vllm_inter_token_latency_p95_ms", external=True),
            Metric.E2E_LATENCY_P95_MS: ScalingName("vllm_e2e_request_latency_p95_ms", external=True),
            Metric.KV_CACHE_USAGE: ScalingName("vllm_kv_cache_usage_percent", external=True),
            Metric.REQUESTS_WAITING: ScalingName("vllm_num_requests_waiting", external=False),
        }
    )
    image: ImageSetting = ImageSetting(
        DEFAULT_IMAGE, "INFERENCE_OPERATOR_VLLM_IMAGE", "vllm-image", "vLLM image for engine: vllm"
    )
    container: str = CONTAINER
    args: ReservedArgs | None = ReservedArgs(ARG_PATTERN, RESERVED_FLAGS)
    multi_node_flags: tuple[str, ...] = MULTI_NODE_FLAGS
    # The workers run the CLI's headless server and keep no front (they serve nothing).
    group: GroupMembers | None = GroupMembers(tuple(WORKER_COMMAND), ("--headless",), (FRONT,))
    termination_grace_seconds: int = VLLM_TERMINATION_GRACE_SECONDS
    # vLLM's compile cache (VLLM_CACHE_ROOT: half of a CPU start is torch.compile) and ROCm's
    # (AITER, MIOpen, Triton) in one directory: see builders/compile_cache.py. vLLM keys its
    # entries on the model, the engine's configuration and its own version, so a change compiles
    # afresh beside them.
    compile_cache: CacheSite = CacheSite(
        COMPILE_CACHE_DIR, COMPILE_CACHE_PREFIX, POD_COMPILE_CACHE_DIR, AITER | MIOPEN | TRITON
    )

    def multi_node_args(self, nodes: int, rank: str, master_address: str, master_port: int) -> list[str]:
        """Pipeline parallel across the group's nodes, bootstrapped by vLLM's own multiprocessing
        (no Ray cluster)."""
        return [
            f"--pipeline-parallel-size={nodes}",
            "--distributed-executor-backend=mp",
            f"--nnodes={nodes}",
            f"--node-rank={rank}",
            f"--master-addr={master_address}",
            f"--master-port={master_port}",
        ]

    def ranks(self, service: ServiceValues) -> int:
        """Tensor parallel over the pod's GPUs: a rank per GPU (one on a pod without any)."""
        return tensor_parallel_size(service)

    def pod(self, service: ServiceValues, shared: SharedPod) -> EnginePod:
        return EnginePod(vllm_container(service, shared), [front_container(service, shared)])


def tensor_parallel_size(service: ServiceValues) -> int:
    return max(service.gpus, 1)


def vllm_args(service: ServiceValues, shared: SharedPod) -> list[str]:
    """The server's command line from the spec; the user's engine arguments come last and were
    validated (models.vllm_arg_problem) not to touch any flag set here."""
    args = [
        f"--model={shared.model_dir}",
        f"--served-model-name={service.model_name}",
        f"--tensor-parallel-size={tensor_parallel_size(service)}",
        "--host=127.0.0.1",
        f"--port={shared.engine_port}",
        f"--shutdown-timeout={DRAIN_SECONDS}",
    ]
    if service.max_model_len is not None:
        args.append(f"--max-model-len={service.max_model_len}")
    if shared.lora is not None:
        args += lora_args(shared.lora)
    if service.tracing is not None:
        args.append(f"--otlp-traces-endpoint={service.tracing.endpoint}")
    if service.behind_router:
        # The router's cache-aware policy reads each prompt's tokens from /v1/completions/render
        # (and its chat twin), which vLLM serves only with its scale-out endpoints; without them
        # every request goes to the first replica. The front refuses the rest of those endpoints
        # (server/vllm_front/server.py: /inference/..., an abort of anyone's request).
        args.append("--enable-scale-out")
    return args + list(service.args)


def tracing_env(tracing: TraceExport | None) -> list[JsonObject]:
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
    writable HOME, its compile caches in `cache_dir` (see `Vllm.compile_cache`), and no Hub access
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


def lora_args(lora: LoraWiring) -> list[str]:
    return [
        "--enable-lora",
        f"--max-loras={lora.max_loras}",
        f"--max-lora-rank={lora.max_lora_rank}",
        f"--middleware={lora.guard}",
    ]


def lora_env(env: list[JsonObject], lora: LoraWiring) -> list[JsonObject]:
    """vLLM's environment with runtime LoRA updating on and the guard's directory first on
    PYTHONPATH (before any the spec sets, so no module of the spec's can stand in for it)."""
    user_path = next((e.get("value") for e in env if e["name"] == "PYTHONPATH"), None)
    path = f"{lora.plugins_dir}:{user_path}" if user_path else lora.plugins_dir
    ours = [{"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"}, {"name": "PYTHONPATH", "value": path}]
    return ours + [e for e in env if e["name"] != "PYTHONPATH"]


def _probe(port: int, period: int, failures: int) -> JsonObject:
    """vLLM's /health, asked through the front (the kubelet cannot reach loopback)."""
    return {
        "httpGet": {"path": HEALTH_PATH, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def vllm_container(service: ServiceValues, shared: SharedPod) -> JsonObject:
    cache = shared.compile_cache
    cache_mounts = list(cache.mounts)
    env = vllm_env(shared.env, cache.directory, cache.env) + tracing_env(service.tracing) + shared.trace_env
    if shared.lora is not None:
        env = lora_env(env, shared.lora)
        cache_mounts += shared.lora.mounts
    return {
        "name": CONTAINER,
        "image": service.image,
        "imagePullPolicy": service.image_pull_policy,
        "command": list(COMMAND),
        "args": vllm_args(service, shared),
        "ports": [],
        "env": env,
        "resources": shared.resources,
        "volumeMounts": shared.mounts + cache_mounts,
        # Loading weights and compiling kernels of a large model takes minutes.
        "startupProbe": _probe(
            service.port, PROBE_PERIOD_SECONDS, math.ceil(service.startup_timeout_seconds / PROBE_PERIOD_SECONDS)
        ),
        "livenessProbe": _probe(service.port, 10, 3),
        "readinessProbe": _probe(service.port, 5, 2),
        "lifecycle": {"preStop": {"exec": {"command": pre_stop_command(service.port)}}},
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


def front_container(service: ServiceValues, shared: SharedPod) -> JsonObject:
    """The native sidecar on the pod's `http` port that relays to vLLM (see the module doc). It
    starts before vLLM and stops after it, so vLLM's last streams reach their clients. It holds
    nothing of the author's: no env, no volume."""
    amounts = {"cpu": front_cpu(service.cpu), "memory": FRONT_MEMORY}
    return {
        "name": FRONT,
        "image": service.sidecar_image,
        "restartPolicy": "Always",
        "command": ["python", "-m", "model_server", "front"],
        "args": [
            f"--upstream=http://127.0.0.1:{shared.engine_port}",
            f"--port={service.port}",
            f"--memory-limit-bytes={int(quantity_value(FRONT_MEMORY))}",
            f"--drain-timeout={VLLM_TERMINATION_GRACE_SECONDS}",
        ],
        "ports": [{"name": "http", "containerPort": service.port, "protocol": "TCP"}],
        # requests == limits: a pod is Guaranteed only when every container, sidecars included, is.
        "resources": {"requests": dict(amounts), "limits": dict(amounts)},
        "securityContext": shared.security,
        "startupProbe": _front_probe("/health/live", 1, 30),
        "livenessProbe": _front_probe("/health/live", 10, 3),
        "readinessProbe": _front_probe("/health/ready", 5, 2),
    }


VLLM = Vllm()
