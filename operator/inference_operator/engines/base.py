"""What every engine is to the operator: its key (`Engine`), the scaling metrics a spec may name
(`Metric`), and the one interface an engine implements (`ServingEngine`), made of small frozen
parts: what the spec may ask of it (`Traits`), the series it exports (`Series`), the flags its
command line keeps for the operator (`ReservedArgs`), its default image (`ImageSetting`), and its
part of the pod (`EnginePod`, made from the `ServiceValues` of the InferenceService and the
`SharedPod` every engine's pod starts from; a multi-node group's `GroupMembers`).

This package is the bottom of the operator's pure core: the spec model derives its per-engine
CEL rules from it, the PromQL layer its queries, the builders their objects; it imports none of
them, not even for the type checker, so an engine is declared once and read everywhere. Its pod
part is no exception: what an engine's containers need of the service (its model's name, image,
ports, arguments, tracing) and of the rest of the pod (the model's mount, GPUs, the compile
cache's volume, the adapters' files) the builders hand it as plain values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from ..jsontypes import JsonObject


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
class Traits:
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
    # It serves the OpenAI API (/v1/*) and counts tokens.
    openai_api: bool = False


# --- how a scaling metric is read from an engine's series ----------------------------------------


@dataclass(frozen=True)
class Quantile:
    """A latency in ms: a quantile of a histogram in seconds."""

    histogram: str
    quantile: float


@dataclass(frozen=True)
class PodGauge:
    """A gauge summed per pod, averaged over the window and over the pods, times `scale`."""

    gauge: str
    scale: int = 1


@dataclass(frozen=True)
class PodRate:
    """A counter's rate per pod, averaged over the pods."""

    counter: str


@dataclass(frozen=True)
class GpuGauge:
    """A per-GPU gauge without the model's label, matched to the service's pods on the scrape
    target through series that carry it (`on`)."""

    gauge: str
    on: tuple[str, ...]


MetricSource = Quantile | PodGauge | PodRate | GpuGauge


@dataclass(frozen=True)
class ScalingName:
    """The name prometheus-adapter is expected to serve a metric under for an HPA: an External
    metric (service-wide, a Value target) or a Pods metric (per pod, an AverageValue target);
    `by_model`: selected by the engine's model label."""

    name: str
    external: bool
    by_model: bool = True


@dataclass(frozen=True)
class Series:
    """The series of one engine that the engine-independent queries read."""

    # The label its series name the served model by.
    model_label: str
    # The histogram of its request latency in seconds (vLLM: end to end), for status.
    request_latency: str
    # A counter of the requests it answered (a histogram's `_count`, or a counter).
    answered: str
    # Gauges that add up to the requests it holds now.
    holding: tuple[str, ...]
    # Series exported from the first scrape on, first the one always there: whether, and how
    # recently, the service is scraped at all.
    scraped: tuple[str, ...]
    # Each scaling metric it exports: where it is read from.
    metrics: Mapping[Metric, MetricSource] = field(default_factory=dict)
    # Its answers counted by status `code`, for a canary's error ratio; None: it counts none,
    # and its canaries are judged on latency alone.
    answers_by_code: str | None = None


@dataclass(frozen=True)
class ReservedArgs:
    """runtime.args for an engine whose command line is `--flag` or `--flag=value` tokens: the
    form of one token, and the flags the operator sets (no prefix of which the spec may set)."""

    pattern: str
    flags: tuple[str, ...]


@dataclass(frozen=True)
class ImageSetting:
    """The operator's default image for an engine's serving container, where the spec names none:
    built in, or set by the chart (values `images.*`) through `env`, or by the `run` and `render`
    flag `--FLAG` (described by `help`)."""

    default: str
    env: str
    flag: str
    help: str


# --- the engine's part of the pod ---------------------------------------------------------------

#: ROCm's compile caches: variable -> directory under the container's cache directory.
AITER = {"AITER_JIT_DIR": "aiter"}
MIOPEN = {"MIOPEN_USER_DB_PATH": "miopen", "MIOPEN_CUSTOM_CACHE_DIR": "miopen"}
TRITON = {"TRITON_CACHE_DIR": "triton"}
MIGRAPHX = {"ORT_MIGRAPHX_MODEL_CACHE_PATH": "migraphx"}


@dataclass(frozen=True)
class CacheSite:
    """Where an engine's serving container keeps what it compiles (builders/compile_cache.py): at
    `mount_path` on the cache claim (in `prefix`/NAME), else at `pod_dir` in the pod's /tmp; and
    which ROCm libraries' caches it sends there (variable -> subdirectory)."""

    mount_path: str
    prefix: str
    pod_dir: str
    caches: Mapping[str, str]


@dataclass(frozen=True)
class CompileCache:
    """A container's cache directory, the mounts that put it there, and the variables that send
    its libraries' caches into it."""

    directory: str
    mounts: list[JsonObject]
    env: list[JsonObject]


