"""Every kind of object the operator reads or writes, in one table.

Paths (plural names), the set of owned kinds and the order they are applied in, which kinds
come from an optional add-on, how reconcile treats each (replace, credentials, replicas) and
the chart's RBAC rules are all derived from this table, so a new kind is added here once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from .models import API_VERSION, KIND, PLURAL

ManifestT = TypeVar("ManifestT", bound=Mapping[str, Any])


@dataclass(frozen=True)
class Kind:
    api_version: str
    kind: str
    plural: str
    # Owned kinds are created, applied and deleted by reconcile, one object per InferenceService,
    # named after it; the rest are only read.
    owned: bool = False
    # The add-on that serves this API when it is not built into Kubernetes; a cluster without
    # it answers 404, which is a condition to report, not an error to retry.
    addon: str | None = None
    # What the spec can do instead of installing the add-on.
    otherwise: str = "choose another mode"
    # The API server refuses any change to its spec: a changed one is deleted and created anew.
    replaced_on_change: bool = False
    # Its objects hand a Prometheus credential to another program (KEDA reads the Secret and
    # sends it): none is emitted while the operator's credential policy refuses that.
    sends_credentials: bool = False
    # An autoscaler may own the replica count: a desired object without one gets the live count
    # back, or server-side apply would remove the field and the count fall to 1.
    keeps_live_replicas: bool = False
    # Read by label selector (a list), never one by name.
    listed: bool = False
    # Reconcile applies and prunes it, and its events (a hand edit, a deletion) are repaired;
    # False: another path of the operator keeps it (scale_to_zero.py's activator slices).
    reconciled: bool = True

    @property
    def key(self) -> tuple[str, str]:
        return self.api_version, self.kind

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    def header(self) -> dict[str, str]:
        """The apiVersion and kind an object of this kind opens with (or a reference to one)."""
        return {"apiVersion": self.api_version, "kind": self.kind}


# Every builder and edge names a kind by one of these; no apiVersion is written anywhere else
# (tests/reconcile/test_kinds_table.py).
# resources.gpu.allocation: dra; before the Deployment whose pods reference it. Served by
# Kubernetes 1.34+ (older clusters serve DRA only as beta, if at all).
RESOURCE_CLAIM_TEMPLATE = Kind(
    "resource.k8s.io/v1",
    "ResourceClaimTemplate",
    "resourceclaimtemplates",
    owned=True,
    addon="Dynamic Resource Allocation (resource.k8s.io/v1, Kubernetes 1.34+)",
    replaced_on_change=True,
)
# spec.adapters: the list the pods' adapters sidecars load; before the pods that mount it.
CONFIG_MAP = Kind("v1", "ConfigMap", "configmaps", owned=True)
# routing.inferencePool: the endpoint picker's identity and rights (NAME-epp), before its
# pods; a RoleBinding's roleRef is immutable.
SERVICE_ACCOUNT = Kind("v1", "ServiceAccount", "serviceaccounts", owned=True)
ROLE_BINDING = Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings", owned=True, replaced_on_change=True)
# Who may reach the pods (the operator's setting networkPolicy.enabled); before them.
NETWORK_POLICY = Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies", owned=True)
DEPLOYMENT = Kind("apps/v1", "Deployment", "deployments", owned=True, keeps_live_replicas=True)
# resources.gpu.nodes > 1: the replicas as groups of pods, instead of the Deployment.
LEADER_WORKER_SET = Kind(
    "leaderworkerset.x-k8s.io/v1",
    "LeaderWorkerSet",
    "leaderworkersets",
    owned=True,
    addon="LeaderWorkerSet (lws.sigs.k8s.io)",
    otherwise="set resources.gpu.nodes: 1",
    keeps_live_replicas=True,
)
SERVICE = Kind("v1", "Service", "services", owned=True)
# autoscaling.scaleToZero: NAME-activator sends NAME's traffic to the activator while no replica
# is ready (scale_to_zero.py keeps it; kube-proxy routes every slice labelled for the Service).
ENDPOINT_SLICE = Kind("discovery.k8s.io/v1", "EndpointSlice", "endpointslices", owned=True, reconciled=False)
POD_DISRUPTION_BUDGET = Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets", owned=True)
HORIZONTAL_POD_AUTOSCALER = Kind("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers", owned=True)
TRIGGER_AUTHENTICATION = Kind(
    "keda.sh/v1alpha1",
    "TriggerAuthentication",
    "triggerauthentications",
    owned=True,
    addon="KEDA",
    sends_credentials=True,
)
SCALED_OBJECT = Kind(
    "keda.sh/v1alpha1", "ScaledObject", "scaledobjects", owned=True, addon="KEDA", sends_credentials=True
)
INFERENCE_POOL = Kind(
    "inference.networking.k8s.io/v1",
    "InferencePool",
    "inferencepools",
    owned=True,
    addon="the Gateway API Inference Extension CRDs",
    otherwise="set routing.inferencePool: false",
)
# routing.httpRoute; after the Service or InferencePool it routes to.
HTTP_ROUTE = Kind(
    "gateway.networking.k8s.io/v1",
    "HTTPRoute",
    "httproutes",
    owned=True,
    addon="the Gateway API CRDs (gateway.networking.k8s.io/v1)",
    otherwise="remove routing.httpRoute",
)
SECRET = Kind("v1", "Secret", "secrets")
# Read for status.adapters: which replicas to ask how their adapters stand.
POD = Kind("v1", "Pod", "pods", listed=True)
# Cluster-scoped, read by name: the node of a pod its controller marked not ready (status_pods.py).
NODE = Kind("v1", "Node", "nodes")
INFERENCE_SERVICE = Kind(API_VERSION, KIND, PLURAL)

# Owned kinds in the order they are applied (a TriggerAuthentication before the ScaledObject
# that names it).
KINDS: tuple[Kind, ...] = (
    RESOURCE_CLAIM_TEMPLATE,
    CONFIG_MAP,
    SERVICE_ACCOUNT,
    ROLE_BINDING,
    NETWORK_POLICY,
    DEPLOYMENT,
    LEADER_WORKER_SET,
    SERVICE,
    ENDPOINT_SLICE,
    POD_DISRUPTION_BUDGET,
    HORIZONTAL_POD_AUTOSCALER,
    TRIGGER_AUTHENTICATION,
    SCALED_OBJECT,
    INFERENCE_POOL,
    HTTP_ROUTE,
    SECRET,
    POD,
    NODE,
    INFERENCE_SERVICE,
)

# Documents the operator writes that no cluster of its serves, so outside KINDS (no RBAC rule,
# no watch): the CRD (`crd.py`, installed by the chart) and the endpoint picker's configuration
# (passed on its command line).
CUSTOM_RESOURCE_DEFINITION = Kind("apiextensions.k8s.io/v1", "CustomResourceDefinition", "customresourcedefinitions")
ENDPOINT_PICKER_CONFIG = Kind("inference.networking.x-k8s.io/v1alpha1", "EndpointPickerConfig", "")


BY_KEY: dict[tuple[str, str], Kind] = {k.key: k for k in KINDS}
# What runs the pods, whose rollout status is the service's: a Deployment, or groups of pods.
WORKLOAD_KINDS = (DEPLOYMENT.kind, LEADER_WORKER_SET.kind)
APPLY_ORDER: dict[tuple[str, str], int] = {k.key: position for position, k in enumerate(KINDS)}
OWNED_KINDS: list[tuple[str, str]] = [k.key for k in KINDS if k.owned]
# An owned kind by its name alone, as status.inventory records it ("Deployment/llama").
OWNED_BY_NAME: dict[str, Kind] = {k.kind: k for k in KINDS if k.owned}
PLURALS: dict[tuple[str, str], str] = {k.key: k.plural for k in KINDS}


def kind_of(api_version: str, kind: str) -> Kind:
    return BY_KEY[api_version, kind]


def kind_of_object(obj: Mapping[str, Any]) -> Kind:
    return BY_KEY[obj["apiVersion"], obj["kind"]]


def in_apply_order(objects: Iterable[ManifestT]) -> list[ManifestT]:
    """`objects` sorted as the table lists their kinds (stable within a kind)."""
    return sorted(objects, key=lambda obj: APPLY_ORDER[obj["apiVersion"], obj["kind"]])


def unavailable_message(kind: Kind) -> str:
    """What a user reads when an add-on's API is missing."""
    return (
        f"{kind.kind} ({kind.plural}.{kind.group}/{kind.version}) is not served by this "
        f"cluster: install {kind.addon} or {kind.otherwise} (checked again every minute)"
    )
