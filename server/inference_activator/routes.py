"""What the activator decides without I/O: which hosts a slice routes, to which upstream, under
which limits; and whether one more request may be held.

The operator points a service at zero at the activator with an EndpointSlice of its own
(`S-activator` in the service's namespace N, labelled with the Service's name S). A slice's
author is not trusted: anyone who may write EndpointSlices in N can write one. So a slice only
ever routes the hosts of the Service S *in its own namespace* (`S`, `S.N`, `S.N.svc`,
`S.N.svc.<cluster domain>` and S's cluster IPs), its upstream is read from the Service object
`S-private` in N alone (never from the slice), and the limits in its annotation only lower the
activator's own (the flags are the caps). A short name `S` that services of several namespaces
claim at once is the table's to refuse (`RouteTable.lookup`: it would hand one namespace's
requests to another's model); the server then takes the client's own namespace's, as DNS would.

The InferenceService a wake starts is the one that owns `S-private` (its controller reference):
S itself for a service reached at its own Service, NAME for one reached through its router
(S = NAME-router, S-private its router's pods). A Service names its owner only in its own
namespace, so a forged reference wakes nothing that a slice's author in N could not already wake.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
MANAGED_BY = "activator.inference.rocm.dev"
#: The label selector of the activator's slices.
SLICE_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
POLICY_ANNOTATION = "inference.rocm.dev/activator"
WAKE_ANNOTATION = "inference.rocm.dev/wake"
PRIVATE_SUFFIX = "-private"
#: The port of S-private that leads to the replicas.
HTTP_PORT_NAME = "http"
#: The port of S-private that leads to the replicas' gRPC port (runtime.grpcPort), if they have one.
GRPC_PORT_NAME = "grpc"
#: A Service's name and a namespace's: DNS-1035 and DNS-1123 labels (both fit this).
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
#: A readiness path as the annotation may name it: absolute, plain characters, no authority.
_PATH = re.compile(r"^/[A-Za-z0-9._~/-]{0,254}$")
_SERVICE_TYPES = frozenset({"ClusterIP", "NodePort", "LoadBalancer"})
#: The owner a wake is written to: an InferenceService of this API group.
INFERENCE_SERVICE_GROUP = "inference.rocm.dev"
INFERENCE_SERVICE_KIND = "InferenceService"


@dataclass(frozen=True)
class HoldPolicy:
    """How long and how many requests of one service are held, and where its readiness is asked."""

    max_wait_seconds: float
    max_held: int
    max_held_bytes: int
    ready_path: str = "/health/ready"


def policy_from_annotation(value: str | None, caps: HoldPolicy) -> HoldPolicy:
    """The slice's annotation (JSON; every key optional), each limit at most its cap. A key that
    is missing, of the wrong type or out of range takes the cap; a readiness path that is not a
    plain absolute path takes the activator's own."""
    try:
        given: Any = json.loads(value) if value else {}
    except ValueError:
        given = {}
    if not isinstance(given, dict):
        given = {}

    def number(key: str, cap: float) -> float:
        raw = given.get(key)
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not raw > 0:
            return cap
        return min(float(raw), cap)

    path = given.get("readyPath")
    return HoldPolicy(
        max_wait_seconds=number("maxWaitSeconds", caps.max_wait_seconds),
        max_held=int(number("maxHeld", caps.max_held)),
        max_held_bytes=int(number("maxHeldBytes", caps.max_held_bytes)),
        ready_path=path if isinstance(path, str) and is_plain_path(path) else caps.ready_path,
    )


def is_plain_path(path: str) -> bool:
    """An absolute path of plain characters: never `//host` (another authority), `..`, a query
    or an encoded byte."""
    return bool(_PATH.match(path)) and not path.startswith("//") and ".." not in path.split("/")


@dataclass(frozen=True, order=True)
class ServiceKey:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Route:
    """One service at zero: the hosts its clients use, where its ready replicas are, its limits."""

    key: ServiceKey
    hosts: frozenset[str]
    upstream: str
    policy: HoldPolicy
    grpc_upstream: str | None = None  # `<ip>:<port>` of S-private's `grpc` port; None: it has none
    wakes: str = ""  # the InferenceService a wake starts (`wake_target`); empty: the Service's own name

    @property
    def wake_name(self) -> str:
        return self.wakes or self.key.name


class RouteRefused(ValueError):
    """A slice that routes nothing, and why (the message is logged, never sent to a client)."""


