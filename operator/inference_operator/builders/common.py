"""What every owned object shares: identity of its owner, names, labels, ownerReferences."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..engines.base import ServingEngine
from ..jsontypes import JsonObject
from ..kinds import DEPLOYMENT, INFERENCE_SERVICE, LEADER_WORKER_SET
from ..models import ENGINES, InferenceServiceSpec, check_name
from ..settings import MANAGER, FetchSettings, GpuDefaults, Images, NetworkPolicySettings

COMPONENT = "predictor"
SPEC_HASH_ANNOTATION = "inference.rocm.dev/spec-hash"
OWNER_LABEL = "inference.rocm.dev/inference-service"
ROLE_LABEL = "inference.rocm.dev/role"
INSTANCE_LABEL = "app.kubernetes.io/instance"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"


class Role(enum.StrEnum):
    """What part of an InferenceService an owned object belongs to: its `inference.rocm.dev/role`
    label, on the object's own metadata (`kubectl get deploy,svc -l inference.rocm.dev/role=canary`).

    The label names the object, not its pods: `app.kubernetes.io/component` stays what the pods
    are (`predictor`, `endpoint-picker`), since it is in the immutable selectors of Deployments
    and in the Service's, and the stable and canary arms' pods must both match it.
    """

    # The model's pods and what serves, scales and guards them: the workload (Deployment or
    # LeaderWorkerSet), NAME's Service, PDB, HPA or KEDA objects, NetworkPolicy, the adapters'
    # ConfigMap, the claim template, the InferencePool, the HTTPRoute.
    PREDICTOR = "predictor"
    # What a canary rollout adds while it runs: NAME-canary's Deployment, the arms' Services.
    CANARY = "canary"
    # Scale to zero's way in and out of the activator: NAME-private, NAME-activator's slice.
    ACTIVATOR = "activator"
    # The InferencePool's endpoint picker the operator runs (NAME-epp and its rights).
    ENDPOINT_PICKER = "endpoint-picker"
    # A service of several workloads (prefill/decode disaggregation behind a router).
    PREFILL = "prefill"
    DECODE = "decode"
    ROUTER = "router"


# The roles whose workloads the service's status counts: every one must be ready for it to be
# Ready. A canary is judged by its analysis (the status is the stable arm's), the picker by the
# gateway that asks it.
STATUS_ROLES = frozenset({Role.PREDICTOR, Role.PREFILL, Role.DECODE, Role.ROUTER})


def role_of(obj: JsonObject, owner_name: str) -> Role | None:
    """An owned object's role: its label, or, for an object an older version made without one,
    what its name and component said then (None: not one an older version made). The next
    reconcile labels what it still wants."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if (role := labels.get(ROLE_LABEL)) in ROLES:
        return Role(role)
    component = labels.get("app.kubernetes.io/component")
    if component == "endpoint-picker":
        return Role.ENDPOINT_PICKER
    if component != COMPONENT:
        return None
    return LEGACY_NAMES.get(str((obj.get("metadata") or {}).get("name")).removeprefix(owner_name))


ROLES = frozenset(str(role) for role in Role)
# What an older version named its objects of each role, after NAME (builders/canary.py, activator.py).
LEGACY_NAMES = {
    "": Role.PREDICTOR,
    "-canary": Role.CANARY,
    "-stable": Role.CANARY,
    "-private": Role.ACTIVATOR,
    "-activator": Role.ACTIVATOR,
}

# routing.router: the router's objects are NAME-router (builders/router.py).
ROUTER_SUFFIX = "-router"


def router_pod_labels(owner_name: str) -> dict[str, str]:
    """The router's pod labels (builders/router.py), apart from the model pods' (its own
    selector must not find it); here for the policies that let it in (disaggregation.py)."""
    return {
        "app.kubernetes.io/name": "vllm-router",
        "app.kubernetes.io/instance": owner_name,
        "app.kubernetes.io/component": "router",
    }


@dataclass(frozen=True)
class Owner:
    """The InferenceService an object belongs to: enough to name, label and own it.

    `images`, `gpu_defaults` and `fetch` are the operator's settings (`config.OperatorConfig`,
    whose `owner()` makes Owners), so the builders stay pure functions of the Owner. Left out,
    they are the built-in defaults.
    """

    name: str
    namespace: str
    uid: str
    spec: InferenceServiceSpec
    images: Images = field(default_factory=Images)
    # What the spec leaves unset about GPUs: the operator's settings (chart values gpu.*).
    gpu_defaults: GpuDefaults = field(default_factory=GpuDefaults)
    # How model-fetch init containers reach model sources (chart values modelFetch.*).
    fetch: FetchSettings = field(default_factory=FetchSettings)
    # Whether it gets a NetworkPolicy and whom that lets in (chart values networkPolicy.*).
    network: NetworkPolicySettings = field(default_factory=NetworkPolicySettings)

    def __post_init__(self) -> None:
        check_name(self.name)  # every object is named after it: refuse a name a Service cannot take

    @property
    def model_name(self) -> str:
        return self.spec.model.name or self.name

    @property
    def image(self) -> str:
        """The serving container's image: the spec's, else the engine's default."""
        runtime = self.spec.runtime
        if runtime.image:
            return runtime.image
        return self.images.serving(runtime.engine)

    @property
    def fetcher_image(self) -> str:
        """The image of the model-fetch init container: always the operator's model-server
        image, never the spec's. That container may hold a credential the operator wires in (a
        Hub token); an image of the InferenceService author's choosing would simply read it."""
        return self.images.fetcher


