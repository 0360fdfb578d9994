"""Who a serving container's spans come from, for runtime.tracing: the pod, its namespace and the
InferenceService, as OpenTelemetry resource attributes (OTEL_RESOURCE_ATTRIBUTES, which both the
model server's and vLLM's SDK read). The pod's name comes from the downward API."""

from __future__ import annotations

from ..jsontypes import JsonObject
from .common import Owner

POD_NAME_ENV = "OTEL_K8S_POD_NAME"
RESOURCE_ATTRIBUTES_ENV = "OTEL_RESOURCE_ATTRIBUTES"


def resource_env(owner: Owner) -> list[JsonObject]:
    """The serving container's resource attributes when runtime.tracing is set, else nothing."""
    if owner.spec.runtime.tracing is None:
        return []
    attributes = {
        "k8s.pod.name": f"$({POD_NAME_ENV})",
        "k8s.namespace.name": owner.namespace,
        "inference.service": owner.name,
    }
    return [
        {"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": RESOURCE_ATTRIBUTES_ENV, "value": ",".join(f"{k}={v}" for k, v in attributes.items())},
    ]
