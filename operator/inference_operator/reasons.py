"""Every reason the operator writes on a condition or an event, in one enum.

A StrEnum, so the word on the wire is the value and a reason read back from the cluster
compares equal to its member. Reasons are CamelCase, as the API conventions ask (a
metav1.Condition's reason must match `[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?`). Which condition
or event carries each is said beside it; what one object change was is `reconcile.Action`.
"""

from __future__ import annotations

import enum


@enum.unique  # one word, one member: no reason is defined twice
class Reason(enum.StrEnum):
    # Ready.
    MINIMUM_REPLICAS_AVAILABLE = "MinimumReplicasAvailable"
    REPLICAS_NOT_READY = "ReplicasNotReady"
    SCALED_TO_ZERO = "ScaledToZero"
    # A request waited at zero: one replica, written at once (scale_to_zero.py).
    WOKEN = "Woken"
    # Progressing: a rollout under way, done, blocked by a problem below, or failing as the
    # Deployment says.
    ROLLOUT_IN_PROGRESS = "RolloutInProgress"
    ROLLOUT_COMPLETE = "RolloutComplete"
    BLOCKED = "Blocked"
    REPLICA_FAILURE = "ReplicaFailure"
    PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
    # Degraded (and Ready while nothing was created), each also a Warning event.
    AS_EXPECTED = "AsExpected"
    INVALID_SPEC = "InvalidSpec"
    POLICY_VIOLATION = "PolicyViolation"
    RESOURCE_CONFLICT = "ResourceConflict"
    APPLY_FAILED = "ApplyFailed"
    API_UNAVAILABLE = "ApiUnavailable"
    API_ERROR = "ApiError"
    ROLLED_BACK = "RolledBack"
    # Degraded: a credential the operator's rules refuse (credentials.py).
    PROMETHEUS_CREDENTIALS_DISABLED = "PrometheusCredentialsDisabled"
    PROMETHEUS_SECRET_NOT_LABELLED = "PrometheusSecretNotLabelled"
    PROMETHEUS_CREDENTIALS_OVER_HTTP = "PrometheusCredentialsOverHttp"
    PROMETHEUS_URL_NOT_ALLOWED = "PrometheusUrlNotAllowed"
    PROMETHEUS_SECRET_NOT_FOUND = "PrometheusSecretNotFound"
    HUB_TOKENS_DISABLED = "HubTokensDisabled"
    HUB_ENDPOINT_NOT_ALLOWED = "HubEndpointNotAllowed"
    MODEL_SECRET_NOT_LABELLED = "ModelSecretNotLabelled"
    MODEL_SECRET_NOT_FOUND = "ModelSecretNotFound"
    # Ready and Degraded: what is wrong with the service's pods (status_pods.py).
    MODEL_FETCH_FAILED = "ModelFetchFailed"
    MODEL_LOAD_FAILED = "ModelLoadFailed"
    CRASH_LOOP_BACK_OFF = "CrashLoopBackOff"
    IMAGE_PULL_BACK_OFF = "ImagePullBackOff"
    OOM_KILLED = "OOMKilled"
    UNSCHEDULABLE = "Unschedulable"
    CREATE_CONTAINER_CONFIG_ERROR = "CreateContainerConfigError"
    # Replicas on a node whose kubelet stopped reporting (or reports it not ready).
    NODE_NOT_READY = "NodeNotReady"
    # ScalingActive (the autoscaler's), or a credential refusal above.
    METRIC_AVAILABLE = "MetricAvailable"
    METRIC_UNAVAILABLE = "MetricUnavailable"
    # AdaptersReady.
    ADAPTER_FAILED = "AdapterFailed"
    NO_REPLICAS = "NoReplicas"
    LOADING = "Loading"
    LOADED = "Loaded"
    # Events: the service became ready; a canary's steps; the autoscaler's writes.
    READY = "Ready"
    CANARY_STARTED = "CanaryStarted"
    CANARY_STEP = "CanaryStep"
    CANARY_PROMOTED = "CanaryPromoted"
    CANARY_ROLLED_BACK = "CanaryRolledBack"
    SCALED_UP = "ScaledUp"
    SCALED_DOWN = "ScaledDown"
    REPLICAS_BOUNDED = "ReplicasBounded"
