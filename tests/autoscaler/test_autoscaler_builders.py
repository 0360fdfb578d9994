"""HPA v2 and KEDA ScaledObject emission for `autoscaling.mode: hpa | keda`."""

from __future__ import annotations

import jsonschema
import kubernetes_validate
import pytest

from inference_operator.builders import OWNED_KINDS, Owner, build_all, build_deployment
from inference_operator.builders.hpa import PROMQL_ANNOTATION, build_hpa, quantity
from inference_operator.builders.keda import (
    build_scaled_object,
    build_trigger_authentication,
)
from inference_operator.models import ENGINES, Engine, Metric, parse_spec
from inference_operator.prometheus import promql

K8S_VERSION = "1.33"


def owner(**autoscaling) -> Owner:
    # vLLM's metrics need the vllm engine (the model server does not export them).
    metric = Metric(autoscaling.get("metric", Metric.LATENCY_P95_MS))
    engine = Engine.VLLM if metric in ENGINES[Engine.VLLM].traits.metrics else Engine.MODEL_SERVER
    spec = parse_spec(
        {
            "model": {"uri": "pvc://models/resnet50", "name": "resnet-50"},
            "runtime": {"engine": engine.value},
            "autoscaling": {"maxReplicas": 8, "target": 50, **autoscaling},
        }
    )
    return Owner(name="resnet", namespace="ml", uid="1234", spec=spec)


# The parts of KEDA's ScaledObject CRD (keda.sh/v1alpha1, KEDA 2.x) the operator writes.
# additionalProperties: false catches a misspelt field the real CRD would silently prune.
_RULES = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "stabilizationWindowSeconds": {"type": "integer", "minimum": 0, "maximum": 3600},
        "selectPolicy": {"enum": ["Max", "Min", "Disabled"]},
        "policies": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["type", "value", "periodSeconds"],
                "additionalProperties": False,
                "properties": {
                    "type": {"enum": ["Pods", "Percent"]},
                    "value": {"type": "integer", "minimum": 1},
                    "periodSeconds": {"type": "integer", "minimum": 1, "maximum": 1800},
                },
            },
        },
    },
}
SCALED_OBJECT_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "name": {"type": "string"},
                        "envSourceContainerName": {"type": "string"},
                    },
                },
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer"},
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "advanced": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "restoreToOriginalReplicaCount": {"type": "boolean"},
                        "horizontalPodAutoscalerConfig": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "name": {"type": "string"},
                                "behavior": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {"scaleUp": _RULES, "scaleDown": _RULES},
                                },
                            },
                        },
                    },
                },
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "additionalProperties": False,
                        "properties": {
                            "type": {"type": "string"},
                            "name": {"type": "string"},
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "useCachedMetrics": {"type": "boolean"},
                            "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
                            "authenticationRef": {
                                "type": "object",
                                "required": ["name"],
                                "properties": {"name": {"type": "string"}, "kind": {"type": "string"}},
                            },
                        },
                    },
                },
            },
        },
    },
}


@pytest.mark.parametrize("metric", list(Metric))
def test_autoscaler_hpa_is_valid_autoscaling_v2(metric: Metric) -> None:
    hpa = build_hpa(owner(mode="hpa", metric=metric.value, target=0.75))
    kubernetes_validate.validate(hpa, K8S_VERSION, strict=True)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "resnet"}
    (spec,) = hpa["spec"]["metrics"]
    # Series carry the model as `model` (model server) or `model_name` (vLLM).
    label = "model_name" if metric in ENGINES[Engine.VLLM].traits.metrics else "model"
    service_wide = (
        Metric.LATENCY_P95_MS,
        Metric.LATENCY_P99_MS,
        Metric.TTFT_P95_MS,
        Metric.ITL_P95_MS,
        Metric.E2E_LATENCY_P95_MS,
        Metric.KV_CACHE_USAGE,
    )
    if metric in service_wide:
        assert spec["type"] == "External"
        assert spec["external"]["target"] == {"type": "Value", "value": "750m"}
        assert spec["external"]["metric"]["selector"] == {"matchLabels": {label: "resnet-50"}}
    else:
        assert spec["type"] == "Pods"
        assert spec["pods"]["target"] == {"type": "AverageValue", "averageValue": "750m"}
        if metric != Metric.GPU_UTILIZATION:
            assert spec["pods"]["metric"]["selector"] == {"matchLabels": {label: "resnet-50"}}


