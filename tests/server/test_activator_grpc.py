"""The activator's gRPC port (inference_activator/grpc_proxy.py) as the chart runs it, in
front of a real model server with its gRPC port, against the small API server
(testsupport/fake_kube_api.py): Triton's gRPC client, naming the service by its authority, is
held while the service is at zero, wakes it, and gets the model's own answer once the replica
(started by the test when the wake comes, as the operator would) is ready; a deadline shorter
than the wait ends the call and frees its place; over the hold limits RESOURCE_EXHAUSTED, past
the wait UNAVAILABLE."""

from __future__ import annotations

import asyncio
import collections
import os
import re
import signal
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import h2.config
import h2.connection
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from bounded_http.grpc_calls import SERVICE
from inference_activator.grpc_proxy import NotHttp2, UnreadAnswers, scan
from testsupport.fake_kube_api import FakeKubeApi, activator_slice, running_api, service
from testsupport.onnx_models import affine_model
from testsupport.processes import free_port, running, serve_command
from testsupport.waiting import eventually

T = TypeVar("T")
RNG = np.random.default_rng(11)
WEIGHT = RNG.standard_normal((4, 3)).astype(np.float32)
BIAS = RNG.standard_normal(3).astype(np.float32)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = Path(tmp_path_factory.mktemp("grpc-model")) / "repo"
    affine_model(root / "1" / "model.onnx", WEIGHT, BIAS)
    return root


@pytest.fixture(scope="module")
def api() -> Iterator[tuple[FakeKubeApi, str]]:
    fake = FakeKubeApi()
    with running_api(fake) as url:
        yield fake, url


@dataclass
class Activator:
    grpc_target: str
    metrics: str

    def client(self, authority: str) -> triton.InferenceServerClient:
        """Triton's client on the activator's gRPC port, its channel naming `authority` (as a
        client of the Service's DNS name does)."""
        return triton.InferenceServerClient(self.grpc_target, channel_args=[("grpc.default_authority", authority)])

    def metric(self, name: str, **labels: str) -> float | None:
        text = httpx.get(self.metrics, timeout=5).text
        wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in text.splitlines():
            match = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
            if match and ",".join(sorted(match.group(1).split(","))) == wanted:
                return float(match.group(2))
        return None

    def held(self, namespace: str, name: str) -> float:
        return self.metric("activator_held_requests", namespace=namespace, service=name) or 0.0


