"""InferenceService (autoscaling.mode: hpa) → autoscaling/v2 HorizontalPodAutoscaler.

For clusters that scale with prometheus-adapter: latency is a service-wide number, so it is an
External metric with a Value target; queue depth, request rate and GPU use are per pod, so they
are Pods metrics with an AverageValue target (each engine names its metrics so, `scaling_names`).
The adapter rule has to expose the metric under the name used here; the PromQL the built-in
loop would run is put in an annotation to copy into that rule. The HPA drives the Deployment
directly (the operator then leaves its replicas alone). Tolerance and the fast scale-up path have no HPA equivalent.
"""

from __future__ import annotations

from ..jsontypes import JsonObject
from ..kinds import HORIZONTAL_POD_AUTOSCALER
from ..models import ENGINES, AutoscalingSpec, ScalingRule
from ..prometheus import promql
from .common import Owner, object_meta, workload_ref

PROMQL_ANNOTATION = "inference.rocm.dev/promql"


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
    # The spec's engine exports the metric (the CRD's rule) and names it.
    serving = ENGINES[owner.spec.runtime.engine]
    name, label = serving.scaling_names[scaling.metric], serving.series.model_label
    model = {"matchLabels": {label: owner.model_name}}
    if name.external:
        return {
            "type": "External",
            "external": {
                "metric": {"name": name.name, "selector": model},
                "target": {"type": "Value", "value": target},
            },
        }
    metric: JsonObject = {"name": name.name}
    if name.by_model:
        metric["selector"] = model
    return {
        "type": "Pods",
        "pods": {"metric": metric, "target": {"type": "AverageValue", "averageValue": target}},
    }


def build_hpa(owner: Owner) -> JsonObject:
    scaling = owner.spec.autoscaling
    assert scaling is not None
    query = promql.metric_query(
        scaling.metric, owner.namespace, owner.model_name, scaling.window_seconds, owner.spec.runtime.engine
    )
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