def slice_service(slice_: Mapping[str, Any]) -> ServiceKey:
    """The Service a slice stands for: its own namespace, its service-name label."""
    metadata = slice_.get("metadata") or {}
    namespace = metadata.get("namespace") or ""
    name = (metadata.get("labels") or {}).get(SERVICE_NAME_LABEL) or ""
    if not _is_label(namespace) or not _is_label(name) or len(name) > 63 - len(PRIVATE_SUFFIX):
        raise RouteRefused(f"slice {namespace}/{metadata.get('name')}: no valid {SERVICE_NAME_LABEL} label")
    return ServiceKey(namespace, name)


def route_for(
    slice_: Mapping[str, Any],
    service: Mapping[str, Any] | None,
    private: Mapping[str, Any] | None,
    caps: HoldPolicy,
    cluster_domain: str,
) -> Route:
    """The route a slice makes, from the two Services the API server returned for its namespace
    (None: not found). `RouteRefused` when either is missing or cannot lead anywhere."""
    key = slice_service(slice_)
    if service is None or not _is(service, key.namespace, key.name):
        raise RouteRefused(f"slice for {key}: Service {key} not found")
    private_name = key.name + PRIVATE_SUFFIX
    if private is None or not _is(private, key.namespace, private_name):
        raise RouteRefused(f"slice for {key}: Service {key.namespace}/{private_name} not found")
    upstream = _upstream(private)
    if upstream is None:
        raise RouteRefused(
            f"slice for {key}: Service {key.namespace}/{private_name} has no cluster IP, selector or port "
            f"named {HTTP_PORT_NAME!r}"
        )
    annotations = (slice_.get("metadata") or {}).get("annotations") or {}
    policy = policy_from_annotation(annotations.get(POLICY_ANNOTATION), caps)
    hosts = service_hosts(key, cluster_domain, _cluster_ips(service))
    grpc_address = _address(private, GRPC_PORT_NAME)
    return Route(key, hosts, upstream, policy, grpc_address, wake_target(private, key))


def wake_target(private: Mapping[str, Any], key: ServiceKey) -> str:
    """The InferenceService a wake of `key` starts: S-private's controller, if it is an
    InferenceService (NAME for S = NAME-router), else S (a Service made without owner)."""
    for ref in (private.get("metadata") or {}).get("ownerReferences") or []:
        if not isinstance(ref, Mapping) or ref.get("controller") is not True:
            continue
        group = str(ref.get("apiVersion") or "").partition("/")[0]
        name = ref.get("name")
        if group == INFERENCE_SERVICE_GROUP and ref.get("kind") == INFERENCE_SERVICE_KIND and _is_label(name):
            return str(name)
    return key.name


def service_hosts(key: ServiceKey, cluster_domain: str, cluster_ips: Iterable[str]) -> frozenset[str]:
    """Every Host a client of the Service may write (ports are stripped before matching)."""
    names = [key.name, f"{key.name}.{key.namespace}", f"{key.name}.{key.namespace}.svc"]
    if cluster_domain:
        names.append(f"{key.name}.{key.namespace}.svc.{cluster_domain.strip('.').lower()}")
    return frozenset(names) | frozenset(normalize_host(ip) for ip in cluster_ips)


