"""spec.disaggregation → the prefill and decode roles: NAME-prefill and NAME-decode in place of NAME.

Each role's pods are the predictor's pod (deployment.py: model storage, GPUs, security, the vLLM
front, probes, metrics annotations) built from the role's replicas, resources and autoscaling,
then made the role's: named NAME-ROLE, labelled `inference.rocm.dev/role: ROLE` (in the pods'
selector too, so the two Deployments never select each other's pods), and given vLLM's
`--kv-transfer-config` with what its KV connector needs (CONNECTORS). The pods keep
`app.kubernetes.io/component: predictor`: they are model pods, the service's NetworkPolicy
(network_policy.py) and its pods' status cover both roles as they cover one.

Per role, beside the Deployment: a PodDisruptionBudget with more than one replica, the DRA
claim template of its own resources, an HPA or a KEDA ScaledObject (with its
TriggerAuthentication) reading the role's own pods (none in mode builtin: the operator's loop
writes spec.disaggregation.ROLE.replicas, `replicas_patch`), and a NetworkPolicy that opens the role's
KV-transfer ports to the other role's pods of this service alone, in its namespace alone.

The router (router.py) runs in P/D mode over the two roles (`pd_discovery_args`). NAME's own
Service is not made: a request sent to one role alone would never be answered right.

What each connector is told, from vLLM's source (v1/nixl, v1/moriio, v1/mooncake):

- nixl (NixlConnector): kv_role kv_producer / kv_consumer (kv_both is deprecated for it);
  `kv_buffer_device: cpu` on pods without a GPU (vLLM's CPU build moves the cache through host
  memory); the handshake's side channel on VLLM_NIXL_SIDE_CHANNEL_HOST (the pod's IP, from the
  downward API: the default, localhost, is unreachable from the other pod) and _PORT; UCX's TCP
  transport on a fixed port range (UCX_TCP_PORT_RANGE), so the policy can open it. On pods without
  a GPU, vLLM's OpenMP threads sized by the pod's CPU (cpu_threads_env), not bound to the node's.
- moriio (MoRIIOConnector): kv_connector_extra_config with the handshake and notify ports and the
  front's HTTP port; its address from VLLM_HOST_IP (the pod's IP); one notify port per
  tensor-parallel rank.
- mooncake (MooncakeConnector): the bootstrap server's port (VLLM_MOONCAKE_BOOTSTRAP_PORT) on
  the prefill pods, which the decode pods ask for the engine's address.

The prefill pods carry `vllm.ai/bootstrap-port` (the connector's handshake or bootstrap port),
the annotation the router reads from a discovered prefill pod.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..engines.base import ServiceValues
from ..jsontypes import JsonObject
from ..kinds import NETWORK_POLICY, POD_DISRUPTION_BUDGET
from ..models import (
    NAME_MAX_LENGTH,
    AutoscalingMode,
    DecodeSpec,
    DisaggregationSpec,
    InferenceServiceSpec,
    KvConnector,
    PrefillSpec,
    ScaleToZeroSpec,
    SpecError,
)
from ..prometheus import promql
from ..quantities import quantity_value
from .common import (
    MASTER_PORT,
    ROLE_LABEL,
    Owner,
    Role,
    engine_of,
    engine_port,
    object_meta,
    router_pod_labels,
    selector_labels,
    serving_labels,
)
from .deployment import build_deployment, service_values
from .gpu import build_resource_claim_template, needs_claim_template, plan
from .hpa import PROMQL_ANNOTATION, build_hpa
from .keda import build_scaled_object, build_trigger_authentication

ROLES = (Role.PREFILL, Role.DECODE)
# The annotation on a prefill pod the router reads its connector's bootstrap port from.
BOOTSTRAP_PORT_ANNOTATION = "vllm.ai/bootstrap-port"
# The container port's name of the connector's side channel.
SIDE_CHANNEL_PORT_NAME = "kv-transfer"
KV_ROLES = {Role.PREFILL: "kv_producer", Role.DECODE: "kv_consumer"}

NIXL_SIDE_CHANNEL_PORT = 5600
# UCX's TCP transport listens on a port of this range (UCX_TCP_PORT_RANGE), not an ephemeral one.
UCX_TCP_PORTS = (5601, 5680)
# How long a prefill engine keeps a finished prompt's KV blocks for the decode engine to read
# (the decode side's heartbeats extend it while the request waits there). vLLM's 30 s is sized
# for GPU step times; on the CPU build a decode step under load takes seconds and the first
# transfer waits for the NIXL handshake, so the prefill freed blocks the decode then read
# ("Releasing expired KV blocks", then "Potentially invalid KV blocks" in the prefill's log)
# and the request failed with a 500. Blocks of a decode that died are held this long at most.
CPU_KV_LEASE_SECONDS = 300
MORIIO_HANDSHAKE_PORT = 6301
MORIIO_NOTIFY_PORT = 61005
MOONCAKE_BOOTSTRAP_PORT = 8998


def _pod_ip(name: str) -> JsonObject:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


@dataclass(frozen=True)
class PortRange:
    first: int
    last: int

    def rule(self) -> JsonObject:
        port: JsonObject = {"protocol": "TCP", "port": self.first}
        if self.last != self.first:
            port["endPort"] = self.last
        return port


@dataclass(frozen=True)
class RoleConnector:
    """What one role's vLLM gets for its connector: the config, the env, the ports it listens on."""

    config: JsonObject
    env: list[JsonObject]
    ports: tuple[PortRange, ...]
    side_channel_port: int


