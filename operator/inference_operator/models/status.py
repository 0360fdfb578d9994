"""`status` of an InferenceService, as a schema: status.py (the operator's) writes it as plain
mappings, and the CRD's status schema is generated from these models."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

Int64 = Annotated[int, Field(json_schema_extra={"format": "int64"})]


class StatusModel(BaseModel):
    """Base for status models: what the operator writes, camelCase on the wire."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class Condition(StatusModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str | None = None
    message: str | None = None
    last_transition_time: datetime | None = None
    observed_generation: Int64 | None = None


class AutoscalerStatus(StatusModel):
    metric: str | None = None
    current_value: float | None = None
    latency_p95_ms: float | None = None
    desired_replicas: int | None = None
    last_scale_time: datetime | None = None
    reason: str | None = None


class CanaryCheck(StatusModel):
    """The last analysis of the canary's pods."""

    time: datetime | None = None
    latency_ms: float | None = None
    error_ratio: float | None = None
    requests: float | None = None
    verdict: str | None = None


class RolloutStatus(StatusModel):
    phase: str | None = Field(None, description="Stable, Progressing, Promoted or RolledBack.")
    stage: str | None = Field(None, description="What kubectl shows: canary 10%, promoted, rolled back.")
    revision: str | None = Field(None, description="Pod template hash of the candidate.")
    stable_revision: str | None = None
    step: int | None = None
    weight: int | None = Field(None, description="Percent of the traffic the step gives the candidate.")
    step_started: datetime | None = None
    failures: int | None = None
    message: str | None = None
    stable_digest: str | None = Field(None, description="Digest of the manifest the stable Deployment was given.")
    traffic: str | None = Field(
        None,
        description="How the canary's share is set: httpRoute (route weights, exact) or replicas (by its "
        "share of the pods behind the one Service, approximate).",
    )
    last_check: CanaryCheck | None = None


class AdapterPodStatus(StatusModel):
    pod: str
    state: str = Field(description="Pending, Loading, Ready or Failed on this replica.")
    reason: str | None = None


class AdapterStatus(StatusModel):
    name: str
    state: str = Field(description="Ready on every replica, Loading, or Failed on one (see pods).")
    ready_replicas: int | None = None
    replicas: int | None = Field(None, description="Running replicas asked.")
    pods: list[AdapterPodStatus] | None = Field(None, description="Per replica (the first 16).")


class RoleStatus(StatusModel):
    """One workload of a service of several (prefill, decode, router): which one is short."""

    role: str = Field(description="The workload's role (its inference.rocm.dev/role label).")
    replicas: int | None = None
    ready_replicas: int | None = None
    updated_replicas: int | None = None
    ready: bool | None = Field(None, description="Every replica this role asks for is ready.")
    message: str | None = Field(None, description="Its rollout, as kubectl rollout status says it.")


class InferenceServiceStatus(StatusModel):
    """`status` of an InferenceService (schema only: status.py writes it as plain mappings)."""

    observed_generation: Int64 | None = None
    replicas: int | None = None
    ready_replicas: int | None = None
    updated_replicas: int | None = None
    selector: str | None = Field(None, description="Label selector of the pods, for the scale subresource.")
    url: str | None = None
    conditions: list[Condition] | None = Field(
        None, json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}
    )
    autoscaler: AutoscalerStatus | None = None
    rollout: RolloutStatus | None = None
    adapters: list[AdapterStatus] | None = Field(
        None, json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}
    )
    inventory: list[str] | None = Field(
        None,
        description="The objects the service owns (Kind/name), as its last reconcile of observedGeneration left them.",
    )
    roles: list[RoleStatus] | None = Field(
        None,
        description="A service of several workloads: each role's replicas (absent for one workload).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["role"]},
    )
