"""InferenceService → v1 Service: a stable in-cluster address for the model's pods."""

from __future__ import annotations

from .common import Owner, object_meta, selector_labels

HTTP_PORT = 80


def build_service(owner: Owner) -> dict:
    runtime = owner.spec.runtime
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(owner),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(owner),
            "ports": [
                {"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
                {
                    "name": "metrics",
                    "port": runtime.metrics_port,
                    "targetPort": "metrics",
                    "protocol": "TCP",
                },
            ],
        },
    }
