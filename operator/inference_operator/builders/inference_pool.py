"""InferenceService (routing.inferencePool: true) → Gateway API Inference Extension InferencePool.

An inference gateway routes to the pool's pods through an endpoint picker (EPP), which reads
each pod's queue and KV-cache load from its metrics (for vLLM: `vllm:num_requests_waiting`,
`vllm:kv_cache_usage_perc`) and its OpenAI API. The picker is installed with the Inference
Extension's own chart; the pool names it. Only `inference.networking.k8s.io/v1` fields that
v1.0 already required are set, so the object is valid for every v1 release of the CRD.
"""

from __future__ import annotations

from ..jsontypes import JsonObject
from ..kinds import INFERENCE_POOL, SERVICE
from .common import Owner, object_meta, serving_labels


def endpoint_picker_name(owner: Owner) -> str:
    picker = owner.spec.routing.endpoint_picker
    return (picker.name if picker and picker.name else None) or f"{owner.name}-epp"


def build_inference_pool(owner: Owner) -> JsonObject:
    routing = owner.spec.routing
    picker = routing.endpoint_picker
    return {
        **INFERENCE_POOL.header(),
        "metadata": object_meta(owner),
        "spec": {
            "selector": {"matchLabels": serving_labels(owner)},
            # The pods' serving port (the picker addresses pods directly, not the Service).
            "targetPorts": [{"number": owner.spec.runtime.port}],
            "endpointPickerRef": {
                "group": "",
                "kind": SERVICE.kind,
                "name": endpoint_picker_name(owner),
                "port": {"number": picker.port if picker else 9002},
                "failureMode": picker.failure_mode if picker else "FailClose",
            },
        },
    }
