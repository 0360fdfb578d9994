"""The adversarial client suite against every listening port of the real processes: each attack
of testsupport/adversary.py, held against each port, must leave the port's health answered as
its pod's liveness probe asks (never failureThreshold checks in a row over timeoutSeconds: the
kubelet would restart it), another client's ordinary request served, its process's memory under
its limit and its threads bounded. The probes are read from what the operator and the chart
render. A new port is one entry of `PORTS`."""

from __future__ import annotations

import dataclasses
import http.server
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton
from kubernetes.utils import parse_quantity

from inference_operator.builders import Owner, build_all
from inference_operator.builders.adapters import SIDECAR
from inference_operator.engines.vllm import CONTAINER, FRONT
from inference_operator.models import parse_spec
from tests.chart import helm
from testsupport import adversary, adversary_h2
from testsupport.fake_kube_api import FakeKubeApi, activator_slice, running_api, service
from testsupport.onnx_models import affine_model
from testsupport.processes import free_port, running, serve_command
from testsupport.router import RouterNotInstalled, router_executable, running_router
from testsupport.stand_in_engine import ANSWER_PATH

pytestmark = pytest.mark.slow

#: The model server's and the activator's memory limit here: their budgets are sized from it.
MEMORY_LIMIT = 512 * adversary.MiB
#: The served model: embedding-like, y = x[N,4] @ W[4,256], its answer ~85x its request.
OUTPUTS = 256
ANSWER_ROWS = 4096


def infer_request(rows: int) -> bytes:
    """A KServe v2 inference request for `rows` rows of the served model."""
    values = ",".join(["0.123456"] * (4 * rows))
    body = f'{{"inputs":[{{"name":"x","datatype":"FP32","shape":[{rows},4],"data":[{values}]}}]}}'.encode()
    return adversary.request("POST", "/v2/models/tiny/infer", body, Content_Type="application/json")


def completion_request(path: str, prompt: str) -> bytes:
    body = b'{"model":"tiny","prompt":"' + prompt.encode() + b'","max_tokens":1}'
    return adversary.request("POST", path, body, Content_Type="application/json")


@dataclass(frozen=True)
class Running:
    pid: int
    ports: dict[str, int]


@pytest.fixture(scope="module")
def model_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """The model server with its shipped limits, and a metrics port. Its model's answers are 64
    times its requests (x[N, 4] @ W[4, 256]), for the attacks that leave answers unread."""
    yield from running_model_server(tmp_path_factory)


@pytest.fixture
def fresh_model_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """The same, started for one test: what it measures against the memory limit is its own
    attack's, not what the module's earlier attacks left in the allocator."""
    yield from running_model_server(tmp_path_factory)


