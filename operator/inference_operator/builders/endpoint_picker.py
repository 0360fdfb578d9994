"""routing.inferencePool without an external picker → the pool's endpoint picker (EPP), NAME-epp.

The picker is llm-d's build of the Gateway API Inference Extension's EPP (image: the operator's
`images.endpointPicker`): the gateway hands it each request over Envoy ext-proc (gRPC), it
scores the pool's pods and names the one to use. Here it gets a ServiceAccount, a RoleBinding
to the ClusterRole the chart ships (pods, inferencepools, inferenceobjectives: read only), a
Deployment and a Service whose ext-proc port the InferencePool's `endpointPickerRef` names.

What the picker is told, and why (checked against the sources, not run here):

- Flags (`pkg/epp/server/options.go` of kubernetes-sigs/gateway-api-inference-extension v1.5.0,
  which llm-d-inference-scheduler v0.8.0 runs; the same in llm-d/llm-d-router today):
  `--pool-name/--pool-namespace/--pool-group` name the InferencePool it serves; `--grpc-port`
  (9002) is ext-proc, `--grpc-health-port` (9003) the gRPC health service its probes ask,
  `--metrics-port` (9090) its own metrics; `--config-text` is the EndpointPickerConfig inline.
  `--metrics-endpoint-auth=false`: with auth on, it needs cluster-wide tokenreviews and
  subjectaccessreviews, which a namespaced RoleBinding cannot grant.
- EndpointPickerConfig (`apix/config/v1alpha1`, group inference.networking.x-k8s.io, which
  newer pickers still read): `plugins` by type, one `schedulingProfiles` entry with a weight
  per scorer, and `max-score-picker`. The picker adds what is left out (the metrics data
  source and its vLLM extractor, a single-profile handler; `pkg/epp/config/loader/defaults.go`).
- What it reads from vLLM pods, on the pool's target port at /metrics:
  `vllm:num_requests_waiting` (queue-scorer), `vllm:kv_cache_usage_perc`
  (kv-cache-utilization-scorer), `vllm:lora_requests_info` (lora-affinity-scorer);
  prefix-cache-scorer keeps its own index of the prompts it routed.
- Probes: gRPC health on 9003, service `inference-extension`, serving once the pool is synced;
  one replica, Recreate (its prefix index is in memory; more replicas need leader election).
- RBAC as the upstream chart's (`config/charts/inferencepool/templates/rbac.yaml`, epplib
  `_rbac.yaml`): get/list/watch on pods, inferencepools, inferenceobjectives and
  inferencemodelrewrites. The operator creates the RoleBinding with `bind` on that one
  ClusterRole (RBAC's escalation check passes on `bind` for the referenced role:
  kubernetes.io/docs/reference/access-authn-authz/rbac/#restrictions-on-role-binding-creation-or-update),
  so it never holds the picker's rights itself.
"""

from __future__ import annotations

import json

from ..jsontypes import JsonObject
from ..kinds import DEPLOYMENT, ENDPOINT_PICKER_CONFIG, INFERENCE_POOL, ROLE_BINDING, SERVICE, SERVICE_ACCOUNT
from ..models import NAME_MAX_LENGTH, ScorerWeights, SpecError
from ..settings import MANAGER
from .common import OWNER_LABEL, ROLE_LABEL, Owner, Role, object_meta

# The ClusterRole the chart ships for every picker (files/rbac/endpoint-picker.yaml); the
# operator may bind it (and nothing else) by this name.
CLUSTER_ROLE = "rocm-inference-endpoint-picker"
COMPONENT = "endpoint-picker"
SUFFIX = "-epp"
GRPC_PORT = 9002
HEALTH_PORT = 9003
METRICS_PORT = 9090
# The gRPC health service name its single-replica health server answers for.
HEALTH_SERVICE = "inference-extension"
RUN_AS_USER = 65532
PICKER = "max-score-picker"
# Scorer plugin types, by ScorerWeights field.
SCORERS = {
    "prefix_cache": "prefix-cache-scorer",
    "queue": "queue-scorer",
    "kv_cache_utilization": "kv-cache-utilization-scorer",
    "lora_affinity": "lora-affinity-scorer",
}
# What a picker consists of, in apply order.
OBJECT_KINDS = (SERVICE_ACCOUNT, ROLE_BINDING, DEPLOYMENT, SERVICE)
# Kinds the operator writes only for a picker (never an object named NAME).
PICKER_ONLY_KINDS = frozenset(OBJECT_KINDS[:2])


def deploys_endpoint_picker(owner: Owner) -> bool:
    """Whether the operator runs the pool's picker: a pool, and no external picker named."""
    routing = owner.spec.routing
    return routing.inference_pool and not (routing.endpoint_picker and routing.endpoint_picker.name)


def picker_name(owner: Owner) -> str:
    return owner.name + SUFFIX


