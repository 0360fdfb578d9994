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
from inference_operator.builders.adapters import PLUGINS_DIR
from inference_operator.models import parse_spec
from model_server.adapters import install_guard
from tests.llm.conftest import running_vllm, tiny_llama  # noqa: F401  (tiny_llama is a fixture)
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
    port, metrics_port, grpc_port = free_port(), free_port(), free_port()
    flags = ["--model-name", "tiny", "--no-watch", "--log-level", "warning", "--intra-op-threads", "1"]
    flags += ["--metrics-port", str(metrics_port), "--memory-limit-bytes", str(MEMORY_LIMIT)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    log = Path(tmp_path_factory.mktemp("adversary-log")) / "server.log"
    flags += ["--grpc-port", str(grpc_port)]
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


#: Where the rendered vLLM container expects its model.
VLLM_MODEL_MOUNT = "/mnt/models"


def rendered_vllm_container() -> dict[str, Any]:
    """The vLLM container the operator renders for a LoRA service (the guard loaded): its args
    and env (the 75 s keep-alive among them) are what the suite runs."""
    spec = parse_spec(
        {
            "model": {"uri": "hf://org/tiny-llama"},
            "runtime": {"engine": "vllm", "maxModelLen": 256, "lora": {"maxLoras": 1, "maxLoraRank": 8}},
            "resources": {"gpu": {"count": 0}},
        }
    )
    objects = {obj["kind"]: obj for obj in build_all(Owner("tiny", "default", "uid-1", spec))}
    container: dict[str, Any] = objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    return container


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory, tiny_llama: Path) -> Iterator[Running]:  # noqa: F811
    """vLLM's API server (the CPU build) from the rendered container, its guard middleware in
    place as the adapters sidecar puts it; the API server's pid (the engine is a child)."""
    adversary.raise_fd_limit()
    workdir = tmp_path_factory.mktemp("adversary-vllm")
    plugins = workdir / "plugins"
    install_guard(plugins)
    port = free_port()
    volumes = {PLUGINS_DIR: plugins}
    with running_vllm(rendered_vllm_container(), tiny_llama, VLLM_MODEL_MOUNT, port, workdir, volumes=volumes) as p:
        yield Running(p.pid, {"vllm": port})


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
    "vllm-api": (
        "vllm_server",
        lambda s: adversary.Target("vLLM API", "127.0.0.1", s.ports["vllm"], "/health", s.pid, "/v1/completions"),
    ),
}


#: Attacks a port's own server gives no way to bound, left out for that port only, and why.
NOT_BOUNDABLE: dict[str, dict[str, str]] = {
    "vllm-api": {
        # vLLM 0.32 serves with uvicorn's httptools protocol (httptools comes with its
        # fastapi[standard]), which never reads --h11-max-incomplete-event-size or
        # --h11-max-header-count (rendered at 16 KiB and 100 fields, the bound did not move);
        # it caps neither connections (no limit_concurrency) nor header fields: 300 connections,
        # each a never-ended head of 10,000 fields, grew the API server 219-347 MiB and held
        # /health up to 1.03 s.
        "huge headers": "vLLM keeps every header field of every open connection",
        # FastAPI reads a JSON body whole before the handler runs, and vLLM bounds neither body
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
        # sizes nor connections: 1,000 uploads stalled after 300 KiB grew it 303-349 MiB.
        "stalled uploads": "vLLM buffers every open upload's body whole",
    },
}

CASES = [
    (port, attack)
    for port in sorted(PORTS)
    for attack in adversary.ATTACKS
    if attack not in NOT_BOUNDABLE.get(port, {})
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