def engine_of(owner: Owner) -> ServingEngine:
    """The engine that serves the owner's model: everything that differs between engines, its
    part of the pod included, is asked of it."""
    return ENGINES[owner.spec.runtime.engine]


def metrics_port(owner: Owner) -> int:
    """The container port Prometheus scrapes (an engine may serve /metrics on its API port)."""
    runtime = owner.spec.runtime
    return runtime.port if engine_of(owner).traits.metrics_on_api_port else runtime.metrics_port


def selector_labels(owner: Owner) -> dict[str, str]:
    """Labels that select this service's pods; immutable once a Deployment exists."""
    return {
        "app.kubernetes.io/name": "model-server",
        "app.kubernetes.io/instance": owner.name,
        "app.kubernetes.io/component": COMPONENT,
    }


# LeaderWorkerSet (resources.gpu.nodes > 1): each group's pods carry their index; 0 is the leader.
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"


def multi_node(spec: InferenceServiceSpec) -> bool:
    """A replica spans nodes: a LeaderWorkerSet group instead of a Deployment's pod."""
    return spec.resources.gpu.nodes > 1


#: A multi-node group's bootstrap port (vLLM's --master-port, on the leader).
MASTER_PORT = 29501


def engine_port(spec: InferenceServiceSpec) -> int:
    """The engine's port on loopback, behind a front (the vLLM engine's): the first
    above `runtime.port` that no other port of the pod takes (`runtime.metricsPort`, the
    adapters sidecar's; MASTER_PORT)."""
    taken = {spec.runtime.port, spec.runtime.metrics_port, MASTER_PORT}
    port = spec.runtime.port + 1
    while port in taken or port > 65535:
        port = 1024 if port >= 65535 else port + 1
    return port


def serving_labels(owner: Owner) -> dict[str, str]:
    """The pods that serve requests: all of the service's, or only the leader of each group
    (a multi-node replica's workers run no API server)."""
    labels = selector_labels(owner)
    return {**labels, LWS_WORKER_INDEX_LABEL: "0"} if multi_node(owner.spec) else labels


def workload_ref(owner: Owner) -> JsonObject:
    """What an HPA or KEDA scales: the Deployment, or the LeaderWorkerSet by groups."""
    if multi_node(owner.spec):
        return {**LEADER_WORKER_SET.header(), "name": owner.name}
    return {**DEPLOYMENT.header(), "name": owner.name}


def standard_labels(owner: Owner) -> dict[str, str]:
    """The labels of the predictor's pods and, with a role, of every owned object."""
    return {
        **selector_labels(owner),
        MANAGED_BY_LABEL: MANAGER,
        "app.kubernetes.io/part-of": "rocm-inference",
        OWNER_LABEL: owner.name,
    }


def inventory_selector(owner_name: str) -> str:
    """Every object the operator made for one service, whatever its role or version (these two
    labels have been on each since the first one): what the prune lists."""
    return f"{INSTANCE_LABEL}={owner_name},{MANAGED_BY_LABEL}={MANAGER}"


def selector_string(owner: Owner) -> str:
    """The pods' selector in label-selector syntax (status.selector, for the scale subresource)."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(owner).items()))


def owner_reference(owner: Owner) -> JsonObject:
    return {
        **INFERENCE_SERVICE.header(),
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_meta(
    owner: Owner, name: str | None = None, annotations: JsonObject | None = None, role: Role = Role.PREDICTOR
) -> JsonObject:
    meta = {
        "name": name or owner.name,
        "namespace": owner.namespace,
        "labels": {**standard_labels(owner), ROLE_LABEL: str(role)},
        "ownerReferences": [owner_reference(owner)],
    }
    if annotations:
        meta["annotations"] = annotations
    return meta


def service_url(owner: Owner) -> str:
    """The service's way in: its Service, or its router's with routing.router."""
    name = owner.name + ROUTER_SUFFIX if owner.spec.routing.router is not None else owner.name
    return f"http://{name}.{owner.namespace}.svc.cluster.local"
