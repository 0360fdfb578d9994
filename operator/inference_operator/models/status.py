"""`status` of an InferenceService, as a schema: status.py (the operator's) writes it as plain
mappings, and the CRD's status schema is generated from these models."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

Int64 = Annotated[int, Field(json_schema_extra={"format": "int64"})]
# status.inventory: at most this many `Kind/name` entries, each a kind and a DNS subdomain name.
INVENTORY_ITEMS = 128
INVENTORY_ENTRY_LENGTH = 320


class StatusModel(BaseModel):
    """Base for status models: what the operator writes, camelCase on the wire."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class Condition(StatusModel):
    """One aspect of the service's state, in Kubernetes' condition form."""

    type: str = Field(
        description="Ready (replicas serve), Progressing (a rollout of the pods is under way), Degraded (something "
        "needs attention: reason says what), ScalingActive (the autoscaler has data and acts on it) or "
        "AdaptersReady (every LoRA adapter is loaded on every replica)."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="Whether the condition holds.")
    reason: str | None = Field(
        None,
        description="Why, as one CamelCase word a tool can match: MinimumReplicasAvailable, ReplicasNotReady, "
        "ScaledToZero, ModelFetchFailed, ModelLoadFailed, CrashLoopBackOff, OOMKilled, Unschedulable, InvalidSpec, "
        "PolicyViolation, ...",
    )
    message: str | None = Field(None, description="Why, for a person: what happened and what to change.")
    last_transition_time: datetime | None = Field(None, description="When status last changed.")
    observed_generation: Int64 | None = Field(
        None, description="The metadata.generation of the spec the condition was computed from."
    )


class RoleAutoscalerStatus(StatusModel):
    """What the autoscaler last observed and decided (mode builtin), for the service or one role."""

    metric: str | None = Field(None, description="The metric it scales on (spec.autoscaling.metric).")
    current_value: float | None = Field(
        None, description="The metric's last reading per replica, in its unit (what spec.autoscaling.target is)."
    )
    latency_p95_ms: float | None = Field(
        None, description="The service's p95 request latency in milliseconds at the last reading."
    )
    desired_replicas: int | None = Field(None, description="Replicas its last decision asked for.")
    last_scale_time: datetime | None = Field(None, description="When it last changed spec.replicas.")
    reason: str | None = Field(None, description="Why it decided as it did, e.g. within 10% of target.")


class AutoscalerStatus(RoleAutoscalerStatus):
    """What the autoscaler last observed and decided (mode builtin); with spec.disaggregation, each
    role's under its name, and the pair's scale to zero in reason and lastScaleTime."""

    prefill: RoleAutoscalerStatus | None = Field(None, description="The prefill role's (spec.disaggregation).")
    decode: RoleAutoscalerStatus | None = Field(None, description="The decode role's (spec.disaggregation).")


class CanaryCheck(StatusModel):
    """The last analysis of the canary's pods."""

    time: datetime | None = Field(None, description="When the check ran.")
    latency_ms: float | None = Field(
        None, description="The canary's latency (rollout.canary.analysis.metric) in milliseconds."
    )
    error_ratio: float | None = Field(None, description="Share of the canary's requests answered with a 5xx.")
    requests: float | None = Field(None, description="Requests the canary served in the window.")
    verdict: str | None = Field(
        None, description="pass, fail, or inconclusive (too few requests, no or stale data: the step waits)."
    )