def test_autoscaler_hpa_carries_bounds_behavior_and_the_promql() -> None:
    hpa = build_hpa(
        owner(
            mode="hpa",
            minReplicas=2,
            maxReplicas=6,
            scaleDownStabilizationSeconds=120,
            scaleUp={"pods": 2, "percent": 50, "periodSeconds": 30},
            windowSeconds=120,
        )
    )
    spec = hpa["spec"]
    assert (spec["minReplicas"], spec["maxReplicas"]) == (2, 6)
    assert spec["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 120
    assert spec["behavior"]["scaleUp"]["stabilizationWindowSeconds"] == 0
    assert {"type": "Pods", "value": 2, "periodSeconds": 30} in spec["behavior"]["scaleUp"]["policies"]
    assert {"type": "Percent", "value": 50, "periodSeconds": 30} in spec["behavior"]["scaleUp"]["policies"]
    assert hpa["metadata"]["annotations"][PROMQL_ANNOTATION] == promql.metric_query(
        Metric.LATENCY_P95_MS, "ml", "resnet-50", 120
    )
    assert hpa["metadata"]["ownerReferences"][0]["uid"] == "1234"


@pytest.mark.parametrize(
    ("value", "expected"), [(50, "50"), (50.0, "50"), (0.5, "500m"), (12.345, "12345m"), (0.0001, "1m"), (2.9999, "3")]
)
def test_autoscaler_target_quantities(value: float, expected: str) -> None:
    assert quantity(value) == expected


@pytest.mark.parametrize("metric", list(Metric))
def test_autoscaler_scaled_object_matches_keda_schema(metric: Metric) -> None:
    scaled = build_scaled_object(owner(mode="keda", metric=metric.value, intervalSeconds=5, target=12.5))
    jsonschema.validate(scaled, SCALED_OBJECT_SCHEMA)
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metricType"] == "Value"
    assert trigger["metadata"]["query"] == promql.metric_query(metric, "ml", "resnet-50", 60)
    assert trigger["metadata"]["threshold"] == "12.5"
    assert trigger["metadata"]["serverAddress"] == "http://prometheus-operated.monitoring:9090"
    assert scaled["spec"]["pollingInterval"] == 5
    assert scaled["spec"]["scaleTargetRef"]["name"] == "resnet"


def test_autoscaler_scaled_object_behavior_is_a_valid_hpa_behavior() -> None:
    # The behavior block is copied by KEDA into the HPA it creates: it must pass as one.
    scaled = build_scaled_object(owner(mode="keda", scaleDown={"pods": 1, "percent": 10}))
    behavior = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    hpa = build_hpa(owner(mode="hpa"))
    hpa["spec"]["behavior"] = behavior
    kubernetes_validate.validate(hpa, K8S_VERSION, strict=True)
    assert behavior["scaleDown"]["policies"][0] == {"type": "Pods", "value": 1, "periodSeconds": 15}


def test_autoscaler_keda_auth_refers_to_a_trigger_authentication() -> None:
    plain = owner(mode="keda")
    assert "authenticationRef" not in build_scaled_object(plain)["spec"]["triggers"][0]
    assert build_trigger_authentication(plain) is None
    auth = owner(
        mode="keda",
        prometheusAuth={
            "bearerTokenSecret": {"name": "prom", "key": "token"},
            "caSecret": {"name": "prom-ca", "key": "ca.crt"},
        },
    )
    trigger = build_scaled_object(auth)["spec"]["triggers"][0]
    assert trigger["authenticationRef"] == {"name": "resnet"}
    assert trigger["metadata"]["authModes"] == "bearer"
    ta = build_trigger_authentication(auth)
    assert ta["metadata"]["name"] == "resnet"
    assert ta["spec"]["secretTargetRef"] == [
        {"parameter": "bearerToken", "name": "prom", "key": "token"},
        {"parameter": "ca", "name": "prom-ca", "key": "ca.crt"},
    ]


@pytest.mark.parametrize(
    ("mode", "kind", "absent"),
    [
        ("builtin", None, {"HorizontalPodAutoscaler", "ScaledObject"}),
        ("hpa", "HorizontalPodAutoscaler", {"ScaledObject"}),
        ("keda", "ScaledObject", {"HorizontalPodAutoscaler"}),
    ],
)
def test_autoscaler_build_all_emits_by_mode(mode: str, kind: str | None, absent: set[str]) -> None:
    kinds = [o["kind"] for o in build_all(owner(mode=mode))]
    if kind:
        assert kinds.count(kind) == 1
    assert not absent & set(kinds)
    # Both kinds are owned, so switching modes deletes the one no longer wanted.
    assert {("autoscaling/v2", "HorizontalPodAutoscaler"), ("keda.sh/v1alpha1", "ScaledObject")} <= set(OWNED_KINDS)


def test_autoscaler_hpa_and_keda_modes_leave_deployment_replicas_to_the_hpa() -> None:
    assert "replicas" not in build_deployment(owner(mode="hpa"))["spec"]
    assert "replicas" not in build_deployment(owner(mode="keda"))["spec"]
    assert build_deployment(owner(mode="builtin"))["spec"]["replicas"] == 1