def nixl_config(role: Role, gpus: int) -> JsonObject:
    """NixlConnector's --kv-transfer-config for `role`: on pods without a GPU, the cache through
    host memory and a lease of CPU_KV_LEASE_SECONDS."""
    config: JsonObject = {"kv_connector": "NixlConnector", "kv_role": KV_ROLES[role]}
    if gpus == 0:
        config["kv_buffer_device"] = "cpu"
        config["kv_connector_extra_config"] = {"kv_lease_duration": CPU_KV_LEASE_SECONDS}
    return config


def omp_threads(cpu: str) -> int:
    """OpenMP threads for a CPU NIXL role's engine with `cpu` (the container's CPU limit): the
    whole CPUs less the two vLLM keeps beside a connector's engine (its scheduler process and
    NIXL's UCX progress thread, which polls without pause), at least one."""
    return max(1, int(quantity_value(cpu)) - 2)


def cpu_threads_env(cpu: str) -> list[JsonObject]:
    """vLLM's CPU build with a KV connector, told how many OpenMP threads to run and not to bind them.

    Left to itself (VLLM_CPU_OMP_THREADS_BIND=auto) vLLM binds one OpenMP thread to each CPU of
    the process's affinity mask, which in a pod is the node's CPUs, not its limit, less the CPUs
    it reserves; where the mask has no more CPUs than that reserve it binds a thread to every
    one of them. Each parallel region then waits at its barrier for a thread that shares its CPU
    with NIXL's progress thread, and a token takes seconds. Unbound, with as many threads as the
    pod's CPU leaves for them, the kernel places them and a step takes what it takes without
    the connector.
    """
    return [
        {"name": "VLLM_CPU_OMP_THREADS_BIND", "value": "nobind"},
        {"name": "OMP_NUM_THREADS", "value": str(omp_threads(cpu))},
    ]


def nixl_env(cpu: str, gpus: int) -> list[JsonObject]:
    """A NixlConnector role's variables: the side channel on the pod's IP, UCX's TCP ports, and
    on pods without a GPU the OpenMP threads for `cpu`, the container's CPU."""
    env = [
        _pod_ip("VLLM_NIXL_SIDE_CHANNEL_HOST"),
        {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(NIXL_SIDE_CHANNEL_PORT)},
        {"name": "UCX_TCP_PORT_RANGE", "value": f"{UCX_TCP_PORTS[0]}-{UCX_TCP_PORTS[1]}"},
    ]
    return env + (cpu_threads_env(cpu) if gpus == 0 else [])


def _nixl(role: Role, service: ServiceValues, ranks: int) -> RoleConnector:
    del ranks
    config = nixl_config(role, service.gpus)
    env = nixl_env(service.cpu, service.gpus)
    ports = (PortRange(NIXL_SIDE_CHANNEL_PORT, NIXL_SIDE_CHANNEL_PORT), PortRange(*UCX_TCP_PORTS))
    return RoleConnector(config, env, ports, NIXL_SIDE_CHANNEL_PORT)