class RolloutStatus(StatusModel):
    """Where a rollout of the pods stands: the candidate revision, its step and its last check."""

    phase: str | None = Field(None, description="Stable, Progressing, Promoted or RolledBack.")
    stage: str | None = Field(None, description="What kubectl shows: canary 10%, promoted, rolled back.")
    revision: str | None = Field(None, description="Pod template hash of the candidate.")
    stable_revision: str | None = Field(None, description="Pod template hash of the stable pods.")
    step: int | None = Field(None, description="Index of the canary's current step in rollout.canary.steps, from 0.")
    weight: int | None = Field(None, description="Percent of the traffic the step gives the candidate.")
    step_started: datetime | None = Field(None, description="When the current step began.")
    failures: int | None = Field(
        None, description="Failed checks in a row; at rollout.canary.analysis.failureLimit the canary is rolled back."
    )
    message: str | None = Field(None, description="The rollout's last news, for a person.")
    stable_digest: str | None = Field(None, description="Digest of the manifest the stable Deployment was given.")
    traffic: str | None = Field(
        None,
        description="How the canary's share is set: httpRoute (route weights, exact) or replicas (by its "
        "share of the pods behind the one Service, approximate).",
    )
    last_check: CanaryCheck | None = None


class AdapterPodStatus(StatusModel):
    """One replica's view of an adapter."""

    pod: str = Field(description="Name of the replica's pod.")
    state: str = Field(description="Pending, Loading, Ready or Failed on this replica.")
    reason: str | None = Field(None, description="Why it failed on this replica.")


class AdapterStatus(StatusModel):
    """How one LoRA adapter of spec.adapters stands across the replicas."""

    name: str = Field(description="The adapter's name (spec.adapters[].name).")
    state: str = Field(description="Ready on every replica, Loading, or Failed on one (see pods).")
    ready_replicas: int | None = Field(None, description="Replicas that have the adapter loaded.")
    replicas: int | None = Field(None, description="Running replicas asked.")
    pods: list[AdapterPodStatus] | None = Field(None, description="Per replica (the first 16).")


class RoleStatus(StatusModel):
    """One workload of a service of several (prefill, decode, router): which one is short."""

    role: str = Field(description="The workload's role (its inference.rocm.dev/role label).")
    replicas: int | None = Field(None, description="The pods of this role's workload, as its own status counts them.")
    ready_replicas: int | None = Field(None, description="Of those, the pods that are Ready.")
    updated_replicas: int | None = Field(None, description="Of those, the pods of the workload's current revision.")
    ready: bool | None = Field(None, description="Every replica this role asks for is ready.")
    message: str | None = Field(None, description="Its rollout, as kubectl rollout status says it.")


class InferenceServiceStatus(StatusModel):
    """The observed state of an InferenceService, written by the operator: its replicas, its
    address, its conditions, and what the autoscaler, a rollout and the adapters report."""

    # Schema only: the operator's status.py writes it as plain mappings.
    observed_generation: Int64 | None = Field(
        None, description="The metadata.generation of the spec the operator last reconciled."
    )
    replicas: int | None = Field(None, description="Replicas of the model server, as its workload reports them.")
    ready_replicas: int | None = Field(None, description="Replicas that are Ready to serve.")
    updated_replicas: int | None = Field(None, description="Replicas that run the current spec.")
    selector: str | None = Field(None, description="Label selector of the pods, for the scale subresource.")
    url: str | None = Field(
        None, description="In-cluster URL of the inference API: the Service, http://NAME.NAMESPACE.svc.cluster.local."
    )
    conditions: list[Condition] | None = Field(
        None,
        description="Ready, Progressing and Degraded; ScalingActive with autoscaling, AdaptersReady with adapters.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    autoscaler: AutoscalerStatus | None = None
    rollout: RolloutStatus | None = None
    adapters: list[AdapterStatus] | None = Field(
        None,
        description="Each LoRA adapter of spec.adapters and how it stands on the replicas.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    # Bounded: a reconcile reads each entry it no longer wants (reconcile.prune_recorded), so an
    # edited status must not turn one spec change into thousands of reads. A service's desired set
    # is a few dozen objects at most.
    inventory: list[Annotated[str, Field(max_length=INVENTORY_ENTRY_LENGTH)]] | None = Field(
        None,
        max_length=INVENTORY_ITEMS,
        description="The objects the service owns (Kind/name), as its last reconcile of observedGeneration left them.",
    )
    roles: list[RoleStatus] | None = Field(
        None,
        description="A service of several workloads: each role's replicas (absent for one workload).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["role"]},
    )
