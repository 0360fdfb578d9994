"""Latency-SLO autoscaling: the mode, the metric and its target, Prometheus, scaling rates, and
scale to zero."""

from __future__ import annotations

from enum import StrEnum

from pydantic import ConfigDict, Field

from .base import SpecModel, cel, cel_rules
from .engines import Metric, metrics_per_engine

DEFAULT_PROMETHEUS_URL = "http://prometheus-operated.monitoring:9090"


class AutoscalingMode(StrEnum):
    BUILTIN = "builtin"
    HPA = "hpa"
    KEDA = "keda"


class ScalingRule(SpecModel):
    """How fast replicas may be added (scaleUp) or removed (scaleDown): at most `pods` replicas or
    `percent` of the replicas, whichever allows more, per `periodSeconds` (an HPA's behavior
    policies, selectPolicy Max)."""

    pods: int = Field(4, ge=1, description="Replicas that may be added or removed per period.")
    percent: int = Field(
        100, ge=1, description="Percent of the current replicas that may be added or removed per period."
    )
    period_seconds: int = Field(15, ge=1, le=1800, description="Seconds over which pods and percent are counted.")


class SecretKeyRef(SpecModel):
    """A key of a Secret in the InferenceService's namespace. The operator uses it only when the
    Secret carries the label inference.rocm.dev/prometheus-credentials: "true" and the operator
    allows Prometheus credentials (chart value prometheusAuth.enabled)."""

    name: str = Field(min_length=1, description="Name of the Secret, in the InferenceService's namespace.")
    key: str = Field(min_length=1, description="Key in the Secret whose value is used.")


class PrometheusAuth(SpecModel):
    """Credentials for a Prometheus that asks for them (the built-in loop's queries, or a KEDA
    TriggerAuthentication); sent only over https unless the operator allows plain http."""

    bearer_token_secret: SecretKeyRef | None = Field(
        None, description="Secret key holding a bearer token, sent as Authorization: Bearer on every query."
    )
    ca_secret: SecretKeyRef | None = Field(
        None, description="Secret key holding the PEM CA bundle that verifies the Prometheus server's certificate."
    )


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


# AutoscalingSpec's rules by name: a role of spec.disaggregation keeps the first and replaces the
# scale-to-zero pair's (the pair goes to zero together, models/disaggregation.py).
MIN_MAX_RULE = cel(
    "!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
    "autoscaling.minReplicas must be <= autoscaling.maxReplicas",
    ".minReplicas",
)
SCALE_TO_ZERO_RULES = (
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


class AutoscalingSpec(SpecModel):
    """Autoscaling on a latency SLO or a load metric read from Prometheus, between minReplicas and
    maxReplicas; the scaler writes spec.replicas (the scale subresource)."""

    model_config = ConfigDict(json_schema_extra=cel_rules(MIN_MAX_RULE, *SCALE_TO_ZERO_RULES))

    mode: AutoscalingMode = Field(
        AutoscalingMode.BUILTIN,
        description="builtin runs the operator's own loop; hpa and keda emit an HPA or a KEDA ScaledObject instead.",
    )
    min_replicas: int = Field(
        1,
        ge=0,
        description="Fewest replicas the scaler sets; 0 scales the service to zero when idle (with scaleToZero, "
        "mode builtin).",
    )
    max_replicas: int = Field(ge=1, le=1000, description="Most replicas the scaler sets; at least minReplicas.")
    metric: Metric = Field(
        Metric.LATENCY_P95_MS,
        description="What is held at target, one the engine exports: "
        + metrics_per_engine(lambda traits: traits.metrics)
        + ". Latencies (…Ms) are p95/p99 in milliseconds over windowSeconds; queueDepth and requestsWaiting are "
        "requests waiting per replica; rps is requests per second per replica; gpuUtilization and kvCacheUsage "
        "are percent.",
    )
    target: float = Field(
        gt=0,
        description="Target value of the metric per replica, in the metric's unit (ms for a latency, requests for "
        "queueDepth and requestsWaiting, req/s for rps, percent for gpuUtilization and kvCacheUsage).",
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
    prometheus_auth: PrometheusAuth | None = Field(
        None, description="Credentials for prometheusUrl (a bearer token, a CA); none when unset."
    )
    interval_seconds: int = Field(
        15,
        ge=1,
        le=3600,
        description="Seconds between two readings of the metric and scaling decisions (mode builtin), or KEDA's "
        "pollingInterval (mode keda).",
    )
    window_seconds: int = Field(
        60, ge=10, le=3600, description="Seconds of history each reading covers (the PromQL rate() window)."
    )
    tolerance: float = Field(
        0.1,
        ge=0,
        lt=1,
        description="Relative distance from target within which replicas stay as they are (0.1: within 10%), "
        "so noise does not move them.",
    )
    scale_down_stabilization_seconds: int = Field(
        300,
        ge=0,
        le=3600,
        description="Replicas are removed only to the highest count recommended over this many seconds, so a "
        "short dip in load does not scale down (the HPA's scaleDown stabilizationWindowSeconds).",
    )
    scale_up: ScalingRule = Field(
        default_factory=ScalingRule,
        description="How fast replicas may be added; mode builtin counts the limit per decision rather than per "
        "period while the metric is far above target.",
    )
    scale_down: ScalingRule = Field(default_factory=ScalingRule, description="How fast replicas may be removed.")
    scale_to_zero: ScaleToZeroSpec | None = Field(
        None, description="Go to zero replicas when idle and back on the first request (with minReplicas 0)."
    )
