"""Server configuration, read from CLI flags and `MODEL_SERVER_*` env vars.

The operator may pass settings either way, so both end up in one validated
object; explicitly given flags win over env values. The `serve` flags are derived
from the fields here (`add_arguments`), so a setting is declared once: its type,
bounds and help live on the field, and pydantic alone validates what was given.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from bounded_http import limits

#: Provider preference when none is configured: most to least specialised.
DEFAULT_PROVIDERS = (
    "MIGraphXExecutionProvider",
    "ROCMExecutionProvider",
    "CUDAExecutionProvider",
    "CPUExecutionProvider",
)

#: File suffixes that mark a path as a model file rather than a directory.
MODEL_SUFFIXES = frozenset({".onnx", ".pt", ".pth", ".torchscript", ".pt2"})

ModelFormat = Literal["auto", "onnx", "torchscript", "export"]
ENV_PREFIX = "MODEL_SERVER_"


@dataclass(frozen=True)
class Flag:
    """Field metadata: the setting's `serve` flag, where it is not the field name in kebab case."""

    name: str


class ServerSettings(BaseSettings):
    """Everything `serve` needs; field names map to `--kebab-case` flags."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", populate_by_name=True)

    model: Path = Field(description="model file or repository directory (DIR/<version>/model.onnx)")
    model_name: str | None = Field(
        default=None,
        validation_alias=AliasChoices("model_name", "MODEL_SERVER_MODEL_NAME", "MODEL_NAME"),
        description="name in the API and the `model` metric label (default: the model's stem); also env MODEL_NAME",
    )
    model_version: str | None = Field(default=None, description="serve only this version of the repository (pinned)")
    format: ModelFormat = "auto"
    host: str = "0.0.0.0"
    port: int = Field(default=8080, ge=0, le=65535)
    metrics_port: int | None = Field(default=None, ge=0, le=65535, description="extra port for /metrics")
    grpc_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="port for the Open Inference Protocol over gRPC (inference.GRPCInferenceService); off when unset",
    )

    providers: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: list(DEFAULT_PROVIDERS),
        description="comma-separated ONNX Runtime execution providers, in preference order",
    )
    intra_op_threads: int = Field(
        default=0, ge=0, description="0 = the CPUs the pod may use (cgroup limit, affinity), shared by the instances"
    )
    inter_op_threads: int = Field(default=0, ge=0, description="0 = runtime default")
    io_binding: Literal["auto", "on", "off"] = "auto"
    profiling: bool = False
    profile_dir: Path = Path("/tmp/model-server-profiles")
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="torch device")

    max_batch_size: int = Field(default=16, ge=1, le=4096)
    max_delay_ms: float = Field(
        default=5.0,
        ge=0,
        le=10_000,
        description="longest a request waits for company: an idle runtime waits only for the callers of the batch "
        "it just answered, at most half a batch's run time (behind a busy runtime, batches form until it frees up)",
    )
    max_queue: int = Field(default=256, ge=1)
    batch_workers: int = Field(default=1, ge=1, le=16, description="concurrent backend calls")
    instances: str = Field(
        default="auto",
        description="model instances (runtime sessions) per version, each on its own device; "
        "'auto' = one per visible GPU (ROCR_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES), 1 on CPU",
    )
    batch_buckets: str = Field(
        default="auto",
        description="pad batches to these sizes ('1,2,4,8'), 'off', or 'auto' "
        "(powers of two when the provider compiles per shape, i.e. MIGraphX)",
    )
    warmup: bool = True

    watch: bool = Field(default=True, description="hot-reload new versions")
    watch_polling: bool = False
    watch_debounce_ms: int = Field(default=500, ge=10)
    max_versions: int = Field(default=2, ge=0, description="highest N versions served; 0 = all")
    termination_log: Path | None = Field(
        default=Path("/dev/termination-log"),
        description="where this file exists (the kubelet makes it in every container), a first scan that "
        "loads no version writes why to it and exits 3, so the pod restarts and its status says why; "
        "elsewhere the server waits, unready, for the files to change",
    )

    drain_timeout_s: Annotated[float, Flag("drain-timeout")] = Field(
        default=30.0, ge=0, description="seconds to finish accepted requests after SIGTERM"
    )
    shutdown_delay_s: Annotated[float, Flag("shutdown-delay")] = Field(
        default=0.0, ge=0, description="seconds to stay up, unready, after SIGTERM"
    )
    max_body_bytes: int = Field(
        default=0, ge=0, description="413 above this; 0 = the parse budget / 10, at most 64 MiB"
    )
    memory_limit_bytes: int = Field(default=0, ge=0, description="the pod's memory; 0 = the cgroup limit (or RAM)")
    parse_memory_bytes: int = Field(
        default=0, ge=0, description="memory for parsing large bodies at once; 0 = 2/5 of the memory limit"
    )
    header_timeout_s: Annotated[float, Flag("header-timeout")] = Field(
        default=limits.HEADER_TIMEOUT_S, gt=0, description="seconds for a request's headers to arrive"
    )
    body_timeout_s: Annotated[float, Flag("body-timeout")] = Field(
        default=limits.BODY_TIMEOUT_S, gt=0, description="seconds for a request's body to arrive"
    )
    write_timeout_s: Annotated[float, Flag("write-timeout")] = Field(
        default=limits.WRITE_TIMEOUT_S,
        gt=0,
        description="seconds a client may leave an answer undrained (its socket full) before its connection is "
        "dropped and the answer's bytes come back to the budget",
    )
    grpc_max_connection_age_s: Annotated[float, Flag("grpc-max-connection-age")] = Field(
        default=60.0,
        gt=0,
        le=86_400,
        description="seconds a gRPC connection serves before it is asked to reconnect (GOAWAY: clients do so "
        "unnoticed); its calls then have write-timeout to finish, so an answer its client never reads is dropped "
        "with its connection within both",
    )
    keep_alive_timeout_s: Annotated[int, Flag("keep-alive-timeout")] = Field(
        default=limits.KEEP_ALIVE_TIMEOUT_S,
        ge=1,
        description="seconds an idle kept-alive connection stays open: longer than the idle timeout of "
        "proxies and clients in front (nginx 60 s), so that they close it, never in the middle of "
        "sending it a request",
    )
    max_header_bytes: int = Field(default=limits.MAX_HEADER_BYTES, ge=1024, description="431 above this")
    max_connections: int = Field(
        default=limits.MAX_CONNECTIONS,
        ge=1,
        description="at this many, a new connection closes the one idle longest (else one still sending its headers); "
        "beyond it, probes only",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    access_log: bool = False
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="json: one JSON object per line, with trace_id and span_id when logged under a traced request",
    )
    otlp_traces_endpoint: str | None = Field(
        default=None,
        pattern=r"^https?://[^\s/?#@]+(/[^\s?#]*)?$",
        max_length=2048,
        description="OTLP/HTTP traces URL (e.g. http://collector:4318/v1/traces): a span per inference request "
        "with its queue wait, batch formation, runtime call and encoding, continuing the caller's traceparent; "
        "off when unset",
    )
    trace_sample_ratio: float = Field(
        default=1.0, ge=0, le=1, description="share of new traces recorded (a caller's traceparent decides for its own)"
    )

    @field_validator("providers", mode="before")
    @classmethod
    def _split_providers(cls, value: object) -> object:
        if isinstance(value, str):
            return [p.strip() for p in value.split(",") if p.strip()]
        return value

    @field_validator("batch_buckets")
    @classmethod
    def _check_buckets(cls, value: str) -> str:
        resolve_buckets(value, 1 << 12, True)
        return value

    @field_validator("instances")
    @classmethod
    def _check_instances(cls, value: str) -> str:
        resolve_instances(value, on_gpu=False, env={})
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_log_level(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _default_name(self) -> ServerSettings:
        if not self.model_name:
            self.model_name = default_model_name(self.model)
        return self

    @model_validator(mode="after")
    def _size_from_memory(self) -> ServerSettings:
        """Body and parse limits that fit the pod: see `bodies.estimate_parse_bytes`."""
        if not self.memory_limit_bytes:
            self.memory_limit_bytes = limits.detect_memory_limit()
        if not self.parse_memory_bytes:
            self.parse_memory_bytes = max(16 << 20, self.memory_limit_bytes * 2 // 5)
        if not self.max_body_bytes:
            self.max_body_bytes = max(1024, min(64 << 20, self.parse_memory_bytes // 10))
        return self

    @property
    def name(self) -> str:
        """The resolved model name (never empty after validation)."""
        assert self.model_name is not None
        return self.model_name

    @property
    def max_delay_s(self) -> float:
        return self.max_delay_ms / 1000.0


def flag_name(field: str) -> str:
    """The `serve` flag (without dashes) of a settings field."""
    info = ServerSettings.model_fields[field]
    return next((m.name for m in info.metadata if isinstance(m, Flag)), field.replace("_", "-"))


def _metavar(annotation: object) -> str | None:
    if get_origin(annotation) is Literal:
        return "{" + ",".join(str(a) for a in get_args(annotation)) + "}"
    if annotation in (int, float, int | None, float | None):
        return "N"
    if annotation is Path:
        return "PATH"
    return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per field of ServerSettings. Values stay strings: pydantic validates them the
    same way as env values, so a bad flag and a bad env var get the same message."""
    for field, info in ServerSettings.model_fields.items():
        help_text = f"{info.description or ''} [env {ENV_PREFIX}{field.upper()}]".strip()
        kwargs: dict[str, Any] = {"dest": field, "help": help_text}
        if info.annotation is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif metavar := _metavar(info.annotation):
            kwargs["metavar"] = metavar
        parser.add_argument(f"--{flag_name(field)}", **kwargs)