def _moriio(role: Role, service: ServiceValues, ranks: int) -> RoleConnector:
    """A notify port per rank of the engine (`ServingEngine.ranks`)."""
    config: JsonObject = {
        "kv_connector": "MoRIIOConnector",
        "kv_role": KV_ROLES[role],
        "kv_connector_extra_config": {
            "http_port": str(service.port),
            "handshake_port": str(MORIIO_HANDSHAKE_PORT),
            "notify_port": str(MORIIO_NOTIFY_PORT),
        },
    }
    ports = (
        PortRange(MORIIO_HANDSHAKE_PORT, MORIIO_HANDSHAKE_PORT),
        PortRange(MORIIO_NOTIFY_PORT, MORIIO_NOTIFY_PORT + ranks - 1),
    )
    return RoleConnector(config, [_pod_ip("VLLM_HOST_IP")], ports, MORIIO_HANDSHAKE_PORT)


def _mooncake(role: Role, service: ServiceValues, ranks: int) -> RoleConnector:
    del service, ranks
    config: JsonObject = {"kv_connector": "MooncakeConnector", "kv_role": KV_ROLES[role]}
    env = [
        _pod_ip("VLLM_HOST_IP"),
        {"name": "VLLM_MOONCAKE_BOOTSTRAP_PORT", "value": str(MOONCAKE_BOOTSTRAP_PORT)},
    ]
    ports = (PortRange(MOONCAKE_BOOTSTRAP_PORT, MOONCAKE_BOOTSTRAP_PORT),)
    return RoleConnector(config, env, ports, MOONCAKE_BOOTSTRAP_PORT)


# What each connector wires for one role: from the role's service values and its engine's ranks.
CONNECTORS: dict[KvConnector, Callable[[Role, ServiceValues, int], RoleConnector]] = {
    KvConnector.NIXL: _nixl,
    KvConnector.MORIIO: _moriio,
    KvConnector.MOONCAKE: _mooncake,
}


def disaggregation(owner: Owner) -> DisaggregationSpec | None:
    return owner.spec.disaggregation


def disaggregated(owner: Owner) -> bool:
    return owner.spec.disaggregation is not None


def _spec(owner: Owner) -> DisaggregationSpec:
    spec = owner.spec.disaggregation
    if spec is None:
        raise ValueError("the roles are built only for spec.disaggregation")
    return spec


def role_workload(name: str, role: Role) -> str:
    """NAME-ROLE: the role's Deployment (and its pods' names' prefix) of the service NAME."""
    return f"{name}-{role}"


def role_name(owner: Owner, role: Role) -> str:
    return role_workload(owner.name, role)


def role_part(spec: InferenceServiceSpec, role: Role) -> PrefillSpec | DecodeSpec:
    pd = spec.disaggregation
    if pd is None:
        raise ValueError("the roles are built only for spec.disaggregation")
    return pd.prefill if role == Role.PREFILL else pd.decode


def role_spec(spec: InferenceServiceSpec, role: Role) -> InferenceServiceSpec:
    """The spec as one role's workload sees it, a service of its own: the role's replicas,
    resources (spec.resources when it has none) and autoscaling. With the pair's scaleToZero the
    role's autoscaling reads that scaleToZero, as a service's that goes to zero does: its
    Deployment runs the 0 the pair's write asks for, and the loop holds it there until a wake.
    Its minReplicas stays the role's own: its floor while the pair serves (a service's own is 0
    with scaleToZero, so its floor while it serves is one)."""
    part = role_part(spec, role)
    scaling = part.autoscaling
    zero = pair_scale_to_zero(spec)
    if scaling is not None and zero is not None:
        scaling = scaling.model_copy(update={"scale_to_zero": zero})
    return spec.model_copy(
        update={"replicas": part.replicas, "resources": part.resources or spec.resources, "autoscaling": scaling}
    )


def pair_scale_to_zero(spec: InferenceServiceSpec) -> ScaleToZeroSpec | None:
    """disaggregation.scaleToZero, the pair's (None without spec.disaggregation)."""
    return None if spec.disaggregation is None else spec.disaggregation.scale_to_zero


def role_replicas(spec: InferenceServiceSpec) -> dict[Role, int]:
    """Each role's spec replicas, the counts the built-in loop writes."""
    return {role: role_part(spec, role).replicas for role in ROLES}


