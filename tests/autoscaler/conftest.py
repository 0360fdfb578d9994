"""Real processes for the autoscaler tests: Prometheus, model servers, and a tiny ONNX MLP.

The emulated cluster and the operator come from the operator tests' fixtures.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
import yaml

from tests.conftest import cluster, operator  # noqa: F401  (fixtures)
from testsupport.cluster import wait_for
from testsupport.onnx_models import save_model
from testsupport.processes import free_port, running, serve_command, wait_http

PROMETHEUS = "prometheus"
SCRAPE_INTERVAL_SECONDS = 1


def prometheus_binary() -> str:
    """The Prometheus server; CI must have it (scripts/setup.sh installs it), laptops may not."""
    path = shutil.which(PROMETHEUS) or ("/usr/bin/prometheus" if os.path.exists("/usr/bin/prometheus") else None)
    if path is None:
        message = "the prometheus binary is not installed (apt-get install prometheus)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


@dataclass
class Target:
    """One scrape target and the target labels Prometheus adds to its series."""

    address: str
    labels: dict[str, str]
    path: str = "/metrics"


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen
    log: pathlib.Path
    started: float = field(default_factory=time.monotonic)

    def query(self, promql: str) -> list[dict]:
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=5)
        payload = response.json()
        assert payload["status"] == "success", payload
        return payload["data"]["result"]

    def value(self, promql: str) -> float | None:
        result = self.query(promql)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None

    def query_range(self, promql: str, start: float, end: float, step: float = 1.0) -> list[tuple[float, float]]:
        response = httpx.get(
            f"{self.url}/api/v1/query_range",
            params={"query": promql, "start": start, "end": end, "step": step},
            timeout=10,
        )
        payload = response.json()
        assert payload["status"] == "success", payload
        result = payload["data"]["result"]
        return [(float(t), float(v)) for t, v in result[0]["values"]] if result else []

    def targets_up(self) -> int:
        return int(self.value("sum(up)") or 0)


def prometheus_config(targets: list[Target]) -> dict:
    """One job per metrics path; each target keeps its own labels (namespace, pod)."""
    jobs: dict[str, list[Target]] = {}
    for target in targets:
        jobs.setdefault(target.path, []).append(target)
    return {
        "global": {
            "scrape_interval": f"{SCRAPE_INTERVAL_SECONDS}s",
            "evaluation_interval": f"{SCRAPE_INTERVAL_SECONDS}s",
            "scrape_timeout": "900ms",
        },
        "scrape_configs": [
            {
                "job_name": f"job{i}",
                "metrics_path": path,
                "static_configs": [{"targets": [t.address], "labels": t.labels} for t in group],
            }
            for i, (path, group) in enumerate(sorted(jobs.items()))
        ],
    }


@contextlib.contextmanager
def running_prometheus(tmp_path: pathlib.Path, targets: list[Target]) -> Iterator[Prometheus]:
    """The real Prometheus on a free loopback port, scraping `targets` every second."""
    binary = prometheus_binary()
    home = tmp_path / "prometheus"
    home.mkdir()
    config = home / "prometheus.yml"
    config.write_text(yaml.safe_dump(prometheus_config(targets)))
    port = free_port()
    log = home / "prometheus.log"
    url = f"http://127.0.0.1:{port}"
    command = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={home / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
        "--storage.tsdb.retention.time=1h",
    ]
    with running(command, log=log, cwd=home, ready_url=f"{url}/-/ready", timeout=30) as process:
        yield Prometheus(url=url, process=process, log=log)


@contextlib.contextmanager
def scraping_pods(
    tmp_path: pathlib.Path, address: str, pods: dict[str, tuple[str, str, object]], gauge: str, window: int
) -> Iterator[Prometheus]:
    """Real Prometheus scraping one exporter at `address` that plays every pod (path → (namespace,
    pod, …)), each target with the distinct `instance` a pod has; ready once every target is up
    and `gauge` has a full `window` of samples, so rates are no longer extrapolated."""
    targets = [
        Target(address, {"namespace": ns, "pod": pod, "instance": pod}, path) for path, (ns, pod, _) in pods.items()
    ]
    with running_prometheus(tmp_path, targets) as prom:
        wait_for(lambda: prom.targets_up() == len(pods), timeout=20, interval=0.2, message="all targets up")
        wait_for(
            lambda: (prom.value(f"min(count_over_time({gauge}[{window}s]))") or 0) >= window,
            timeout=30,
            interval=0.5,
            message="a full window",
        )
        yield prom


def tiny_mlp(path: pathlib.Path, width: int = 2048, depth: int = 10, inputs: int = 64) -> pathlib.Path:
    """An ONNX MLP that is slow on purpose (~7 ms a row on one CPU thread) but small on disk:
    all hidden layers share one weight matrix."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w_in = (rng.standard_normal((inputs, width)) / np.sqrt(inputs)).astype(np.float32)
    w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w_in"], ["h"])]
    previous = "h"
    for i in range(depth):
        nodes += [
            helper.make_node("MatMul", [previous, "w"], [f"m{i}"]),
            helper.make_node("Tanh", [f"m{i}"], [f"t{i}"]),
        ]
        previous = f"t{i}"
    nodes.append(helper.make_node("ReduceSum", [previous], ["y"], keepdims=1))
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", inputs])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])],
        [numpy_helper.from_array(w_in, "w_in"), numpy_helper.from_array(w, "w")],
    )
    return save_model(graph, path)


@dataclass
class ModelServer:
    port: int
    process: subprocess.Popen
    log: pathlib.Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@contextlib.contextmanager
def running_model_servers(
    tmp_path: pathlib.Path, model: pathlib.Path, name: str, count: int
) -> Iterator[list[ModelServer]]:
    """`count` real model-server processes on loopback, one request at a time each."""
    flags = ["--model-name", name, "--max-batch-size", "1", "--max-delay-ms", "0", "--max-queue", "256"]
    flags += ["--intra-op-threads", "1", "--providers", "CPUExecutionProvider", "--no-watch", "--log-level", "warning"]
    with contextlib.ExitStack() as stack:
        servers = []
        for i in range(count):  # all start at once, then each is waited for
            port = free_port()
            log = tmp_path / f"model-server-{i}.log"
            process = stack.enter_context(running(serve_command(model, port, *flags), log=log))
            servers.append(ModelServer(port, process, log))
        for server in servers:
            wait_http(f"http://{server.address}/health/ready", server.process, timeout=60, log=server.log)
        yield servers