def picker_labels(owner: Owner) -> dict[str, str]:
    """The picker's pod labels: apart from the model pods' (the pool must not select it)."""
    return {
        "app.kubernetes.io/name": COMPONENT,
        "app.kubernetes.io/instance": owner.name,
        "app.kubernetes.io/component": COMPONENT,
    }


def _meta(owner: Owner) -> JsonObject:
    labels = {
        **picker_labels(owner),
        "app.kubernetes.io/managed-by": MANAGER,
        "app.kubernetes.io/part-of": "rocm-inference",
        OWNER_LABEL: owner.name,
        ROLE_LABEL: str(Role.ENDPOINT_PICKER),
    }
    return {**object_meta(owner, picker_name(owner)), "labels": labels}


def picker_config(owner: Owner) -> JsonObject:
    """The EndpointPickerConfig: the scorers with a weight above 0, then the max-score picker."""
    picker = owner.spec.routing.endpoint_picker
    weights = (picker.weights if picker else None) or ScorerWeights()
    scorers = [(plugin, getattr(weights, field)) for field, plugin in SCORERS.items() if getattr(weights, field) > 0]
    return {
        **ENDPOINT_PICKER_CONFIG.header(),
        "plugins": [{"type": plugin} for plugin, _ in scorers] + [{"type": PICKER}],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [{"pluginRef": plugin, "weight": weight} for plugin, weight in scorers]
                + [{"pluginRef": PICKER}],
            }
        ],
    }


def picker_args(owner: Owner) -> list[str]:
    config = json.dumps(picker_config(owner), separators=(",", ":"))  # JSON is YAML to the picker
    return [
        f"--pool-name={owner.name}",
        f"--pool-namespace={owner.namespace}",
        f"--pool-group={INFERENCE_POOL.group}",
        f"--grpc-port={GRPC_PORT}",
        f"--grpc-health-port={HEALTH_PORT}",
        f"--metrics-port={METRICS_PORT}",
        "--metrics-endpoint-auth=false",
        "--tracing=false",
        f"--config-text={config}",
    ]


def build_service_account(owner: Owner) -> JsonObject:
    return {**SERVICE_ACCOUNT.header(), "metadata": _meta(owner)}


def build_role_binding(owner: Owner) -> JsonObject:
    return {
        **ROLE_BINDING.header(),
        "metadata": _meta(owner),
        "roleRef": {"apiGroup": ROLE_BINDING.group, "kind": "ClusterRole", "name": CLUSTER_ROLE},
        "subjects": [{"kind": SERVICE_ACCOUNT.kind, "name": picker_name(owner), "namespace": owner.namespace}],
    }


def build_picker_deployment(owner: Owner) -> JsonObject:
    health = {"port": HEALTH_PORT, "service": HEALTH_SERVICE}
    container: JsonObject = {
        "name": "epp",
        "image": owner.images.endpoint_picker,
        "imagePullPolicy": "IfNotPresent",
        "args": picker_args(owner),
        "env": [
            {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        "ports": [
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
            {"name": "grpc-health", "containerPort": HEALTH_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "livenessProbe": {"grpc": health, "initialDelaySeconds": 5, "periodSeconds": 10},
        "readinessProbe": {"grpc": health, "periodSeconds": 5},
        # Room to burst to 4 cores: scheduling is bursty, and a throttled picker delays every request.
        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "4", "memory": "4Gi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    pod_spec: JsonObject = {
        "serviceAccountName": picker_name(owner),
        "automountServiceAccountToken": True,  # it watches pods and the pool
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 60,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }
    return {
        **DEPLOYMENT.header(),
        "metadata": _meta(owner),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "revisionHistoryLimit": 5,
            "selector": {"matchLabels": picker_labels(owner)},
            "template": {"metadata": {"labels": picker_labels(owner)}, "spec": pod_spec},
        },
    }


def build_picker_service(owner: Owner) -> JsonObject:
    picker = owner.spec.routing.endpoint_picker
    return {
        **SERVICE.header(),
        "metadata": _meta(owner),
        "spec": {
            "type": "ClusterIP",
            "selector": picker_labels(owner),
            "ports": [
                # The port the InferencePool's endpointPickerRef names.
                {
                    "name": "grpc-ext-proc",
                    "port": picker.port if picker else GRPC_PORT,
                    "targetPort": "grpc",
                    "protocol": "TCP",
                },
                {"name": "http-metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }


def build_endpoint_picker(owner: Owner) -> list[JsonObject]:
    """The picker's objects, in OBJECT_KINDS order."""
    if len(picker_name(owner)) > NAME_MAX_LENGTH:
        raise SpecError(
            "routing.endpointPicker",
            f"the endpoint picker's Service {picker_name(owner)!r} would be longer than {NAME_MAX_LENGTH} "
            "characters: shorten metadata.name or name an external picker (routing.endpointPicker.name)",
        )
    return [
        build_service_account(owner),
        build_role_binding(owner),
        build_picker_deployment(owner),
        build_picker_service(owner),
    ]