def replicas_patch(counts: Mapping[Role, int]) -> JsonObject:
    """The merge patch of the InferenceService that sets these roles' replicas (one write for
    the pair: they go to zero and back together)."""
    return {"spec": {"disaggregation": {str(role): {"replicas": n} for role, n in counts.items()}}}


def role_owner(owner: Owner, role: Role) -> Owner:
    """The owner as the predictor's builders should see one role (`role_spec`)."""
    _spec(owner)
    return dataclasses.replace(owner, spec=role_spec(owner.spec, role))


def role_gpus(owner: Owner, role: Role) -> int:
    return plan(role_owner(owner, role).spec.resources.gpu, owner.gpu_defaults).count


def connector(owner: Owner) -> KvConnector:
    """The spec's connector; unset, AMD's MoRI-IO when a role has GPUs, NIXL (CPU buffer) otherwise."""
    chosen = _spec(owner).kv_transfer.connector
    if chosen is not None:
        return chosen
    return KvConnector.MORIIO if any(role_gpus(owner, role) for role in ROLES) else KvConnector.NIXL


def role_connector(owner: Owner, role: Role) -> RoleConnector:
    service = service_values(role_owner(owner, role))
    return CONNECTORS[connector(owner)](role, service, engine_of(owner).ranks(service))


def kv_transfer_arg(owner: Owner, role: Role) -> str:
    """vLLM's --kv-transfer-config for the role, one `--flag=value` token (JSON, keys sorted)."""
    return "--kv-transfer-config=" + json.dumps(role_connector(owner, role).config, sort_keys=True)


def role_pod_labels(owner: Owner, role: Role) -> dict[str, str]:
    """The role's serving pods: the service's, with the role."""
    return {**serving_labels(owner), ROLE_LABEL: str(role)}


def pd_discovery_args(owner: Owner) -> list[str]:
    """The router's service discovery in P/D mode: each role's pods by label, and the connector."""

    def selector(role: Role) -> list[str]:
        return [f"{key}={value}" for key, value in sorted(role_pod_labels(owner, role).items())]

    return [
        "--vllm-pd-disaggregation",
        "--prefill-selector",
        *selector(Role.PREFILL),
        "--decode-selector",
        *selector(Role.DECODE),
        f"--kv-connector={connector(owner)}",
    ]


def _as_role(obj: JsonObject, owner: Owner, role: Role) -> JsonObject:
    """An object a predictor's builder made, renamed and labelled as the role's."""
    obj = copy.deepcopy(obj)
    meta = obj["metadata"]
    meta["name"] = role_name(owner, role)
    meta["labels"][ROLE_LABEL] = str(role)
    return obj


def _check_ports(owner: Owner, role: Role, wired: RoleConnector) -> None:
    runtime = owner.spec.runtime
    taken = {runtime.port, runtime.metrics_port, engine_port(owner.spec), MASTER_PORT}
    for ports in wired.ports:
        if clash := sorted(p for p in taken if ports.first <= p <= ports.last):
            raise SpecError(
                "spec.disaggregation.kvTransfer",
                f"the {connector(owner)} connector's port {clash[0]} on the {role} pods is one of the pod's "
                "own ports: move runtime.port or runtime.metricsPort",
            )


def build_role_deployment(owner: Owner, role: Role) -> JsonObject:
    part = role_owner(owner, role)
    wired = role_connector(owner, role)
    _check_ports(part, role, wired)
    deployment = _as_role(build_deployment(part), owner, role)
    spec = deployment["spec"]
    spec["selector"]["matchLabels"][ROLE_LABEL] = str(role)
    template = spec["template"]
    template["metadata"]["labels"][ROLE_LABEL] = str(role)
    if role == Role.PREFILL:
        template["metadata"]["annotations"][BOOTSTRAP_PORT_ANNOTATION] = str(wired.side_channel_port)
    pod = template["spec"]
    for claim in pod.get("resourceClaims") or []:  # the role's own claim template
        claim["resourceClaimTemplateName"] = role_name(owner, role)
    serving = next(c for c in pod["containers"] if c["name"] == engine_of(owner).container)
    serving["args"].append(kv_transfer_arg(owner, role))
    names = {e["name"] for e in wired.env}
    serving["env"] = [e for e in serving["env"] if e["name"] not in names] + wired.env
    serving["ports"].append(
        {"name": SIDE_CHANNEL_PORT_NAME, "containerPort": wired.side_channel_port, "protocol": "TCP"}
    )
    return deployment