@pytest.fixture(scope="module")
def activator(api: tuple[FakeKubeApi, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Activator]:
    _, url = api
    port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    log = Path(tmp_path_factory.mktemp("activator-grpc")) / "activator.log"
    command = [
        sys.executable,
        "-m",
        "model_server",
        "activator",
        f"--kube-api={url}",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--grpc-port={grpc_port}",
        f"--metrics-port={metrics_port}",
        "--max-wait-seconds=120",
        f"--memory-limit-bytes={256 << 20}",
        "--drain-listen-seconds=0",
    ]
    with running(command, env=env, log=log, ready_url=f"http://127.0.0.1:{port}/readyz"):
        yield Activator(f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{metrics_port}/metrics")


def at_zero(api: FakeKubeApi, activator: Activator, name: str, http_port: int, grpc_port: int, **policy: Any) -> str:
    """Service `name` of team-a at zero, its replicas (none yet) to be on these loopback ports; its authority."""
    api.put_service(service("team-a", name, "10.96.0.20", 80, grpc_port=9000))
    api.put_service(service("team-a", f"{name}-private", "127.0.0.1", http_port, grpc_port=grpc_port))
    api.put_slice(activator_slice("team-a", name, {"readyPath": "/health/ready", **policy}))
    eventually(
        lambda: activator.metric("activator_held_requests", namespace="team-a", service=name) is not None,
        timeout=20,
        what=f"team-a/{name} to be routed",
    )
    return f"{name}.team-a.svc:9000"


def in_background(call: Callable[[], T]) -> Future[T]:
    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(call)
    pool.shutdown(wait=False)
    return future


def rows_input(rows: np.ndarray) -> triton.InferInput:
    tensor = triton.InferInput("x", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows)
    return tensor


def failure_of(call: Callable[[], object]) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as failure:
        call()
    return str(failure.value.status()), str(failure.value.message())


def test_a_call_at_zero_is_held_wakes_the_service_and_gets_the_models_answer(
    api: tuple[FakeKubeApi, str], activator: Activator, repo: Path, tmp_path: Path
) -> None:
    fake, _ = api
    http_port, grpc_port = free_port(), free_port()
    authority = at_zero(fake, activator, "affine", http_port, grpc_port)
    client = activator.client(authority)
    rows = RNG.standard_normal((2, 4)).astype(np.float32)
    pending = in_background(lambda: client.infer("affine", [rows_input(rows)], request_id="r-7", client_timeout=120))
    eventually(lambda: fake.patches_of("team-a", "affine"), timeout=20, what="a wake patch")
    eventually(lambda: activator.held("team-a", "affine") == 1, timeout=20, what="the call to be held")
    assert not pending.done()
    # The wake starts the replica, as the operator's scale to one does.
    command = serve_command(repo, http_port, "--model-name", "affine", "--grpc-port", str(grpc_port), "--no-watch")
    with running(command, log=tmp_path / "server.log"):
        answer = pending.result(timeout=90)
        np.testing.assert_allclose(answer.as_numpy("y"), rows @ WEIGHT + BIAS, rtol=1e-5, atol=1e-5)
        response = answer.get_response()
        assert (response.model_name, response.model_version, response.id) == ("affine", "1", "r-7")
        # The health and metadata calls go the same way, to the model server's own answers.
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("affine")
        assert client.get_model_metadata("affine", as_json=True)["platform"] == "onnxruntime_onnx"
        assert client.get_server_metadata(as_json=True)["name"] == "model-server"
        # The model server's own errors come back as it said them.
        status, message = failure_of(lambda: client.infer("other", [rows_input(rows)]))
        assert status == "StatusCode.NOT_FOUND" and "other" in message
    labels = {"namespace": "team-a", "service": "affine"}
    assert activator.metric("activator_wait_seconds_count", **labels, outcome="served") == 1
    assert activator.metric("activator_wakes_total", **labels) == 1
    assert activator.held("team-a", "affine") == 0


#: Calls held at once for the burst below: more than a replica's connection takes streams
#: (the model server's gRPC port, as many HTTP/2 servers, 100), each client connection's under it.
BURST_CONNECTIONS, BURST_CALLS = 8, 50


async def _burst(target: str, authority: str) -> list[str]:
    """BURST_CALLS ServerLive calls at once on each of BURST_CONNECTIONS connections; each
    call's outcome ("OK", or its status and message)."""
    options = [("grpc.default_authority", authority), ("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.aio.insecure_channel(target, options=options) for _ in range(BURST_CONNECTIONS)]

    async def live(channel: grpc.aio.Channel) -> str:
        try:
            await channel.unary_unary(f"/{SERVICE}/ServerLive")(b"", timeout=120)
        except grpc.aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
        return "OK"

    try:
        return await asyncio.gather(*(live(channel) for channel in channels for _ in range(BURST_CALLS)))
    finally:
        for channel in channels:
            await channel.close()


def test_calls_held_at_once_beyond_a_replicas_streams_are_all_answered_when_it_is_ready(
    api: tuple[FakeKubeApi, str], activator: Activator, repo: Path, tmp_path: Path
) -> None:
    """The held calls go on together once the replica is Ready, over one connection to it: more
    at once than the streams it takes on a connection, and none is refused for it."""
    fake, _ = api
    http_port, grpc_port = free_port(), free_port()
    authority = at_zero(fake, activator, "burst", http_port, grpc_port)
    outcomes = in_background(lambda: asyncio.run(_burst(activator.grpc_target, authority)))
    calls = BURST_CONNECTIONS * BURST_CALLS
    eventually(lambda: activator.held("team-a", "burst") == calls, timeout=60, what=f"{calls} calls to be held")
    command = serve_command(repo, http_port, "--model-name", "burst", "--grpc-port", str(grpc_port), "--no-watch")
    with running(command, log=tmp_path / "server.log"):
        failed = collections.Counter(outcome for outcome in outcomes.result(timeout=120) if outcome != "OK")
    assert not failed, f"{sum(failed.values())} of {calls} held calls not answered: {dict(failed)}"


def test_a_deadline_shorter_than_the_wait_ends_the_call_and_frees_its_place(
    api: tuple[FakeKubeApi, str], activator: Activator
) -> None:
    fake, _ = api
    authority = at_zero(fake, activator, "slow", free_port(), free_port(), maxHeld=1)
    client = activator.client(authority)
    rows = RNG.standard_normal((1, 4)).astype(np.float32)
    status, _ = failure_of(lambda: client.infer("slow", [rows_input(rows)], client_timeout=2))
    assert status == "StatusCode.DEADLINE_EXCEEDED"
    labels = {"namespace": "team-a", "service": "slow"}
    eventually(lambda: activator.metric("activator_wait_seconds_count", **labels, outcome="gone") == 1, timeout=20)
    assert activator.held("team-a", "slow") == 0
    # Its one place is free: the next call is held, not refused.
    pending = in_background(lambda: failure_of(lambda: client.infer("slow", [rows_input(rows)], client_timeout=3)))
    eventually(lambda: activator.held("team-a", "slow") == 1, timeout=20, what="the next call to be held")
    assert pending.result(timeout=30)[0] == "StatusCode.DEADLINE_EXCEEDED"


def test_over_the_hold_limit_a_call_gets_resource_exhausted(api: tuple[FakeKubeApi, str], activator: Activator) -> None:
    fake, _ = api
    authority = at_zero(fake, activator, "full", free_port(), free_port(), maxHeld=1)
    client = activator.client(authority)
    rows = RNG.standard_normal((1, 4)).astype(np.float32)
    first = in_background(lambda: failure_of(lambda: client.infer("full", [rows_input(rows)], client_timeout=8)))
    eventually(lambda: activator.held("team-a", "full") == 1, timeout=20, what="the first call to be held")
    status, message = failure_of(lambda: client.infer("full", [rows_input(rows)], client_timeout=30))
    assert status == "StatusCode.RESOURCE_EXHAUSTED" and "1 requests are already waiting" in message
    assert not first.done()
    assert first.result(timeout=60)[0] == "StatusCode.DEADLINE_EXCEEDED"


def test_past_its_wait_a_call_gets_unavailable(api: tuple[FakeKubeApi, str], activator: Activator) -> None:
    fake, _ = api
    authority = at_zero(fake, activator, "never", free_port(), free_port(), maxWaitSeconds=2)
    client = activator.client(authority)
    status, message = failure_of(lambda: client.is_server_ready(client_timeout=60))
    assert status == "StatusCode.UNAVAILABLE" and "did not become ready within 2s" in message
    labels = {"namespace": "team-a", "service": "never", "outcome": "timeout"}
    eventually(lambda: activator.metric("activator_wait_seconds_count", **labels) == 1, timeout=10)


def test_an_authority_no_service_at_zero_has_is_not_found(activator: Activator) -> None:
    client = activator.client("nobody.team-z.svc:9000")
    status, message = failure_of(lambda: client.is_server_live(client_timeout=30))
    assert status == "StatusCode.NOT_FOUND" and "nobody.team-z.svc" in message


def test_on_sigterm_a_held_call_is_answered_before_the_process_exits(
    api: tuple[FakeKubeApi, str], repo: Path, tmp_path: Path
) -> None:
    fake, url = api
    port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "model_server", "activator", f"--kube-api={url}", "--host=127.0.0.1"]
    command += [f"--port={port}", f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}"]
    command += ["--max-wait-seconds=120", "--drain-listen-seconds=0", f"--memory-limit-bytes={256 << 20}"]
    with running(
        command, env=env, log=tmp_path / "activator.log", ready_url=f"http://127.0.0.1:{port}/readyz"
    ) as process:
        draining = Activator(f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{metrics_port}/metrics")
        http_port, upstream_grpc = free_port(), free_port()
        authority = at_zero(fake, draining, "rolled", http_port, upstream_grpc)
        client = draining.client(authority)
        rows = RNG.standard_normal((1, 4)).astype(np.float32)
        pending = in_background(lambda: client.infer("rolled", [rows_input(rows)], client_timeout=120))
        eventually(lambda: draining.held("team-a", "rolled") == 1, timeout=20, what="the call to be held")
        process.send_signal(signal.SIGTERM)
        eventually(lambda: "closing the listener" in (tmp_path / "activator.log").read_text(), timeout=20)
        assert process.poll() is None and not pending.done()  # the held call keeps the process
        serve = serve_command(
            repo, http_port, "--model-name", "rolled", "--grpc-port", str(upstream_grpc), "--no-watch"
        )
        with running(serve, log=tmp_path / "server.log"):
            answer = pending.result(timeout=90)
            np.testing.assert_allclose(answer.as_numpy("y"), rows @ WEIGHT + BIAS, rtol=1e-5, atol=1e-5)
            assert process.wait(timeout=60) == 0


def _client_bytes(authority: str, fields: int = 0) -> tuple[bytes, bytes]:
    """What a gRPC client writes first: (the preface and its SETTINGS, a call's HEADERS frames)."""
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    connection.initiate_connection()
    opening = connection.data_to_send()
    headers = [(":method", "POST"), (":scheme", "http"), (":path", "/inference.GRPCInferenceService/ServerLive")]
    headers += [(":authority", authority), ("content-type", "application/grpc"), ("te", "trailers")]
    headers += [(f"x-field-{n}", "v" * 64) for n in range(fields)]
    connection.send_headers(1, headers)
    return opening, connection.data_to_send()


def test_the_authority_is_read_from_the_first_header_block_and_nothing_is_held_before_it() -> None:
    opening, call = _client_bytes("llm.team-a.svc:9000")
    assert scan(opening[:10], False, 65536) == (0, None)  # part of the preface: nothing goes on yet
    assert scan(opening, False, 65536) == (len(opening), None)  # the preface and SETTINGS go on
    assert scan(call[:-1], True, 65536) == (0, None)  # the block is kept until it is whole
    assert scan(opening + call, False, 65536) == (len(opening + call), "llm.team-a.svc:9000")
    with pytest.raises(NotHttp2, match="preface"):
        scan(b"GET / HTTP/1.1\r\nHost: llm\r\n\r\n", False, 65536)
    _, large = _client_bytes("llm", fields=200)
    with pytest.raises(NotHttp2, match="metadata limit"):
        scan(large, True, 4096)


def test_answers_not_yet_read_are_held_within_the_budget_and_a_connections_share() -> None:
    """What a client that never opens its window leaves in the activator: counted until the
    call is done, a connection at most a quarter, all of them at most the budget."""
    unread = UnreadAnswers(total=100, shares=4)
    first = unread.hold("ipv4:127.0.0.1:1", 20)
    assert first is not None
    assert unread.hold("ipv4:127.0.0.1:1", 10) is None  # 30 > its share of 25
    others = [unread.hold(f"ipv4:127.0.0.1:{port}", 25) for port in (2, 3, 4)]
    assert all(release is not None for release in others) and unread.in_use == 95
    assert unread.hold("ipv4:127.0.0.1:5", 10) is None  # past the budget, whoever asks
    first(None)
    assert unread.hold("ipv4:127.0.0.1:5", 10) is not None and unread.held["ipv4:127.0.0.1:5"] == 10
    assert "ipv4:127.0.0.1:1" not in unread.held
