"""InferenceService → v1 Service: a stable in-cluster address for the model's pods.

Port `http` (80) serves the inference API (/v1/* for vLLM); port `metrics` serves /metrics,
which vLLM answers on its API port; port `grpc` (runtime.grpcPort) the Open Inference Protocol over
gRPC, marked `appProtocol: grpc` for meshes and gateways that route HTTP/2 by it.
"""

from __future__ import annotations

from ..jsontypes import JsonObject
from ..kinds import SERVICE
from ..models import ENGINES
from .common import Owner, object_meta, serving_labels

HTTP_PORT = 80


def build_service(owner: Owner) -> JsonObject:
    runtime = owner.spec.runtime
    metrics_target = "http" if ENGINES[runtime.engine].traits.metrics_on_api_port else "metrics"
    return {
        **SERVICE.header(),
        "metadata": object_meta(owner),
        "spec": {
            "type": "ClusterIP",
            "selector": serving_labels(owner),  # a multi-node replica's leader only
            "ports": [
                {"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
                {
                    "name": "metrics",
                    "port": runtime.metrics_port,
                    "targetPort": metrics_target,
                    "protocol": "TCP",
                },
                *(
                    [
                        {
                            "name": "grpc",
                            "port": runtime.grpc_port,
                            "targetPort": "grpc",
                            "protocol": "TCP",
                            "appProtocol": "grpc",
                        }
                    ]
                    if runtime.grpc_port is not None
                    else []
                ),
            ],
        },
    }
