"""Each engine's part of the pod, one entry per engine: its serving container, the containers
that run beside it, and how long it may take to stop. The rest of the pod (model storage, GPUs,
security, adapters, labels) is every engine's (deployment.py); what the spec may ask of an engine
is in models/engines.py, the names of its series in prometheus/promql.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..jsontypes import JsonObject
from ..models import ENGINES, Engine
from .common import Owner
from .model_server import TERMINATION_GRACE_SECONDS, model_server_container
from .storage import MODEL_DIR
from .vllm import VLLM_TERMINATION_GRACE_SECONDS, front_container, vllm_container

# (owner, env, resources, volume mounts) → the serving container: every engine gets the same
# GPU env, resources and model mount, and adds its own.
ContainerBuilder = Callable[[Owner, list[JsonObject], JsonObject, list[JsonObject]], JsonObject]
# (owner, the containers' security context) → init containers that run beside it (sidecars).
SidecarsBuilder = Callable[[Owner, JsonObject], list[JsonObject]]


def _no_sidecars(owner: Owner, security: JsonObject) -> list[JsonObject]:
    del owner, security
    return []


@dataclass(frozen=True)
class EnginePod:
    container: ContainerBuilder
    termination_grace_seconds: int
    sidecars: SidecarsBuilder = _no_sidecars


def _vllm(owner: Owner, env: list[JsonObject], resources: JsonObject, mounts: list[JsonObject]) -> JsonObject:
    return vllm_container(owner, MODEL_DIR, env, resources, mounts)


def _vllm_front(owner: Owner, security: JsonObject) -> list[JsonObject]:
    return [front_container(owner, security)]


PODS: dict[Engine, EnginePod] = {
    Engine.MODEL_SERVER: EnginePod(model_server_container, TERMINATION_GRACE_SECONDS),
    Engine.VLLM: EnginePod(_vllm, VLLM_TERMINATION_GRACE_SECONDS, sidecars=_vllm_front),
}


def metrics_port(owner: Owner) -> int:
    """The container port Prometheus scrapes (vLLM serves /metrics on its API port)."""
    runtime = owner.spec.runtime
    return runtime.port if ENGINES[runtime.engine].metrics_on_api_port else runtime.metrics_port