def running_model_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    adversary.raise_fd_limit()
    repo = tmp_path_factory.mktemp("adversary") / "repo"
    affine_model(repo / "1" / "model.onnx", np.ones((4, OUTPUTS), np.float32), np.zeros(OUTPUTS, np.float32))
    port, metrics_port, grpc_port = free_port(), free_port(), free_port()
    flags = ["--model-name", "tiny", "--no-watch", "--log-level", "warning", "--intra-op-threads", "1"]
    flags += ["--metrics-port", str(metrics_port), "--memory-limit-bytes", str(MEMORY_LIMIT)]
    flags += ["--grpc-port", str(grpc_port)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    log = Path(tmp_path_factory.mktemp("adversary-log")) / "server.log"
    command = serve_command(repo, port, *flags)
    with running(command, env=env, log=log, ready_url=f"http://127.0.0.1:{port}/health/ready") as process:
        # Its pools (parse, inference) start on first use: started here, they are not the attack's threads.
        target = adversary.Target("model server HTTP", "127.0.0.1", port, "/health/live", process.pid)
        for _ in range(3):
            assert adversary.exchange(target, infer_request(ANSWER_ROWS), timeout=30) == "200"
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


def rendered_pod(spec: dict[str, Any]) -> dict[str, Any]:
    objects = {obj["kind"]: obj for obj in build_all(Owner("tiny", "default", "uid-1", parse_spec(spec)))}
    pod: dict[str, Any] = objects["Deployment"]["spec"]["template"]["spec"]
    return pod


def rendered_vllm_pod() -> dict[str, Any]:
    """The pod the operator renders for a LoRA vLLM service: its front's args are what the
    suite runs."""
    return rendered_pod(
        {
            "model": {"uri": "hf://org/tiny-llama"},
            "runtime": {"engine": "vllm", "maxModelLen": 256, "lora": {"maxLoras": 1, "maxLoraRank": 8}},
            "resources": {"gpu": {"count": 0}},
        }
    )


def liveness(pod: dict[str, Any], container: str | None = None) -> adversary.Probe:
    """The probe that judges `container` in a rendered pod (the first container without a name):
    its liveness probe (the kubelet restarts it), or, a container without one (the adapters
    sidecar), its readiness probe (the kubelet takes the pod out of its Service)."""
    containers = pod["containers"] + pod.get("initContainers", [])
    chosen = containers[0] if container is None else next(c for c in containers if c["name"] == container)
    return adversary.Probe.of(chosen.get("livenessProbe") or chosen["readinessProbe"])


def model_server_probe() -> adversary.Probe:
    return liveness(rendered_pod({"model": {"uri": "pvc://models/tiny"}, "resources": {"gpu": {"count": 0}}}))


def activator_probe() -> adversary.Probe:
    """The activator's liveness probe, as the chart renders it."""
    if not helm.available():
        pytest.skip("Helm is not installed: the activator's probe is the chart's")
    deployment = next(
        o for o in helm.render({}) if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-activator")
    )
    return liveness(deployment["spec"]["template"]["spec"], "activator")


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


def rendered_router() -> dict[str, Any]:
    """The router's pod the operator renders for a vLLM service with routing.router."""
    spec = {"model": {"uri": "hf://org/tiny-llama"}, "runtime": {"engine": "vllm"}, "routing": {"router": {}}}
    objects = build_all(Owner("tiny", "default", "uid-1", parse_spec({**spec, "resources": {"gpu": {"count": 0}}})))
    deployment = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "tiny-router")
    pod: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return pod


def router_memory_limit() -> int:
    (container,) = rendered_router()["containers"]
    return int(parse_quantity(container["resources"]["limits"]["memory"]))


