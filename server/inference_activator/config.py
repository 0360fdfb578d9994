"""The activator's flags (`model_server activator`): one field each, its type, default and help,
and the limits derived from them."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from bounded_http import limits
from bounded_http.http_protocol import ConnectionLimits
from bounded_http.limits import detect_memory_limit

from .routes import HoldPolicy

LIVE_PATH = "/healthz"
READY_PATH = "/readyz"
PROBE_PATHS = frozenset({LIVE_PATH, READY_PATH})
#: Of the memory limit: bodies being read at once, and bodies held.
READ_BUDGET_SHARE = 1 / 4
HELD_BUDGET_SHARE = 3 / 8
MAX_BODY_CEILING = 64 * 1024 * 1024


@dataclass(frozen=True)
class ActivatorConfig(limits.PortLimits):
    """The activator's flags, beside its port's (PortLimits). The hold limits are caps: a
    slice's annotation may only lower them."""

    kube_api: str = ""  # "": in the cluster (KUBERNETES_SERVICE_HOST, the ServiceAccount's token)
    kube_token_file: str = ""
    kube_ca_file: str = ""
    host: str = "0.0.0.0"
    port: int = 8012
    grpc_port: int = 8013  # 0: none
    metrics_port: int = 9090  # 0: none
    cluster_domain: str = "cluster.local"
    max_wait_seconds: float = 600.0
    max_held: int = 1000
    max_held_bytes: int = 64 * 1024 * 1024
    max_held_total: int = 2000
    max_held_bytes_total: int = 0  # 0: from the memory limit
    ready_path: str = "/health/ready"
    drain_listen_seconds: float = 10.0
    final_scrape_seconds: float = 0.0
    linger_seconds: float = 60.0
    max_connections: int = 4096  # above max_held_total: each held request keeps its connection
    response_start_timeout_s: float = 300.0
    log_level: str = "info"

    def caps(self) -> HoldPolicy:
        return HoldPolicy(self.max_wait_seconds, self.max_held, self.max_held_bytes, self.ready_path)

    def limits(self) -> tuple[int, int, int]:
        """(the largest body, bodies being read at once, bodies held at once), in bytes."""
        memory = self.memory_limit_bytes or detect_memory_limit()
        reading = int(memory * READ_BUDGET_SHARE)
        largest = self.max_body_bytes or min(MAX_BODY_CEILING, reading // 4)
        held = self.max_held_bytes_total or int(memory * HELD_BUDGET_SHARE)
        return largest, max(reading, largest), held

    def connection_limits(self) -> ConnectionLimits:
        return ConnectionLimits.of(self, PROBE_PATHS)


HELP = {
    "kube_api": "the API server's URL; empty: in the cluster (KUBERNETES_SERVICE_HOST, the ServiceAccount's files)",
    "kube_token_file": "a bearer token file for --kube-api, read again when it changes",
    "kube_ca_file": "the CA bundle of --kube-api",
    "port": "the port the activator's EndpointSlices name",
    "grpc_port": "the gRPC (h2c) port the EndpointSlices of services with a gRPC port name; 0: none",
    "metrics_port": "Prometheus metrics; 0: none",
    "cluster_domain": "hosts S.N.svc.<this> are routed too",
    "max_wait_seconds": "the longest a request is held (a slice's maxWaitSeconds is capped by it)",
    "max_held": "requests held per service (caps a slice's maxHeld)",
    "max_held_bytes": "bytes of bodies held per service (caps a slice's maxHeldBytes)",
    "max_held_total": "requests held for all services at once (a full pool is shared fairly among namespaces)",
    "max_held_bytes_total": "bytes of bodies held for all services at once; 0: 3/8 of the memory limit",
    "ready_path": "the replicas' readiness path when a slice names none (or one that is not a plain path)",
    "drain_listen_seconds": "after SIGTERM, how long the listener stays open (unready) before it closes",
    "final_scrape_seconds": "after SIGTERM, how long the metrics port answers once every request has ended "
    "(a scrape interval: the scrape that sees how the last held requests ended)",
    "linger_seconds": "after a slice is removed, how long its hosts are still proxied straight to the replicas",
    "memory_limit_bytes": "0: the cgroup's; bodies being read take up to 1/4 of it",
    "max_body_bytes": "the largest request body (413 above); 0: from the memory limit, at most 64 MiB",
    "response_start_timeout_s": "the longest a replica may take to begin its answer (then 504)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per field of ActivatorConfig, of the field's type."""
    limits.add_config_arguments(parser, ActivatorConfig, HELP)


def config_from_args(args: argparse.Namespace) -> ActivatorConfig:
    return limits.config_from_arguments(ActivatorConfig, args)
