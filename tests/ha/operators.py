"""Operator replicas as real processes (`python -m inference_operator run --peering ...`)."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field

import httpx

from testsupport.cluster import Cluster
from testsupport.emulator import declare
from testsupport.processes import free_port

PEERINGS = "kopf.dev/v1/clusterkopfpeerings"
PEERING_VERBS = ("list", "watch", "get", "create", "patch")


def declare_peering(cluster: Cluster, name: str) -> None:
    """kopf's peering resources (as the chart's CRDs define them) and the peering object."""
    declare(cluster.emulator, PEERINGS, "ClusterKopfPeering", namespaced=False, verbs=PEERING_VERBS)
    declare(cluster.emulator, "kopf.dev/v1/kopfpeerings", "KopfPeering", verbs=PEERING_VERBS)
    response = cluster.request(
        "POST",
        "/apis/kopf.dev/v1/clusterkopfpeerings",
        {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": name}},
        content_type="application/json",
    )
    assert response.status_code in (200, 201), response.text


def peers(cluster: Cluster, name: str) -> dict:
    """identity → keep-alive of the live peers in the peering object."""
    obj = cluster.get(PEERINGS, None, name) or {}
    return {k: v for k, v in (obj.get("status") or {}).items() if v and v.get("lifetime", 0) > 0}


@dataclass
class Replica:
    """One operator process: its identity, priority, log and metrics endpoint."""

    identity: str
    priority: int
    log_path: pathlib.Path
    metrics_port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    def start(self, cluster: Cluster, peering: str, lifetime: int) -> Replica:
        env = {
            **os.environ,
            "KUBECONFIG": str(cluster.kubeconfig),
            "POD_ID": self.identity,
            "INFERENCE_OPERATOR_PEERING_LIFETIME": str(lifetime),
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("KUBERNETES_SERVICE_HOST", None)
        env.pop("INFERENCE_OPERATOR_PEERING_PRIORITY", None)
        self.log = self.log_path.open("w")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "inference_operator",
                "run",
                "--all-namespaces",
                f"--peering={peering}",
                f"--priority={self.priority}",
                f"--metrics-port={self.metrics_port}",
                "--metrics-address=127.0.0.1",
                f"--liveness=http://127.0.0.1:{free_port()}/healthz",
                "--verbose",
            ],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        return self

    def output(self) -> str:
        return self.log_path.read_text()

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def reconciles(self) -> float:
        """Successful runs of the InferenceService handler, from the replica's /metrics."""
        try:
            text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text
        except httpx.TransportError:
            return -1
        match = re.search(
            r'^inference_operator_reconciles_total\{handler="reconcile",result="success"\} (\S+)$', text, re.MULTILINE
        )
        return float(match.group(1)) if match else 0.0

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        finally:
            self.log.close()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
