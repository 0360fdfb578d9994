"""routing.router → the vLLM project's router in front of the replicas, NAME-router.

The router (`vllm-router` on PyPI: a Rust server behind a Python console script; image: the
operator's `images.router`, built from the wheel by images/router/Dockerfile) takes every request
of the service and sends it to one of its vLLM pods by `policy`: `cache_aware` keeps a prefix
tree of the prompts it routed per pod, and sends a prompt to the pod that holds its longest
prefix (its KV cache has it) unless the load is too uneven. It gets a ServiceAccount, a
RoleBinding to the ClusterRole the chart ships (pods: get, list, watch; nothing else), a
Deployment, a Service, a PodDisruptionBudget with more than one replica, and a NetworkPolicy
of its own when the operator emits them.

What the router is told, and why (flags of vllm-router 0.1.17, `vllm-router --help`):

- `--service-discovery` with `--selector k=v ...` (the service's serving pods' labels),
  `--service-discovery-namespace` (the service's: with it, the router lists and watches that
  namespace's pods only, which a namespaced RoleBinding allows) and `--service-discovery-port`
  (the pods' `runtime.port`: vLLM's front, which bounds bodies and refuses adapter management;
  the router reaches vLLM through it like any client). It keeps the pods that are ready.
- `--policy`: the spec's, in the router's own spelling (POLICY_FLAGS).
- With spec.disaggregation, P/D mode instead of `--selector`: `--vllm-pd-disaggregation`,
  `--prefill-selector` and `--decode-selector` (each role's pods), `--kv-connector` (the roles'),
  from disaggregation.py.
- Bounds: `--max-payload-size` (a request body), `--max-concurrent-requests` and `--queue-size`
  (beyond both, 429 at once), `--queue-timeout-secs`, `--request-timeout-secs`.
- `--prometheus-port`/`--prometheus-host`: its own metrics on a port apart from the requests'.
- Probes: `/liveness` and `/readiness` on the HTTP port; a startup probe first (STARTUP_SECONDS).

The pod runs as a non-root user, read-only root filesystem, no capability, RuntimeDefault
seccomp, with a preStop sleep so that the endpoints drop the pod before the SIGTERM comes.

At zero (autoscaling.scaleToZero, spec.replicas 0; or disaggregation.scaleToZero, both roles'
replicas 0) the router's replicas go to zero with the workers and come back with them
(`router_replicas`). Kept up, a router pod with no worker is
not Ready (its /readiness answers 503): its Deployment would read unavailable at zero, its PDB
would allow no eviction (no pod healthy) and block node drains, and a change of the router's
spec at zero would roll out a pod that never becomes Ready (maxUnavailable 0) until a wake.
Started with the workers, its start (seconds; a 60 MB extension loaded) runs beside vLLM's
(tens of seconds to minutes: the model loaded, the engine compiled), and a router pod is
Ready only once it has discovered a worker in any case: the cold request waits for the later
of the two, which is vLLM. What the router holds at zero is nothing; the activator holds the
requests (builders/activator.py).
"""

from __future__ import annotations

from ..jsontypes import JsonObject
from ..kinds import DEPLOYMENT, NETWORK_POLICY, POD_DISRUPTION_BUDGET, ROLE_BINDING, SERVICE, SERVICE_ACCOUNT
from ..models import NAME_MAX_LENGTH, RouterPolicy, RouterSpec, SpecError
from ..settings import MANAGER, NAMESPACE_NAME_LABEL
from .common import (
    OWNER_LABEL,
    ROLE_LABEL,
    ROUTER_SUFFIX,
    Owner,
    Role,
    object_meta,
    router_pod_labels,
    serving_labels,
)
from .deployment import desired_replicas
from .disaggregation import ROLES, disaggregated, pd_discovery_args, role_spec
from .network_policy import OPERATOR_POD_LABELS
from .service import HTTP_PORT

