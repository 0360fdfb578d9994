"""The adversarial client suite against every listening port of the real processes: each attack
of testsupport/adversary.py, held against each port, must leave the port's health answered
within 1 s, its process's memory and threads bounded. A new port is one entry of `PORTS`."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from testsupport import adversary
from testsupport.onnx_models import affine_model
from testsupport.processes import free_port, running, serve_command

pytestmark = pytest.mark.slow

#: The model server's memory limit here: its body budgets are sized from it.
MEMORY_LIMIT = 512 * adversary.MiB


@dataclass(frozen=True)
class Running:
    pid: int
    ports: dict[str, int]


@pytest.fixture(scope="module")
def model_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """The model server with its shipped limits, and a metrics port."""
    adversary.raise_fd_limit()
    repo = tmp_path_factory.mktemp("adversary") / "repo"
    affine_model(repo / "1" / "model.onnx", np.ones((4, 3), np.float32), np.zeros(3, np.float32))
    port, metrics_port = free_port(), free_port()
    flags = ["--model-name", "tiny", "--no-watch", "--log-level", "warning", "--intra-op-threads", "1"]
    flags += ["--metrics-port", str(metrics_port), "--memory-limit-bytes", str(MEMORY_LIMIT)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    log = Path(tmp_path_factory.mktemp("adversary-log")) / "server.log"
    command = serve_command(repo, port, *flags)
    with running(command, env=env, log=log, ready_url=f"http://127.0.0.1:{port}/health/ready") as process:
        yield Running(process.pid, {"http": port, "metrics": metrics_port})


@pytest.fixture(scope="module")
def adapters_sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """A vLLM pod's adapters sidecar (model_server.adapters), its list read, vLLM not there."""
    adversary.raise_fd_limit()
    root = tmp_path_factory.mktemp("adversary-adapters")
    (root / "adapters.json").write_text('{"adapters": [{"name": "sql", "uri": "hf://org/sql"}]}')
    port = free_port()
    command = [sys.executable, "-m", "model_server.adapters", f"--desired={root / 'adapters.json'}"]
    command += [f"--dir={root / 'files'}", "--engine=http://127.0.0.1:9", "--host=127.0.0.1", f"--port={port}"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with running(command, env=env, log=root / "sidecar.log", ready_url=f"http://127.0.0.1:{port}/health/live") as p:
        yield Running(p.pid, {"adapters": port})


#: Every listening port: the fixture that runs its process, and the target it makes of it.
PORTS: dict[str, tuple[str, Callable[[Running], adversary.Target]]] = {
    "model-server-http": (
        "model_server",
        lambda s: adversary.Target(
            "model server HTTP", "127.0.0.1", s.ports["http"], "/health/live", s.pid, "/v2/models/tiny/infer"
        ),
    ),
    "model-server-metrics": (
        "model_server",
        lambda s: adversary.Target("model server metrics", "127.0.0.1", s.ports["metrics"], "/metrics", s.pid),
    ),
    "adapters-sidecar": (
        "adapters_sidecar",
        lambda s: adversary.Target("adapters sidecar", "127.0.0.1", s.ports["adapters"], "/health/live", s.pid),
    ),
}


@pytest.fixture(params=sorted(PORTS))
def target(request: pytest.FixtureRequest) -> adversary.Target:
    fixture, make = PORTS[request.param]
    return make(request.getfixturevalue(fixture))


@pytest.mark.parametrize("attack", list(adversary.ATTACKS))
def test_the_port_stays_answerable_with_bounded_memory_and_threads(target: adversary.Target, attack: str) -> None:
    report = adversary.attack(target, attack)
    print(report.summary())
    assert report.problems(adversary.Bounds()) == []