@dataclass(frozen=True)
class LoraWiring:
    """Runtime LoRA as the adapters sidecar wires it (builders/adapters.py): how many adapters and
    how large, the guard module the engine loads to refuse the adapter endpoints to anyone but
    loopback, the directory that module is importable from, and the serving container's mounts of
    the adapters' files and of that directory."""

    max_loras: int
    max_lora_rank: int
    guard: str
    plugins_dir: str
    mounts: list[JsonObject]


@dataclass(frozen=True)
class TraceExport:
    """runtime.tracing: where the serving container posts its spans, and what share it samples."""

    endpoint: str
    sampling_ratio: float


@dataclass(frozen=True)
class ServiceValues:
    """What an engine reads of one InferenceService (of one role's part of it) for its part of the
    pod, built once by the builders from the spec and the operator's settings: values, so that
    the engine needs neither the spec's types nor the builders."""

    # The name the model is served under (spec.model.name, else the service's), its format and
    # version (the model server's repository layout).
    model_name: str
    model_format: str
    model_version: str | None
    # The serving container's image (the spec's, else the engine's default) and pull policy.
    image: str
    image_pull_policy: str
    # The operator's own image, never the spec's: what runs the sidecars the operator adds.
    sidecar_image: str
    # runtime: the pod's ports, the engine's flags the spec sets, and the user's own arguments.
    port: int
    metrics_port: int
    grpc_port: int | None
    execution_providers: tuple[str, ...]
    max_batch_size: int
    max_delay_ms: float
    max_queue: int
    max_model_len: int | None
    startup_timeout_seconds: int
    tracing: TraceExport | None
    args: tuple[str, ...]
    # The serving container's CPU (a quantity) and GPUs (resources.gpu.count).
    cpu: str
    gpus: int
    # routing.router: the router sends the requests, and reads what the engine serves for it.
    behind_router: bool


@dataclass(frozen=True)
class SharedPod:
    """What the pod every engine shares (builders/deployment.py) hands an engine for its part:
    values, so that the engine needs none of the builders."""

    # The pod's environment (GPU selection, then runtime.env).
    env: list[JsonObject]
    # The serving container's resources (requests == limits, GPUs included).
    resources: JsonObject
    # The model's mount, /dev/shm and /tmp.
    mounts: list[JsonObject]
    # Every container's security context (a sidecar's, the serving container gets it after).
    security: JsonObject
    # Where the model is, and where a container writes why it failed.
    model_dir: str
    termination_log: str
    # The engine's compile cache at its `CacheSite`.
    compile_cache: CompileCache
    # Who the serving container's spans come from (runtime.tracing), else empty.
    trace_env: list[JsonObject]
    # A port on loopback no other container of the pod takes: an engine behind a front listens there.
    engine_port: int
    # Runtime LoRA (traits.lora and the spec asks for adapters), else None.
    lora: LoraWiring | None


@dataclass(frozen=True)
class EnginePod:
    """An engine's part of the pod: its serving container (the shared pod adds its security
    context) and the native sidecars that run beside it."""

    container: JsonObject
    sidecars: list[JsonObject] = field(default_factory=list)


@dataclass(frozen=True)
class GroupMembers:
    """How the members of a multi-node group other than its leader run: their command, the
    arguments they add, the sidecars only the leader keeps (the workers serve nothing)."""

    worker_command: tuple[str, ...]
    worker_args: tuple[str, ...] = ()
    leader_only_sidecars: tuple[str, ...] = ()


class ServingEngine(Protocol):
    """One engine, whole: every table of the operator that once had a row per engine reads it."""

    @property
    def engine(self) -> Engine: ...
    @property
    def traits(self) -> Traits: ...
    @property
    def series(self) -> Series: ...
    # Its scaling metrics as an HPA names them (autoscaling.mode: hpa).
    @property
    def scaling_names(self) -> Mapping[Metric, ScalingName]: ...
    # The image its serving container runs when the spec names none (settings.Images).
    @property
    def image(self) -> ImageSetting: ...
    # The serving container's name: the one the pods' status reads, the one a multi-node group extends.
    @property
    def container(self) -> str: ...
    # runtime.args it checks by form (None: the operator's own flags alone, models.runtime).
    @property
    def args(self) -> ReservedArgs | None: ...
    # The flags a multi-node replica sets (runtime.args may not set them there); empty: one node only.
    @property
    def multi_node_flags(self) -> tuple[str, ...]: ...
    # How a multi-node group's workers differ from its leader; None: one node only.
    @property
    def group(self) -> GroupMembers | None: ...
    def multi_node_args(self, nodes: int, rank: str, master_address: str, master_port: int) -> list[str]:
        """The serving command line's arguments for member `rank` of a group of `nodes`."""
        ...

    # How long its pod may take to stop (the pod's terminationGracePeriodSeconds).
    @property
    def termination_grace_seconds(self) -> int: ...
    # Where its serving container compiles.
    @property
    def compile_cache(self) -> CacheSite: ...
    def ranks(self, service: ServiceValues) -> int:
        """The ranks one pod's engine runs the model on (a KV connector opens a port per rank)."""
        ...

    def pod(self, service: ServiceValues, shared: SharedPod) -> EnginePod:
        """Its serving container (named `container`: command, arguments, ports, probes, stop) and
        its sidecars, for `service`."""
        ...
