"""The bundled model server (`python -m model_server serve`): ONNX Runtime or TorchScript models
with dynamic batching, the Open Inference Protocol over HTTP and gRPC, metrics on a port of their
own. Its container is built by builders/model_server.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .base import (
    Engine,
    GpuGauge,
    Metric,
    PodGauge,
    PodRate,
    Quantile,
    ReservedArgs,
    ScalingName,
    Series,
    Traits,
)

LATENCY_HISTOGRAM = "model_server_request_duration_seconds"
REQUESTS_TOTAL = "model_server_requests_total"
QUEUE_DEPTH = "model_server_queue_depth"
INFLIGHT = "model_server_inflight_requests"
GPU_UTILIZATION = "model_server_gpu_utilization_percent"
CONTAINER = "model-server"


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
    image_setting: str = "model_server"
    container: str = CONTAINER
    # Its flags the operator sets are the operator's own (models.engines.OPERATOR_FLAGS).
    args: ReservedArgs | None = None
    multi_node_flags: tuple[str, ...] = ()

    def multi_node_args(self, nodes: int, rank: str, master_address: str, master_port: int) -> list[str]:
        raise ValueError("the model server runs on one node")


MODEL_SERVER = ModelServer()