@pytest.fixture(scope="module")
def router(vllm_engine: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """The vLLM project's router (its real binary, scripts/setup-router.sh's venv) from its
    rendered command line, in front of the stand-in engine (its discovery replaced by the
    engine's URL: testsupport/router.py). Its upstream in a pod is the vLLM front, whose own
    bounds are the "vllm-front" port's: here the router's are measured."""
    try:
        router_executable()
    except RouterNotInstalled as missing:
        pytest.skip(str(missing))
    adversary.raise_fd_limit()
    (container,) = rendered_router()["containers"]
    port, metrics_port = free_port(), free_port()
    workers = [f"http://127.0.0.1:{vllm_engine}"]
    workdir = tmp_path_factory.mktemp("adversary-router")
    with running_router(container, workers, port, metrics_port, workdir) as process:
        yield Running(process.pid, {"router": port, "metrics": metrics_port})


#: Every listening port: the fixture that runs its process, and the target it makes of it.
PORTS: dict[str, tuple[str, Callable[[Running], adversary.Target]]] = {
    "model-server-http": (
        "model_server",
        lambda s: adversary.Target(
            "model server HTTP",
            "127.0.0.1",
            s.ports["http"],
            "/health/live",
            s.pid,
            "/v2/models/tiny/infer",
            answer_request=infer_request(ANSWER_ROWS),
            ordinary_request=infer_request(1),
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
        lambda s: adversary.Target(
            "adapters sidecar",
            "127.0.0.1",
            s.ports["adapters"],
            "/health/live",
            s.pid,
            answer_request=adversary.request("GET", "/adapters"),
            ordinary_request=adversary.request("GET", "/adapters"),
        ),
    ),
    # vLLM's own port listens on loopback only; the front is the vLLM pod's port. Its health
    # path here is vLLM's, through the front: the whole way in must stay answerable.
    "vllm-front": (
        "vllm_front",
        lambda s: adversary.Target(
            "vLLM front",
            "127.0.0.1",
            s.ports["front"],
            "/health",
            s.pid,
            "/v1/completions",
            answer_request=completion_request(ANSWER_PATH, "x" * 20_000),
            ordinary_request=completion_request("/v1/completions", "hello"),
        ),
    ),
    # Where a service's requests go while it is at zero (inference_activator/).
    "activator": (
        "activator",
        lambda s: adversary.Target(
            "activator",
            "127.0.0.1",
            s.ports["activator"],
            "/healthz",
            s.pid,
            "/v1/completions",
            answer_request=completion_request(ANSWER_PATH, "x" * 20_000),
            ordinary_request=completion_request("/v1/completions", "hello"),
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
    # routing.router: the service's way in (NAME-router), and its metrics port.
    "router": (
        "router",
        lambda s: adversary.Target(
            "router",
            "127.0.0.1",
            s.ports["router"],
            "/liveness",
            s.pid,
            "/v1/completions",
            answer_request=completion_request(ANSWER_PATH, "x" * 20_000),
            ordinary_request=completion_request("/v1/completions", "hello"),
        ),
    ),
    "router-metrics": (
        "router",
        lambda s: adversary.Target("router metrics", "127.0.0.1", s.ports["metrics"], "/metrics", s.pid),
    ),
}


#: The ports that speak gRPC: held to the attacks in their HTTP/2 shape, and to large messages.
GRPC_PORTS = frozenset({"model-server-grpc", "activator-grpc"})

#: What each port's process is judged by: the liveness probe of its container, as rendered
#: (the model server's HTTP, gRPC and metrics ports are one process with one probe; the vLLM
#: front's health path is vLLM's own, so the vLLM container's probe), and its memory limit.
PROBES: dict[str, Callable[[], adversary.Probe]] = {
    "model-server-http": model_server_probe,
    "model-server-grpc": model_server_probe,
    "model-server-metrics": model_server_probe,
    "adapters-sidecar": lambda: liveness(rendered_vllm_pod(), SIDECAR),
    "vllm-front": lambda: liveness(rendered_vllm_pod(), CONTAINER),
    "activator": activator_probe,
    "activator-grpc": activator_probe,
    "activator-metrics": activator_probe,
    "router": lambda: liveness(rendered_router(), "router"),
    "router-metrics": lambda: liveness(rendered_router(), "router"),
}
MEMORY_LIMITS: dict[str, int | None] = {
    "model-server-http": MEMORY_LIMIT,
    "model-server-grpc": MEMORY_LIMIT,
    "model-server-metrics": MEMORY_LIMIT,
    "activator": MEMORY_LIMIT,
    "activator-grpc": MEMORY_LIMIT,
    "activator-metrics": MEMORY_LIMIT,
    "router": router_memory_limit(),
    "router-metrics": router_memory_limit(),
}

CASES = [
    (port, attack)
    for port in sorted(PORTS)
    for attack in adversary.attacks(adversary.GRPC if port in GRPC_PORTS else adversary.HTTP)
]


#: Known open: the router (vllm-router 0.1.17) takes no connection limit and reads each body
#: whole under --max-payload-size with no budget across connections: no flag bounds either. Its
#: HTTP port is the service's way in.
OPEN = {
    ("router", "stalled uploads"): "router: memory grows with stalled uploads (connections x bytes sent, no budget)",
}
#: Known open, threads only (the other bounds hold and are checked): the router's metrics
#: listener answers on tokio's blocking pool, which starts a thread for each scrape that waits
#: (2 tokio workers to 14 under 1,000 stalled uploads, to 54 under 200 pipelined connections).
#: Its metrics port is reachable only from the operator's pods and Prometheus's namespaces.
OPEN_THREADS = {"router-metrics": "router metrics: tokio's blocking pool grows with busy connections"}


@pytest.mark.parametrize(
    ("port", "attack"),
    [pytest.param(p, a, marks=pytest.mark.skip(reason=OPEN[p, a])) if (p, a) in OPEN else (p, a) for p, a in CASES],
    ids=[f"{port}-{attack}" for port, attack in CASES],
)
def test_the_port_stays_answerable_with_bounded_memory_and_threads(
    request: pytest.FixtureRequest, port: str, attack: str
) -> None:
    fixture, make = PORTS[port]
    probe = PROBES[port]()
    target = make(request.getfixturevalue(fixture))
    report = adversary.attack(target, attack, probe)
    print(report.summary())
    bounds = adversary.Bounds(probe, rss_limit_bytes=MEMORY_LIMITS.get(port), another_client=port not in GRPC_PORTS)
    if port in OPEN_THREADS:
        bounds = dataclasses.replace(bounds, extra_threads=sys.maxsize)
        print(f"threads not judged: {OPEN_THREADS[port]}")
    assert report.problems(bounds) == []


@pytest.mark.parametrize("attack", ["zero window", "never reading"])
def test_grpc_answers_nobody_reads_leave_room_for_another_clients_call(
    fresh_model_server: Running, attack: str
) -> None:
    """While the attack's connections hold answers they never read, another client's ModelInfer
    and ServerLive are answered, and the server stays under its memory limit."""
    port = fresh_model_server.ports["grpc"]
    target = PORTS["model-server-grpc"][1](fresh_model_server)
    run, scale = adversary_h2.ATTACKS[attack]
    client = triton.InferenceServerClient(f"127.0.0.1:{port}")
    rows = triton.InferInput("x", [2, 4], "FP32")
    rows.set_data_from_numpy(np.ones((2, 4), np.float32))
    answers, lives, peak = [], [], 0
    held = run(target, scale)
    try:
        for _ in range(5):  # through the attack's answers being made, refused and held
            answers.append(client.infer("tiny", [rows], client_timeout=10).as_numpy("y"))
            lives.append(client.is_server_live(client_timeout=10))
            peak = max(peak, adversary.process_status(fresh_model_server.pid)[0])
            time.sleep(0.3)
    finally:
        for connection in held:
            connection.close()
    for answer in answers:
        np.testing.assert_array_equal(answer, np.full((2, 256), 4, np.float32))
    assert all(lives)
    assert peak < MEMORY_LIMIT, f"resident memory {peak / adversary.MiB:.0f} MiB, over the limit"


def test_every_port_is_judged_by_its_rendered_probe() -> None:
    """One source of truth: a port without a probe would be judged by nothing."""
    assert set(PROBES) == set(PORTS)
    for port, probe in PROBES.items():
        judged = probe()
        assert judged.timeout_s >= 1 and judged.failure_threshold >= 1, port


def test_the_kubelet_counts_consecutive_failures_only() -> None:
    """Slow checks apart are no restart; failureThreshold slow ones in a row are."""
    probe = adversary.Probe(timeout_s=3, failure_threshold=3)
    report = adversary.Report("t", "a", health=[0.1, 4.0, None, 0.2, 3.5, 0.1, None, 0.1], served_checks=1)
    assert report.failures_in_a_row(probe) == 2
    assert report.problems(adversary.Bounds(probe)) == []
    report.health += [None, 3.1, 9.0]
    assert report.failures_in_a_row(probe) == 3
    assert "the kubelet restarts after 3" in " ".join(report.problems(adversary.Bounds(probe)))


def test_another_client_asks_again_after_a_503_with_retry_after_and_only_a_second_refusal_counts() -> None:
    """Overload answered as overload (503, Retry-After: 1) is what an ordinary client is told to
    retry: it does, once, and is served; a port that refuses the retry as well is reported."""
    answers: list[bytes] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            status, extra = (503, [("Retry-After", "1")]) if answers.pop(0) == b"503" else (200, [])
            self.send_response(status)
            for name, value in [*extra, ("Content-Length", "0")]:
                self.send_header(name, value)
            self.end_headers()

        def log_message(self, *_: object) -> None:
            return

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        target = adversary.Target("stub", "127.0.0.1", server.server_address[1], "/", os.getpid())
        for script, failures, retried in [([b"503", b"200"], [], 1), ([b"503", b"503"], ["503"], 1), ([b"200"], [], 0)]:
            answers[:] = script
            report = adversary.Report("stub", "none")
            adversary._Watcher(target, report, timeout=5, served_timeout=5).serve()
            assert (report.served_failures, report.served_after_retry, report.served_checks) == (failures, retried, 1)
            assert answers == []
        server.shutdown()
