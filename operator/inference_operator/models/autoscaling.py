"""Latency-SLO autoscaling: the mode, the metric and its target, Prometheus, scaling rates, and
scale to zero."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import ConfigDict, Field

from .base import SpecModel, cel, cel_rules
from .engines import Metric

DEFAULT_PROMETHEUS_URL = "http://prometheus-operated.monitoring:9090"


class AutoscalingMode(StrEnum):
    BUILTIN = "builtin"
    HPA = "hpa"
    KEDA = "keda"


class ScalingRule(SpecModel):
    """At most `pods` or `percent` of current replicas per `periodSeconds` (the larger wins)."""

    pods: Annotated[int, Field(ge=1)] = 4
    percent: Annotated[int, Field(ge=1)] = 100
    period_seconds: Annotated[int, Field(ge=1, le=1800)] = 15


class SecretKeyRef(SpecModel):
    name: Annotated[str, Field(min_length=1)]
    key: Annotated[str, Field(min_length=1)]


class PrometheusAuth(SpecModel):
    bearer_token_secret: SecretKeyRef | None = None
    ca_secret: SecretKeyRef | None = None


class ScaleToZeroSpec(SpecModel):
    """Scale to zero replicas when idle, and back on the first request (autoscaling.minReplicas 0).

    At zero the service's requests go to the activator (installed by the chart), which holds each
    one, wakes the service and answers it once a replica is Ready."""

    idle_seconds: int = Field(
        300, ge=10, le=86400, description="Seconds without a request after which the service goes to zero replicas."
    )
    max_wait_seconds: int = Field(
        600,
        ge=1,
        le=3600,
        description="The longest a request held at zero waits for a Ready replica (a cold start: image pull, "
        "model fetch, compilation); past it the activator answers 503 with Retry-After.",
    )
    max_held_requests: int = Field(
        1000, ge=1, le=100000, description="Requests held at once for this service; beyond them: 429."
    )


class AutoscalingSpec(SpecModel):
    """Latency-SLO autoscaling; absent means a fixed `spec.replicas`."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
                "autoscaling.minReplicas must be <= autoscaling.maxReplicas",
                ".minReplicas",
            ),
            cel(
                "(has(self.minReplicas) && self.minReplicas == 0) == has(self.scaleToZero)",
                "autoscaling.minReplicas 0 and autoscaling.scaleToZero go together: scaleToZero says when to go "
                "to zero and how long a request may wait for the first replica",
                ".scaleToZero",
            ),
            cel(
                "!has(self.scaleToZero) || !has(self.mode) || self.mode == 'builtin'",
                "autoscaling.scaleToZero needs mode builtin: an HPA cannot go below one replica, and KEDA "
                "would wake the service only after its next Prometheus poll while the first request waits",
                ".mode",
            ),
        )
    )

    mode: AutoscalingMode = Field(
        AutoscalingMode.BUILTIN,
        description="builtin runs the operator's own loop; hpa and keda emit an HPA or a KEDA ScaledObject instead.",
    )
    min_replicas: int = Field(1, ge=0, description="0 scales the service to zero when idle (with scaleToZero).")
    max_replicas: Annotated[int, Field(ge=1, le=1000)]
    metric: Metric = Metric.LATENCY_P95_MS
    target: float = Field(
        gt=0,
        description="Target value of the metric per replica (ms for latency, requests for queueDepth, req/s for "
        "rps, percent for gpuUtilization).",
    )
    prometheus_url: str = Field(
        DEFAULT_PROMETHEUS_URL,
        # A base URL: the operator appends /api/v1/query itself. No user info, query or fragment,
        # so the URL cannot steer a request anywhere but a Prometheus query path.
        pattern=r"^https?://[^/?#@\s]+(/[^?#\s]*)?$",
        max_length=2048,
        description="Base URL of the Prometheus HTTP API (scheme, host, port, optional path prefix); "
        "it must be on the operator's allowed list (chart value prometheus.allowedUrls).",
    )
    prometheus_auth: PrometheusAuth | None = None
    interval_seconds: Annotated[int, Field(ge=1, le=3600)] = 15
    window_seconds: int = Field(60, ge=10, le=3600, description="Range of the PromQL rate() window.")
    tolerance: Annotated[float, Field(ge=0, lt=1)] = 0.1
    scale_down_stabilization_seconds: Annotated[int, Field(ge=0, le=3600)] = 300
    scale_up: ScalingRule = Field(default_factory=ScalingRule)
    scale_down: ScalingRule = Field(default_factory=ScalingRule)
    scale_to_zero: ScaleToZeroSpec | None = Field(
        None, description="Go to zero replicas when idle and back on the first request (with minReplicas 0)."
    )
