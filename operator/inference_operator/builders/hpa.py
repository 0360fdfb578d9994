"""InferenceService (autoscaling.mode: hpa) → autoscaling/v2 HorizontalPodAutoscaler.

For clusters that scale with prometheus-adapter: latency is a service-wide number, so it is an
External metric with a Value target; queue depth, request rate and GPU use are per pod, so they
are Pods metrics with an AverageValue target. The adapter rule has to expose the metric under
the name used here; the PromQL the built-in loop would run is put in an annotation to copy
into that rule. The HPA drives the Deployment directly (the operator then leaves its
replicas alone). Tolerance and the fast scale-up path have no HPA equivalent.
"""

from __future__ import annotations

from ..jsontypes import JsonObject
from ..kinds import HORIZONTAL_POD_AUTOSCALER
from ..models import AutoscalingSpec, Metric, ScalingRule
from ..prometheus import promql
from .common import Owner, object_meta, workload_ref

PROMQL_ANNOTATION = "inference.rocm.dev/promql"

# Names under which prometheus-adapter is expected to serve each metric.
EXTERNAL_METRICS = {
    Metric.LATENCY_P95_MS: "model_server_request_latency_p95_ms",
    Metric.LATENCY_P99_MS: "model_server_request_latency_p99_ms",
    Metric.TTFT_P95_MS: "vllm_time_to_first_token_p95_ms",
    Metric.ITL_P95_MS: "vllm_inter_token_latency_p95_ms",
    Metric.E2E_LATENCY_P95_MS: "vllm_e2e_request_latency_p95_ms",
    Metric.KV_CACHE_USAGE: "vllm_kv_cache_usage_percent",
}
PODS_METRICS = {
    # vLLM's `vllm:` prefix is not a valid metric name in the custom metrics API.
    Metric.REQUESTS_WAITING: "vllm_num_requests_waiting",
    Metric.QUEUE_DEPTH: promql.QUEUE_DEPTH,
    # The adapter's default rule turns a `_total` counter into a `_per_second` rate.
    Metric.RPS: "model_server_requests_per_second",
    Metric.GPU_UTILIZATION: promql.GPU_UTILIZATION,
}


def quantity(value: float) -> str:
    """A Kubernetes quantity for a target: whole numbers as such, else in milli-units."""
    if float(value).is_integer():
        return str(int(value))
    milli = max(1, round(value * 1000))
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def behavior(scaling: AutoscalingSpec) -> JsonObject:
    """HPA `behavior` from the spec's rate rules and scale-down stabilization."""

    def rules(rule: ScalingRule, stabilization: int) -> JsonObject:
        return {
            "stabilizationWindowSeconds": stabilization,
            "selectPolicy": "Max",
            "policies": [
                {"type": "Pods", "value": rule.pods, "periodSeconds": rule.period_seconds},
                {"type": "Percent", "value": rule.percent, "periodSeconds": rule.period_seconds},
            ],
        }

    return {
        "scaleUp": rules(scaling.scale_up, 0),
        "scaleDown": rules(scaling.scale_down, scaling.scale_down_stabilization_seconds),
    }


def metric_spec(owner: Owner) -> JsonObject:
    scaling = owner.spec.autoscaling
    assert scaling is not None
    target = quantity(scaling.target)
    label = promql.SERIES[owner.spec.runtime.engine].model_label
    model = {"matchLabels": {label: owner.model_name}}
    if scaling.metric in EXTERNAL_METRICS:
        return {
            "type": "External",
            "external": {
                "metric": {"name": EXTERNAL_METRICS[scaling.metric], "selector": model},
                "target": {"type": "Value", "value": target},
            },
        }
    metric: JsonObject = {"name": PODS_METRICS[scaling.metric]}
    if scaling.metric != Metric.GPU_UTILIZATION:  # the GPU gauge has no model label
        metric["selector"] = model
    return {
        "type": "Pods",
        "pods": {"metric": metric, "target": {"type": "AverageValue", "averageValue": target}},
    }


def build_hpa(owner: Owner) -> JsonObject:
    scaling = owner.spec.autoscaling
    assert scaling is not None
    query = promql.metric_query(scaling.metric, owner.namespace, owner.model_name, scaling.window_seconds)
    return {
        **HORIZONTAL_POD_AUTOSCALER.header(),
        "metadata": object_meta(owner, annotations={PROMQL_ANNOTATION: query}),
        "spec": {
            "scaleTargetRef": workload_ref(owner),
            "minReplicas": scaling.min_replicas,
            "maxReplicas": scaling.max_replicas,
            "metrics": [metric_spec(owner)],
            "behavior": behavior(scaling),
        },
    }