# The ClusterRole the chart ships for every router (files/rbac/router.yaml); the operator may
# bind it (and nothing else of the kind) by this name.
CLUSTER_ROLE = "rocm-inference-router"
COMPONENT = "router"
PORT = 8000
METRICS_PORT = 29000
RUN_AS_USER = 65532
# The router's --policy values, by the spec's.
POLICY_FLAGS = {
    RouterPolicy.CACHE_AWARE: "cache_aware",
    RouterPolicy.ROUND_ROBIN: "round_robin",
    RouterPolicy.POWER_OF_TWO: "power_of_two",
    RouterPolicy.CONSISTENT_HASH: "consistent_hash",
}
# A request body: as large as the front in the pods lets through (server/vllm_front/server.py).
MAX_PAYLOAD_BYTES = 64 * 1024 * 1024
# How long a request may wait in the router's queue for a slot before it is answered 429/408.
QUEUE_TIMEOUT_SECONDS = 30
# The preStop sleep: the Service's endpoints drop the pod before the router is told to stop.
PRE_STOP_SECONDS = 5
# After the preStop sleep, time for the requests under way to finish.
DRAIN_SECONDS = 30
# How long the router may take to listen: the wheel's Python launcher loads a 60 MB extension,
# which under a small CPU limit on a busy node takes most of a minute; the liveness probe
# counts only once it has answered, so a slow start is not restarted into a crash loop.
STARTUP_PROBE_PERIOD_SECONDS = 5
STARTUP_SECONDS = 300
# What a router consists of, in apply order.
OBJECT_KINDS = (SERVICE_ACCOUNT, ROLE_BINDING, NETWORK_POLICY, DEPLOYMENT, SERVICE, POD_DISRUPTION_BUDGET)


def router_spec(owner: Owner) -> RouterSpec | None:
    return owner.spec.routing.router


def deploys_router(owner: Owner) -> bool:
    return router_spec(owner) is not None


def router_replicas(owner: Owner) -> int:
    """The router's replicas: routing.router.replicas, or none while its workers are asked for
    none (a service at zero; see the module's docstring)."""
    if disaggregated(owner):  # a pair at zero: both roles asked for none
        at_zero = all(desired_replicas(role_spec(owner.spec, role)) == 0 for role in ROLES)
    else:
        at_zero = desired_replicas(owner.spec) == 0
    return 0 if at_zero else _spec(owner).replicas


def router_name(owner: Owner) -> str:
    return owner.name + ROUTER_SUFFIX


def router_labels(owner: Owner) -> dict[str, str]:
    """The router's pod labels: apart from the model pods' (its own selector must not find it)."""
    return router_pod_labels(owner.name)


def _spec(owner: Owner) -> RouterSpec:
    spec = router_spec(owner)
    if spec is None:
        raise ValueError("a router is built only for routing.router")
    return spec


def _meta(owner: Owner) -> JsonObject:
    labels = {
        **router_labels(owner),
        "app.kubernetes.io/managed-by": MANAGER,
        "app.kubernetes.io/part-of": "rocm-inference",
        OWNER_LABEL: owner.name,
        ROLE_LABEL: str(Role.ROUTER),
    }
    return {**object_meta(owner, router_name(owner), role=Role.ROUTER), "labels": labels}


def discovery_selector(owner: Owner) -> list[str]:
    """The serving pods' labels as the router's --selector takes them (`key=value` each)."""
    return [f"{key}={value}" for key, value in sorted(serving_labels(owner).items())]


def router_args(owner: Owner) -> list[str]:
    spec = _spec(owner)
    return [
        "--host=0.0.0.0",
        f"--port={PORT}",
        f"--policy={POLICY_FLAGS[spec.policy]}",
        "--service-discovery",
        *(pd_discovery_args(owner) if disaggregated(owner) else ["--selector", *discovery_selector(owner)]),
        f"--service-discovery-namespace={owner.namespace}",
        f"--service-discovery-port={owner.spec.runtime.port}",
        "--prometheus-host=0.0.0.0",
        f"--prometheus-port={METRICS_PORT}",
        f"--max-payload-size={MAX_PAYLOAD_BYTES}",
        f"--max-concurrent-requests={spec.max_concurrent_requests}",
        f"--queue-size={spec.queue_size}",
        f"--queue-timeout-secs={QUEUE_TIMEOUT_SECONDS}",
        f"--request-timeout-secs={spec.request_timeout_seconds}",
        "--log-level=info",
    ]


def pre_stop_command() -> list[str]:
    """A sleep in the image's own Python (the wheel's launcher needs it anyway)."""
    return ["python", "-c", f"import time; time.sleep({PRE_STOP_SECONDS})"]


def build_router_service_account(owner: Owner) -> JsonObject:
    return {**SERVICE_ACCOUNT.header(), "metadata": _meta(owner)}


