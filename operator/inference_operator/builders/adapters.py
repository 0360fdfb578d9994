"""spec.adapters → LoRA adapters loaded into running vLLM replicas, without a restart.

The wanted adapters live in a ConfigMap named after the service (`adapters.json`), not in the
pod template: changing them rolls no pod. Each pod mounts it, and its `adapters` sidecar (the
operator's model-server image, `model_server.adapters`) fetches every listed adapter into a
volume vLLM reads and loads it through vLLM's runtime endpoints on loopback, unloads the ones
that left the list, and reports each one's state on its port for status.adapters. vLLM's
adapter endpoints would otherwise be open to every client of the Service: vLLM loads a guard
middleware (`--middleware`, copied next to it by the sidecar) that refuses them from anywhere
but loopback. The sidecar is a native sidecar (an init container that keeps running), so vLLM
starts after the guard is in place, and its readiness holds a new pod out of the Service until
the adapters it started with are loaded.

The sidecar fetches with the model fetcher's rules: the platform's proxy and CA, the Hub token
of model.huggingFace for hf://, S3's variables of runtime.env for s3://, and nothing else of
runtime.env. Holding those, it shares with vLLM (which runs the author's code) only the two
volumes it writes and vLLM mounts read-only (the adapters' files and the guard); its /tmp, its
HOME and every tool's configuration path are in a volume of its own.
"""

from __future__ import annotations

import json

from ..engines.base import LoraWiring
from ..jsontypes import JsonObject
from ..kinds import CONFIG_MAP
from ..models import ENGINES, InferenceServiceSpec, LoraSpec
from .common import Owner, engine_port, object_meta
from .storage import TOOL_CONFIG_ENV, adapter_fetch_env, tool_config_env

SIDECAR = "adapters"
CONFIG_KEY = "adapters.json"
LIST_VOLUME = "adapter-list"
LIST_DIR = "/etc/inference/adapters"
FILES_VOLUME = "adapters"
FILES_DIR = "/var/lib/adapters"  # the same path in the sidecar and in vLLM: vLLM loads from it
PLUGINS_VOLUME = "vllm-plugins"
PLUGINS_DIR = "/var/run/vllm-plugins"
# The sidecar's own /tmp, its HOME and every tool's configuration: no other container mounts it.
# (The pod's `tmp` volume is vLLM's, writable by the author's code: an AWS config planted there
# would have run its credential_process in here, with the Hub token in its environment.)
PRIVATE_VOLUME = "adapters-home"
PRIVATE_DIR = "/tmp"
GUARD_MIDDLEWARE = "rocm_inference_guard.LocalAdminOnly"
STATUS_PATH = "/adapters"


def lora_enabled(spec: InferenceServiceSpec) -> bool:
    """LoRA is on for a vLLM service with adapters or runtime.lora: turning it on rolls the pods
    once; adapters added after that do not."""
    return ENGINES[spec.runtime.engine].traits.lora and (bool(spec.adapters) or spec.runtime.lora is not None)


def sidecar_port(spec: InferenceServiceSpec) -> int:
    """vLLM serves its metrics on its API port, which leaves runtime.metricsPort to the sidecar
    (the CRD already keeps it apart from runtime.port)."""
    return spec.runtime.metrics_port


def lora_wiring(spec: InferenceServiceSpec) -> LoraWiring | None:
    """What the serving container needs of runtime LoRA (its engine's flags and environment come
    from the engine: `ServingEngine.pod`), None when LoRA is off."""
    if not lora_enabled(spec):
        return None
    lora = spec.runtime.lora or LoraSpec()
    mounts: list[JsonObject] = [
        {"name": FILES_VOLUME, "mountPath": FILES_DIR, "readOnly": True},
        {"name": PLUGINS_VOLUME, "mountPath": PLUGINS_DIR, "readOnly": True},
    ]
    return LoraWiring(lora.max_loras, lora.max_lora_rank, GUARD_MIDDLEWARE, PLUGINS_DIR, mounts)


def adapter_volumes(owner: Owner) -> list[JsonObject]:
    return [
        {"name": LIST_VOLUME, "configMap": {"name": owner.name, "items": [{"key": CONFIG_KEY, "path": CONFIG_KEY}]}},
        {"name": FILES_VOLUME, "emptyDir": {}},
        {"name": PLUGINS_VOLUME, "emptyDir": {"sizeLimit": "1Mi"}},
        {"name": PRIVATE_VOLUME, "emptyDir": {}},
    ]


def adapters_document(spec: InferenceServiceSpec) -> str:
    """The ConfigMap's file, in the spec's order (the sidecar loads them in that order)."""
    return json.dumps({"adapters": [{"name": a.name, "uri": a.uri} for a in spec.adapters]}, indent=1)


def build_adapters_config_map(owner: Owner) -> JsonObject:
    return {
        **CONFIG_MAP.header(),
        "metadata": object_meta(owner),
        "data": {CONFIG_KEY: adapters_document(owner.spec)},
    }


def _probe(path: str, period: int, failures: int) -> JsonObject:
    return {
        "httpGet": {"path": path, "port": SIDECAR},
        "periodSeconds": period,
        "timeoutSeconds": 2,
        "failureThreshold": failures,
    }


def sidecar_env(owner: Owner, user_env: list[JsonObject]) -> list[JsonObject]:
    """The fetcher's variables, with HOME and every tool's configuration in the sidecar's own
    directory (never the pod's shared /tmp)."""
    fetch = [e for e in adapter_fetch_env(owner, user_env) if e["name"] not in TOOL_CONFIG_ENV]
    return fetch + tool_config_env(PRIVATE_DIR)


def adapters_sidecar(owner: Owner, user_env: list[JsonObject], security_context: JsonObject) -> JsonObject:
    """The native sidecar that keeps vLLM's adapters equal to the ConfigMap's list."""
    spec = owner.spec
    port = sidecar_port(spec)
    command = [
        "python",
        "-m",
        "model_server.adapters",
        f"--desired={LIST_DIR}/{CONFIG_KEY}",
        f"--dir={FILES_DIR}",
        f"--engine=http://127.0.0.1:{engine_port(spec)}",
        f"--port={port}",
        f"--plugins={PLUGINS_DIR}",
    ]
    return {
        "name": SIDECAR,
        "image": owner.fetcher_image,
        "restartPolicy": "Always",
        "command": command,
        "ports": [{"name": SIDECAR, "containerPort": port, "protocol": "TCP"}],
        "env": sidecar_env(owner, user_env),
        "volumeMounts": [
            {"name": LIST_VOLUME, "mountPath": LIST_DIR, "readOnly": True},
            {"name": FILES_VOLUME, "mountPath": FILES_DIR},
            {"name": PLUGINS_VOLUME, "mountPath": PLUGINS_DIR},
            {"name": PRIVATE_VOLUME, "mountPath": PRIVATE_DIR},
        ],
        # requests == limits: a pod is Guaranteed only when every container, sidecars included, is.
        "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"cpu": "250m", "memory": "1Gi"}},
        "securityContext": security_context,
        # vLLM starts once this passes: the guard is in place by then.
        "startupProbe": _probe("/health/live", 1, 30),
        # The pod's readiness is the sidecar's too: one slow answer (a busy node, a client
        # holding its port) must not take a serving vLLM pod out of its Service.
        "readinessProbe": _probe("/ready", 2, 3),
    }