def normalize_host(host: str) -> str:
    """A Host header as routes know it: lower case, no port, no trailing dot, an IPv6 address
    without its brackets."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def _is(obj: Mapping[str, Any], namespace: str, name: str) -> bool:
    metadata = obj.get("metadata") or {}
    return bool(metadata.get("namespace") == namespace and metadata.get("name") == name)


def _is_label(value: object) -> bool:
    return isinstance(value, str) and bool(_LABEL.match(value))


def _cluster_ips(service: Mapping[str, Any]) -> list[str]:
    spec = service.get("spec") or {}
    ips = [spec.get("clusterIP"), *(spec.get("clusterIPs") or [])]
    return sorted({ip for ip in ips if isinstance(ip, str) and _is_ip(ip)})


def _upstream(private: Mapping[str, Any]) -> str | None:
    """`http://<cluster IP>:<port named http>` of S-private (see `_address`)."""
    address = _address(private, HTTP_PORT_NAME)
    return None if address is None else f"http://{address}"


def _address(private: Mapping[str, Any], port_name: str) -> str | None:
    """`<cluster IP>:<port named port_name>` of S-private: a Service of a kind kube-proxy
    serves, selecting pods (a Service without a selector could be pointed anywhere)."""
    spec = private.get("spec") or {}
    if spec.get("type", "ClusterIP") not in _SERVICE_TYPES or not spec.get("selector"):
        return None
    ips = _cluster_ips(private)
    ip = spec.get("clusterIP") if spec.get("clusterIP") in ips else (ips[0] if ips else None)
    port = _named_port(spec, port_name)
    if ip is None or port is None:
        return None
    host = f"[{ip}]" if ":" in ip else ip
    return f"{host}:{port}"


def _named_port(spec: Mapping[str, Any], port_name: str) -> int | None:
    """The number of the first port of `spec` named `port_name`, when it is a valid port."""
    ports = [p for p in spec.get("ports") or [] if isinstance(p, Mapping) and p.get("name") == port_name]
    port = ports[0].get("port") if ports else None
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        return None
    return port


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


@dataclass
class RouteTable:
    """Hosts to services. A host two services claim (a short name used in two namespaces)
    belongs to neither: `lookup` says it is ambiguous."""

    routes: dict[ServiceKey, Route] = field(default_factory=dict)
    _claims: dict[str, set[ServiceKey]] = field(default_factory=dict)

    def set(self, route: Route) -> None:
        self.remove(route.key)
        self.routes[route.key] = route
        for host in route.hosts:
            self._claims.setdefault(host, set()).add(route.key)

    def remove(self, key: ServiceKey) -> Route | None:
        route = self.routes.pop(key, None)
        if route is not None:
            for host in route.hosts:
                claims = self._claims[host]
                claims.discard(key)
                if not claims:
                    del self._claims[host]
        return route

    def lookup(self, host: str) -> Route | None | list[ServiceKey]:
        """The route of a Host header; None if none; the services claiming it if several."""
        claims = self._claims.get(normalize_host(host))
        if not claims:
            return None
        if len(claims) > 1:
            return sorted(claims)
        return self.routes[next(iter(claims))]


@dataclass(frozen=True)
class Load:
    """Requests held and their bytes (one service's, a namespace's, a client's, or all of them)."""

    requests: int = 0
    body_bytes: int = 0

    def add(self, requests: int, body_bytes: int) -> Load:
        return Load(self.requests + requests, self.body_bytes + body_bytes)


def over_caps(load: Load, caps: Load, size: int) -> str | None:
    """Which of `caps` one more request of `size` bytes would exceed: "requests", "body_bytes" or None."""
    if load.requests + 1 > caps.requests:
        return "requests"
    if load.body_bytes + size > caps.body_bytes:
        return "body_bytes"
    return None


def fair_victim(holders: Mapping[str, Load], newcomer: str, measure: str, size: int) -> str | None:
    """A full pool (a service's held requests, or the activator's) asked for one more by
    `newcomer` (a client, or a namespace): the holder that gives one of its requests back, the
    one holding the most by `measure` ("requests", or "body_bytes" for a request of `size`
    bytes), if it holds more than the newcomer would with it; None: the newcomer is the one
    refused. So the pool is everyone's while one uses it, and each one's fair share once several
    want it: a flood is refused its newest requests, never another's first."""
    amount = 1 if measure == "requests" else size
    own = getattr(holders.get(newcomer, Load()), measure)
    top = max(holders, key=lambda holder: (getattr(holders[holder], measure), holder), default=None)
    if top is None or top == newcomer or getattr(holders[top], measure) <= own + amount:
        return None
    return top


def hold_refusal(service: Load, policy: HoldPolicy, total: Load, caps: Load, size: int) -> tuple[int, str] | None:
    """Why one more request of `size` body bytes may not be held, as a status and its message:
    413 for a body no wait could make room for, 429 while others fill the limits; or None."""
    if size > min(policy.max_held_bytes, caps.body_bytes):
        largest = min(policy.max_held_bytes, caps.body_bytes)
        return 413, f"a body of {size} bytes is larger than a request held while the service starts may be ({largest})"
    if service.requests + 1 > policy.max_held:
        return 429, f"{policy.max_held} requests are already waiting for this service to start"
    if service.body_bytes + size > policy.max_held_bytes:
        return 429, f"requests waiting for this service to start already hold {service.body_bytes} bytes of bodies"
    if total.requests + 1 > caps.requests or total.body_bytes + size > caps.body_bytes:
        return 429, "the activator holds as many requests as it may; retry shortly"
    return None