def build_router_role_binding(owner: Owner) -> JsonObject:
    return {
        **ROLE_BINDING.header(),
        "metadata": _meta(owner),
        "roleRef": {"apiGroup": ROLE_BINDING.group, "kind": "ClusterRole", "name": CLUSTER_ROLE},
        "subjects": [{"kind": SERVICE_ACCOUNT.kind, "name": router_name(owner), "namespace": owner.namespace}],
    }


def build_router_deployment(owner: Owner) -> JsonObject:
    spec = _spec(owner)
    resources = {"cpu": spec.resources.cpu, "memory": spec.resources.memory}
    container: JsonObject = {
        "name": "router",
        "image": owner.images.router,
        "imagePullPolicy": "IfNotPresent",
        "command": ["vllm-router"],
        "args": router_args(owner),
        "ports": [
            {"name": "http", "containerPort": PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "startupProbe": {
            "httpGet": {"path": "/liveness", "port": "http"},
            "periodSeconds": STARTUP_PROBE_PERIOD_SECONDS,
            "timeoutSeconds": 3,
            "failureThreshold": STARTUP_SECONDS // STARTUP_PROBE_PERIOD_SECONDS,
        },
        "livenessProbe": {
            "httpGet": {"path": "/liveness", "port": "http"},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "readinessProbe": {
            "httpGet": {"path": "/readiness", "port": "http"},
            "periodSeconds": 5,
            "timeoutSeconds": 3,
            "failureThreshold": 2,
        },
        "lifecycle": {"preStop": {"exec": {"command": pre_stop_command()}}},
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    pod_spec: JsonObject = {
        "serviceAccountName": router_name(owner),
        "automountServiceAccountToken": True,  # it watches the namespace's pods
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": PRE_STOP_SECONDS + DRAIN_SECONDS,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
    }
    return {
        **DEPLOYMENT.header(),
        "metadata": _meta(owner),
        "spec": {
            "replicas": router_replicas(owner),
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "revisionHistoryLimit": 5,
            "selector": {"matchLabels": router_labels(owner)},
            "template": {"metadata": {"labels": router_labels(owner)}, "spec": pod_spec},
        },
    }


def build_router_service(owner: Owner) -> JsonObject:
    return {
        **SERVICE.header(),
        "metadata": _meta(owner),
        "spec": {
            "type": "ClusterIP",
            "selector": router_labels(owner),
            "ports": [
                {"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
                {"name": "http-metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }


def build_router_pdb(owner: Owner) -> JsonObject:
    return {
        **POD_DISRUPTION_BUDGET.header(),
        "metadata": _meta(owner),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": router_labels(owner)}},
    }


def build_router_network_policy(owner: Owner) -> JsonObject:
    """Who may reach the router: its HTTP port, everyone (it is the service's way in, as the
    pods' serving port is); its metrics, the operator's pods and Prometheus's namespaces. The
    pods' own policy (network_policy.py) leaves their serving port open, the router's way to them."""
    operator = {"matchLabels": {NAMESPACE_NAME_LABEL: owner.network.operator_namespace}}
    monitors = [
        {"namespaceSelector": operator, "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)}},
        {"namespaceSelector": dict(owner.network.prometheus_namespaces)},
    ]
    return {
        **NETWORK_POLICY.header(),
        "metadata": _meta(owner),
        "spec": {
            "podSelector": {"matchLabels": router_labels(owner)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"ports": [{"protocol": "TCP", "port": PORT}]},
                {"from": monitors, "ports": [{"protocol": "TCP", "port": METRICS_PORT}]},
            ],
        },
    }


def build_router(owner: Owner) -> list[JsonObject]:
    """The router's objects, in OBJECT_KINDS order."""
    spec = _spec(owner)
    if len(router_name(owner)) > NAME_MAX_LENGTH:
        raise SpecError(
            "routing.router",
            f"the router's Service {router_name(owner)!r} would be longer than {NAME_MAX_LENGTH} characters: "
            "shorten metadata.name",
        )
    objects = [build_router_service_account(owner), build_router_role_binding(owner)]
    if owner.network.enabled:
        objects.append(build_router_network_policy(owner))
    objects += [build_router_deployment(owner), build_router_service(owner)]
    if spec.replicas > 1:
        objects.append(build_router_pdb(owner))
    return objects