VISIBLE_DEVICE_VARS = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def resolve_instances(spec: str, *, on_gpu: bool, env: Mapping[str, str]) -> int:
    """`--instances` -> a count. `auto` gives one instance per GPU the pod may
    see (the operator sets ROCR_VISIBLE_DEVICES), and one on CPU."""
    spec = spec.strip().lower()
    if spec == "auto":
        if not on_gpu:
            return 1
        for var in VISIBLE_DEVICE_VARS:
            devices = [d for d in env.get(var, "").split(",") if d.strip()]
            if devices:
                return len(devices)
        return 1
    try:
        count = int(spec)
    except ValueError:
        raise ValueError(f"instances must be 'auto' or a positive integer, not {spec!r}") from None
    if count < 1:
        raise ValueError("instances must be at least 1")
    return count


def resolve_buckets(spec: str, max_batch_size: int, prefers_static_shapes: bool) -> list[int] | None:
    """`--batch-buckets` -> sorted sizes capped at max_batch_size, or None (no padding)."""
    spec = spec.strip().lower()
    if spec in ("off", "none", ""):
        return None
    if spec == "auto":
        if not prefers_static_shapes:
            return None
        sizes = {max_batch_size}
        size = 1
        while size < max_batch_size:
            sizes.add(size)
            size *= 2
        return sorted(sizes)
    try:
        sizes = {int(part) for part in spec.split(",") if part.strip()}
    except ValueError:
        raise ValueError(f"batch buckets must be 'auto', 'off' or integers, not {spec!r}") from None
    if any(s < 1 for s in sizes):
        raise ValueError("batch buckets must be positive")
    return sorted({s for s in sizes if s <= max_batch_size} | {max_batch_size})


def default_model_name(path: Path) -> str:
    """`/mnt/models` -> `models`, `/x/resnet50.onnx` -> `resnet50`."""
    name = path.stem if path.suffix in MODEL_SUFFIXES else path.name
    return name or "model"
