"""The adversarial client suite against every listening port of the real processes: each attack
of testsupport/adversary.py, held against each port, must leave the port's health answered
within 1 s, its process's memory and threads bounded. A new port is one entry of `PORTS`."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inference_operator.builders import Owner, build_all
from inference_operator.builders.vllm import FRONT
from inference_operator.models import parse_spec
from testsupport import adversary
from testsupport.fake_kube_api import FakeKubeApi, activator_slice, running_api, service
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
    port, metrics_port, grpc_port = free_port(), free_port(), free_port()
    flags = ["--model-name", "tiny", "--no-watch", "--log-level", "warning", "--intra-op-threads", "1"]
    flags += ["--metrics-port", str(metrics_port), "--memory-limit-bytes", str(MEMORY_LIMIT)]
    flags += ["--grpc-port", str(grpc_port)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    log = Path(tmp_path_factory.mktemp("adversary-log")) / "server.log"
    command = serve_command(repo, port, *flags)
    with running(command, env=env, log=log, ready_url=f"http://127.0.0.1:{port}/health/ready") as process:
        yield Running(process.pid, {"http": port, "metrics": metrics_port, "grpc": grpc_port})


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


def rendered_vllm_pod() -> dict[str, Any]:
    """The pod the operator renders for a LoRA vLLM service: its front's args are what the
    suite runs."""
    spec = parse_spec(
        {
            "model": {"uri": "hf://org/tiny-llama"},
            "runtime": {"engine": "vllm", "maxModelLen": 256, "lora": {"maxLoras": 1, "maxLoraRank": 8}},
            "resources": {"gpu": {"count": 0}},
        }
    )
    objects = {obj["kind"]: obj for obj in build_all(Owner("tiny", "default", "uid-1", spec))}
    pod: dict[str, Any] = objects["Deployment"]["spec"]["template"]["spec"]
    return pod


def rendered_front_command(upstream: int, port: int) -> list[str]:
    """The front's command line as rendered, on loopback, in front of an engine at `upstream`."""
    front = next(c for c in rendered_vllm_pod()["initContainers"] if c["name"] == FRONT)
    args = [a for a in front["args"] if not a.startswith(("--upstream=", "--port="))]
    args += [f"--upstream=http://127.0.0.1:{upstream}", f"--port={port}", "--host=127.0.0.1"]
    return [sys.executable, *front["command"][1:], *args]


@pytest.fixture(scope="module")
def vllm_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """vLLM's part behind the front, on loopback: a stand-in (testsupport/stand_in_engine.py).
    The front reads every body whole before it relays it, so vLLM's own server (unbounded)
    never sees an attack: what is measured is the front."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    log = Path(tmp_path_factory.mktemp("adversary-engine")) / "engine.log"
    command = [sys.executable, "-m", "testsupport.stand_in_engine", str(port)]
    with running(command, env=env, log=log, ready_url=f"http://127.0.0.1:{port}/health"):
        yield port


@pytest.fixture(scope="module")
def vllm_front(vllm_engine: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """The vLLM pod's way in: the front, as rendered, in front of the engine on loopback."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    log = Path(tmp_path_factory.mktemp("adversary-front")) / "front.log"
    command = rendered_front_command(vllm_engine, port)
    with running(command, env=env, log=log, ready_url=f"http://127.0.0.1:{port}/health/ready") as process:
        yield Running(process.pid, {"front": port})


@pytest.fixture(scope="module")
def activator(vllm_engine: int, model_server: Running, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """The scale-to-zero activator with its shipped limits, routing a service named `adversary`
    (the Host and :authority every attack writes) to a ready engine, its gRPC calls to the model
    server's gRPC port: the uploads are read for that service."""
    adversary.raise_fd_limit()
    api = FakeKubeApi()
    api.put_service(service("adv", "adversary", "10.96.0.10", 80, grpc_port=9000))
    grpc_upstream = model_server.ports["grpc"]
    api.put_service(service("adv", "adversary-private", "127.0.0.1", vllm_engine, grpc_port=grpc_upstream))
    api.put_slice(activator_slice("adv", "adversary", {"readyPath": "/health"}))
    port, metrics_port, grpc_port = free_port(), free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    log = Path(tmp_path_factory.mktemp("adversary-activator")) / "activator.log"
    with running_api(api) as url:
        command = [sys.executable, "-m", "model_server", "activator", f"--kube-api={url}", "--host=127.0.0.1"]
        command += [f"--port={port}", f"--metrics-port={metrics_port}", f"--memory-limit-bytes={MEMORY_LIMIT}"]
        command += [f"--grpc-port={grpc_port}"]
        with running(command, env=env, log=log, ready_url=f"http://127.0.0.1:{port}/readyz") as process:
            yield Running(process.pid, {"activator": port, "metrics": metrics_port, "grpc": grpc_port})


#: Every listening port: the fixture that runs its process, and the target it makes of it.
PORTS: dict[str, tuple[str, Callable[[Running], adversary.Target]]] = {
    "model-server-http": (
        "model_server",
        lambda s: adversary.Target(
            "model server HTTP", "127.0.0.1", s.ports["http"], "/health/live", s.pid, "/v2/models/tiny/infer"
        ),
    ),
    "model-server-grpc": (
        "model_server",
        lambda s: adversary.Target(
            "model server gRPC",
            "127.0.0.1",
            s.ports["grpc"],
            "/inference.GRPCInferenceService/ServerLive",
            s.pid,
            "/inference.GRPCInferenceService/ModelInfer",
            protocol=adversary.GRPC,
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
    # vLLM's own port listens on loopback only; the front is the vLLM pod's port. Its health
    # path here is vLLM's, through the front: the whole way in must stay answerable.
    "vllm-front": (
        "vllm_front",
        lambda s: adversary.Target("vLLM front", "127.0.0.1", s.ports["front"], "/health", s.pid, "/v1/completions"),
    ),
    # Where a service's requests go while it is at zero (model_server/activator/).
    "activator": (
        "activator",
        lambda s: adversary.Target(
            "activator", "127.0.0.1", s.ports["activator"], "/healthz", s.pid, "/v1/completions"
        ),
    ),
    # The activator's gRPC port: calls of services with a gRPC port while they are at zero.
    "activator-grpc": (
        "activator",
        lambda s: adversary.Target(
            "activator gRPC",
            "127.0.0.1",
            s.ports["grpc"],
            "/inference.GRPCInferenceService/ServerLive",
            s.pid,
            "/inference.GRPCInferenceService/ModelInfer",
            protocol=adversary.GRPC,
        ),
    ),
    "activator-metrics": (
        "activator",
        lambda s: adversary.Target("activator metrics", "127.0.0.1", s.ports["metrics"], "/metrics", s.pid),
    ),
}


#: The ports that speak gRPC: held to the attacks in their HTTP/2 shape, and to large messages.
GRPC_PORTS = frozenset({"model-server-grpc", "activator-grpc"})

CASES = [
    (port, attack)
    for port in sorted(PORTS)
    for attack in adversary.attacks(adversary.GRPC if port in GRPC_PORTS else adversary.HTTP)
]


@pytest.mark.parametrize(("port", "attack"), CASES, ids=[f"{port}-{attack}" for port, attack in CASES])
def test_the_port_stays_answerable_with_bounded_memory_and_threads(
    request: pytest.FixtureRequest, port: str, attack: str
) -> None:
    fixture, make = PORTS[port]
    target = make(request.getfixturevalue(fixture))
    report = adversary.attack(target, attack)
    print(report.summary())
    assert report.problems(adversary.Bounds()) == []