def build_role_pdb(owner: Owner, role: Role) -> JsonObject:
    return {
        **POD_DISRUPTION_BUDGET.header(),
        "metadata": object_meta(owner, role_name(owner, role), role=role),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {**selector_labels(owner), ROLE_LABEL: str(role)}}},
    }


def needs_role_pdb(owner: Owner, role: Role) -> bool:
    """More than one replica while it serves: the role's own floor (a pair at zero has no pod
    for a budget to keep, and its floor while it serves is still the role's minReplicas)."""
    part = role_part(owner.spec, role)
    floor = part.autoscaling.min_replicas if part.autoscaling is not None else part.replicas
    return floor > 1


def build_kv_network_policy(owner: Owner, role: Role) -> JsonObject:
    """The role's KV-transfer ports, open to the other role's pods of this service alone (a
    podSelector without a namespaceSelector: the policy's own namespace alone); on prefill, the
    bootstrap port to this service's router too (Mooncake's P/D mode asks it for the engine)."""
    other = Role.DECODE if role == Role.PREFILL else Role.PREFILL
    wired = role_connector(owner, role)
    ingress: list[JsonObject] = [
        {
            "from": [{"podSelector": {"matchLabels": {**selector_labels(owner), ROLE_LABEL: str(other)}}}],
            "ports": [ports.rule() for ports in wired.ports],
        }
    ]
    if role == Role.PREFILL:  # the port of vllm.ai/bootstrap-port, which the router may ask
        bootstrap = PortRange(wired.side_channel_port, wired.side_channel_port).rule()
        ingress.append(
            {"from": [{"podSelector": {"matchLabels": router_pod_labels(owner.name)}}], "ports": [bootstrap]}
        )
    return {
        **NETWORK_POLICY.header(),
        "metadata": object_meta(owner, role_name(owner, role), role=role),
        "spec": {
            "podSelector": {"matchLabels": {**selector_labels(owner), ROLE_LABEL: str(role)}},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def _scaler(owner: Owner, role: Role) -> list[JsonObject]:
    """The role's HPA, or KEDA's ScaledObject (and TriggerAuthentication), over the role's pods."""
    part = role_owner(owner, role)
    scaling = part.spec.autoscaling
    if scaling is None or scaling.mode == AutoscalingMode.BUILTIN:
        return []  # builtin: the operator's loop writes the role's replicas (autoscaler/loop.py)
    name = role_name(owner, role)
    query = promql.metric_query(
        scaling.metric,
        owner.namespace,
        owner.model_name,
        scaling.window_seconds,
        owner.spec.runtime.engine,
        pods=promql.workload_pods(name),
    )
    if scaling.mode == AutoscalingMode.HPA:
        hpa = _as_role(build_hpa(part), owner, role)
        hpa["metadata"]["annotations"][PROMQL_ANNOTATION] = query
        hpa["spec"]["scaleTargetRef"]["name"] = name
        return [hpa]
    objects = []
    if auth := build_trigger_authentication(part):
        objects.append(_as_role(auth, owner, role))
    scaled = _as_role(build_scaled_object(part), owner, role)
    scaled["spec"]["scaleTargetRef"]["name"] = name
    for trigger in scaled["spec"]["triggers"]:
        trigger["metadata"]["query"] = query
        if "authenticationRef" in trigger:
            trigger["authenticationRef"]["name"] = name
    return [*objects, scaled]


def build_disaggregation(owner: Owner) -> list[JsonObject]:
    """Both roles' objects, each role's in apply order."""
    for role in ROLES:
        if len(role_name(owner, role)) > NAME_MAX_LENGTH:
            raise SpecError(
                "spec.disaggregation",
                f"the {role} Deployment's name {role_name(owner, role)!r} would be longer than "
                f"{NAME_MAX_LENGTH} characters: shorten metadata.name",
            )
    objects: list[JsonObject] = []
    for role in ROLES:
        part = role_owner(owner, role)
        if needs_claim_template(part):
            objects.append(_as_role(build_resource_claim_template(part), owner, role))
        if owner.network.enabled:
            objects.append(build_kv_network_policy(owner, role))
        objects.append(build_role_deployment(owner, role))
        if needs_role_pdb(owner, role):
            objects.append(build_role_pdb(owner, role))
        objects += _scaler(owner, role)
    return objects
