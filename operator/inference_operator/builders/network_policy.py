"""An InferenceService's NetworkPolicy (networking.k8s.io/v1), NAME: who may reach its pods.

The serving ports (runtime.port, and runtime.grpcPort when set) answer everyone (the Service,
the gateway, the endpoint picker). Every other port is closed to the pod network, but:

- `runtime.metricsPort` (the model server's metrics; on vLLM pods, the adapters sidecar's status)
  is open to the operator's pods (the chart's `app.kubernetes.io/component: operator` in its
  namespace), which ask the sidecars how their adapters stand, and to
  Prometheus's namespaces (chart value networkPolicy.prometheusNamespaceSelector);
- a multi-node replica's pods (resources.gpu.nodes > 1) reach each other on every port: vLLM's
  distributed bootstrap (--master-port), its message queues (which unpickle what they receive)
  and the collective backends between ranks use ports of their own. A NetworkPolicy cannot say
  "the receiver's own group", so it says "this service's pods": the same spec, the same author.

Only ingress is restricted; the policy selects every pod of the service (a canary's too).
Emitted while the operator's setting says so (chart value networkPolicy.enabled).
"""

from __future__ import annotations

from ..jsontypes import JsonObject
from ..kinds import NETWORK_POLICY
from ..settings import NAMESPACE_NAME_LABEL
from .common import Owner, multi_node, object_meta, selector_labels

# The chart's label on the operator's pods (templates/_helpers.tpl, rio.selectorLabels).
OPERATOR_POD_LABELS = {"app.kubernetes.io/component": "operator"}


def needs_network_policy(owner: Owner) -> bool:
    return owner.network.enabled


def build_network_policy(owner: Owner) -> JsonObject:
    runtime = owner.spec.runtime
    pods = {"matchLabels": selector_labels(owner)}
    operator = {"matchLabels": {NAMESPACE_NAME_LABEL: owner.network.operator_namespace}}
    monitors = [
        # The operator's pods, not its whole namespace: the scale-to-zero activator runs there
        # too, and it proxies to whatever a tenant's NAME-private leads to.
        {"namespaceSelector": operator, "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)}},
        {"namespaceSelector": dict(owner.network.prometheus_namespaces)},
    ]
    ingress: list[JsonObject] = [
        {"ports": [{"protocol": "TCP", "port": port} for port in (runtime.port, runtime.grpc_port) if port]},
        {"from": monitors, "ports": [{"protocol": "TCP", "port": runtime.metrics_port}]},
    ]
    if multi_node(owner.spec):
        ingress.append({"from": [{"podSelector": pods}]})
    return {
        **NETWORK_POLICY.header(),
        "metadata": object_meta(owner),
        "spec": {"podSelector": pods, "policyTypes": ["Ingress"], "ingress": ingress},
    }
