"""InferenceService (autoscaling.mode: keda) → KEDA ScaledObject with a prometheus trigger.

The trigger runs the very PromQL of the built-in loop against `prometheusUrl`. Every query
yields a per-replica (or service-wide) value, so the trigger is `metricType: Value`: KEDA's
HPA then computes `ceil(current * value / threshold)`, the same formula as the built-in loop.
`behavior` carries the spec's rate rules and stabilization. KEDA makes its own HPA
(`keda-hpa-NAME`), so it never collides with the one the hpa mode would emit.
"""

from __future__ import annotations

from ..jsontypes import JsonObject
from ..kinds import SCALED_OBJECT, TRIGGER_AUTHENTICATION
from ..prometheus import promql
from .common import Owner, object_meta, workload_ref
from .hpa import behavior


def _threshold(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def build_scaled_object(owner: Owner) -> JsonObject:
    scaling = owner.spec.autoscaling
    assert scaling is not None
    metadata = {
        "serverAddress": scaling.prometheus_url,
        "query": promql.metric_query(
            scaling.metric, owner.namespace, owner.model_name, scaling.window_seconds, owner.spec.runtime.engine
        ),
        "threshold": _threshold(scaling.target),
        # An empty answer means the pods are not scraped: an error, not a reason to scale down.
        "ignoreNullValues": "false",
    }
    trigger: JsonObject = {
        "type": "prometheus",
        "name": scaling.metric.value,
        "metricType": "Value",
        "metadata": metadata,
    }
    auth = scaling.prometheus_auth
    if auth and (auth.bearer_token_secret or auth.ca_secret):
        if auth.bearer_token_secret:
            metadata["authModes"] = "bearer"
        trigger["authenticationRef"] = {"name": owner.name}
    return {
        **SCALED_OBJECT.header(),
        "metadata": object_meta(owner),
        "spec": {
            "scaleTargetRef": workload_ref(owner),
            "pollingInterval": scaling.interval_seconds,
            "minReplicaCount": scaling.min_replicas,
            "maxReplicaCount": scaling.max_replicas,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": behavior(scaling)}},
            "triggers": [trigger],
        },
    }


def build_trigger_authentication(owner: Owner) -> JsonObject | None:
    """The KEDA TriggerAuthentication the ScaledObject refers to when prometheusAuth is set.

    Maps the spec's Secret references to the prometheus scaler's `bearerToken` and `ca`
    parameters; None when no auth is configured. Named after the InferenceService like every
    owned object, so the reconciler can find and delete it by name. KEDA reads the Secrets and
    sends them to `prometheusUrl`, so reconcile emits neither this nor the ScaledObject when
    `credentials` refuses them (unlabelled Secret, plain http, URL not allowed).
    """
    scaling = owner.spec.autoscaling
    auth = scaling.prometheus_auth if scaling else None
    if not auth or not (auth.bearer_token_secret or auth.ca_secret):
        return None
    refs = []
    if auth.bearer_token_secret:
        refs.append(
            {"parameter": "bearerToken", "name": auth.bearer_token_secret.name, "key": auth.bearer_token_secret.key}
        )
    if auth.ca_secret:
        refs.append({"parameter": "ca", "name": auth.ca_secret.name, "key": auth.ca_secret.key})
    return {
        **TRIGGER_AUTHENTICATION.header(),
        "metadata": object_meta(owner),
        "spec": {"secretTargetRef": refs},
    }
