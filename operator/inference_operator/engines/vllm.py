"""vLLM's OpenAI-compatible server for LLMs: tensor parallel over a node's GPUs, pipeline
parallel across nodes, LoRA adapters at run time, its metrics (`vllm:*`) on its API port. Its
container and the front before it are built by builders/vllm.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .base import Engine, Metric, PodGauge, Quantile, ReservedArgs, ScalingName, Series, Traits

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
    image_setting: str = "vllm"
    container: str = CONTAINER
    args: ReservedArgs | None = ReservedArgs(ARG_PATTERN, RESERVED_FLAGS)
    multi_node_flags: tuple[str, ...] = MULTI_NODE_FLAGS

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


VLLM = Vllm()
