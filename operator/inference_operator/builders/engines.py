"""Each engine's part of the pod: its serving container, the containers that run beside it, how
long it may take to stop, and how a multi-node group's members differ. The rest of the pod
(model storage, GPUs, security, adapters, labels) is every engine's (deployment.py); everything
else about an engine is its object in inference_operator.engines, which the pod part is found by
(`pod_of`: the serving container the engine names).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..engines.base import ServingEngine
from ..jsontypes import JsonObject
from ..models import ENGINES
from . import model_server, vllm
from .common import Owner
from .storage import MODEL_DIR

# (owner, env, resources, volume mounts) → the serving container: every engine gets the same
# GPU env, resources and model mount, and adds its own.
ContainerBuilder = Callable[[Owner, list[JsonObject], JsonObject, list[JsonObject]], JsonObject]
# (owner, the containers' security context) → init containers that run beside it (sidecars).
SidecarsBuilder = Callable[[Owner, JsonObject], list[JsonObject]]


def _no_sidecars(owner: Owner, security: JsonObject) -> list[JsonObject]:
    del owner, security
    return []


@dataclass(frozen=True)
class GroupMembers:
    """How the members of a multi-node group other than its leader run: their command, the
    arguments they add, the sidecars only the leader keeps (the workers serve nothing)."""

    worker_command: tuple[str, ...]
    worker_args: tuple[str, ...] = ()
    leader_only_sidecars: tuple[str, ...] = ()


@dataclass(frozen=True)
class EnginePod:
    # The serving container's name: the engine object names its pod by it.
    container_name: str
    container: ContainerBuilder
    termination_grace_seconds: int
    sidecars: SidecarsBuilder = _no_sidecars
    group: GroupMembers | None = None


def _vllm(owner: Owner, env: list[JsonObject], resources: JsonObject, mounts: list[JsonObject]) -> JsonObject:
    return vllm.vllm_container(owner, MODEL_DIR, env, resources, mounts)


def _vllm_front(owner: Owner, security: JsonObject) -> list[JsonObject]:
    return [vllm.front_container(owner, security)]


PODS: dict[str, EnginePod] = {
    pod.container_name: pod
    for pod in (
        EnginePod(model_server.CONTAINER, model_server.model_server_container, model_server.TERMINATION_GRACE_SECONDS),
        EnginePod(
            vllm.CONTAINER,
            _vllm,
            vllm.VLLM_TERMINATION_GRACE_SECONDS,
            sidecars=_vllm_front,
            group=GroupMembers(tuple(vllm.WORKER_COMMAND), ("--headless",), (vllm.FRONT,)),
        ),
    )
}


def engine_of(owner: Owner) -> ServingEngine:
    return ENGINES[owner.spec.runtime.engine]


def pod_of(owner: Owner) -> EnginePod:
    return PODS[engine_of(owner).container]


def metrics_port(owner: Owner) -> int:
    """The container port Prometheus scrapes (an engine may serve /metrics on its API port)."""
    runtime = owner.spec.runtime
    return runtime.port if engine_of(owner).traits.metrics_on_api_port else runtime.metrics_port
