"""The front of a vLLM pod (vllm_front/server.py), run as the pod runs it, in front of a stand-in
vLLM: streams pass chunk by chunk, a client that leaves ends vLLM's request, adapter management
is refused however it is spelled, vLLM learns the real client, oversized bodies and unread
answers are cut off, and an engine that is down gets a 503 the client can retry."""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from bounded_http.proxy import READ_AHEAD, UpstreamConnection, error_body, request_headers, response_headers
from inference_operator.engines.vllm import PRE_STOP_SECONDS, pre_stop_command, pre_stop_script
from testsupport.cluster import wait_for
from testsupport.processes import free_port, running
from vllm_front.server import is_pod_local, is_refused_path

MAX_BODY = 1024 * 1024


@dataclass
class Upstream:
    """A stand-in vLLM: what reached it, and a gate its streams wait on."""

    port: int = 0
    seen: list[str] = field(default_factory=list)
    disconnects: list[str] = field(default_factory=list)
    gate: threading.Event = field(default_factory=threading.Event)
    #: What /v1/late waits on before its answer's head (a completion not streamed answers when done).
    late: threading.Event = field(default_factory=threading.Event)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        self.seen.append(path)
        if path == "/health":
            await _json(send, {"ok": True})
        elif path == "/v1/echo":
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            headers = {k.decode(): v.decode() for k, v in scope["headers"]}
            query = scope["query_string"].decode()
            digest = hashlib.sha256(body).hexdigest()
            await _json(send, {"headers": headers, "sha256": digest, "length": len(body), "query": query})
        elif path == "/v1/stream":
            await self._stream(path, receive, send)
        elif path == "/v1/big":
            await self._big(path, receive, send)
        elif path == "/v1/late":
            await self._late(path, receive, send)
        elif path == "/v1/ragged":
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
            )
            for piece in RAGGED:
                await send({"type": "http.response.body", "body": piece, "more_body": True})
                await asyncio.sleep(0.005)
            await send({"type": "http.response.body", "body": b""})
        else:
            await _json(send, {"path": path}, status=404)

    async def _stream(self, path: str, receive: Any, send: Any) -> None:
        """One event, then the rest only once the test has seen the first: a front that buffers
        the answer never shows the first. Ends early when the client goes away."""
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        gone = asyncio.ensure_future(_disconnected(receive))
        await send({"type": "http.response.body", "body": b"data: first\n\n", "more_body": True})
        while not self.gate.is_set():
            if gone.done():
                self.disconnects.append(path)
                return
            await asyncio.sleep(0.02)
        for n in range(3):
            await send({"type": "http.response.body", "body": b"data: %d\n\n" % n, "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
        gone.cancel()

    async def _late(self, path: str, receive: Any, send: Any) -> None:
        """Nothing, not even the head, until the test opens `late`; ends early when the client goes."""
        gone = asyncio.ensure_future(_disconnected(receive))
        while not self.late.is_set():
            if gone.done():
                self.disconnects.append(path)
                return
            await asyncio.sleep(0.02)
        gone.cancel()
        await _json(send, {"done": True})

    async def _big(self, path: str, receive: Any, send: Any) -> None:
        """64 MiB, a MiB at a time, for a client that reads none of it."""
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        gone = asyncio.ensure_future(_disconnected(receive))
        for _ in range(64):
            if gone.done():
                self.disconnects.append(path)
                return
            await send({"type": "http.response.body", "body": b"x" * 1024 * 1024, "more_body": True})
            await asyncio.sleep(0.05)
        await send({"type": "http.response.body", "body": b""})


#: A stream written in pieces that split its events anywhere, several in one piece too.
RAGGED = [b"da", b'ta: {"a": 1}\n', b'\ndata: {"b"', b": 2}\n\ndata: 3\n\ndata: 4\n\n", b"data: [DONE]\n\n"]


async def _disconnected(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _json(send: Any, value: object, status: int = 200) -> None:
    body = json.dumps(value).encode()
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    app = Upstream(port=free_port())
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=app.port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started or None, timeout=10, message="the stand-in vLLM to listen")
    yield app
    server.should_exit = True
    thread.join(10)


def front_command(upstream_port: int, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "model_server",
        "front",
        f"--upstream=http://127.0.0.1:{upstream_port}",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--max-body-bytes={MAX_BODY}",
        f"--memory-limit-bytes={256 * 1024 * 1024}",
        "--write-timeout=1",
        "--log-level=warning",
    ]


@pytest.fixture(scope="module")
def front(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    log = Path(tmp_path_factory.mktemp("front")) / "front.log"
    with running(
        front_command(upstream.port, port), env=env, log=log, ready_url=f"http://127.0.0.1:{port}/health/ready"
    ):
        yield f"http://127.0.0.1:{port}"


# ---------------------------------------------------------------------- pure parts


@pytest.mark.parametrize(
    "path",
    [
        "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter",
        "/V1/LOAD_LORA_ADAPTER",
        "/adapters",
        "/v1/load_%6cora_adapter",
        "/v1/load_%256cora_adapter",  # encoded twice
        "/%2525252561dapters",  # deeper than any client needs
        # vLLM's scale-out control (--enable-scale-out, with routing.router): nobody's to call.
        "/inference/v1/abort_requests",
        "/inference/v1/generate",
        "/INFERENCE/v1/generate",
        "/%69nference/v1/abort_requests",
        "/v1/abort_requests",
    ],
)
def test_adapter_management_is_refused_however_it_is_spelled(path: str) -> None:
    assert is_refused_path(path)


@pytest.mark.parametrize(
    "path",
    [
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/models",
        "/metrics",
        "/health",
        # What the router's cache-aware policy asks each replica for a prompt's tokens.
        "/v1/completions/render",
        "/v1/chat/completions/render",
        "/tokenize",
    ],
)
def test_the_openai_api_is_not_refused(path: str) -> None:
    assert not is_refused_path(path)


def test_vllm_hears_the_peer_as_the_client_and_no_hop_by_hop_header() -> None:
    scope = {
        "client": ("10.1.2.3", 5000),
        "scheme": "http",
        "headers": [
            (b"x-forwarded-for", b"127.0.0.1"),
            (b"forwarded", b"for=127.0.0.1"),
            (b"x-real-ip", b"127.0.0.1"),
            (b"connection", b"keep-alive, x-drop"),
            (b"x-drop", b"1"),
            (b"transfer-encoding", b"chunked"),
            (b"authorization", b"Bearer sk-user"),
        ],
    }
    assert request_headers(scope) == [
        (b"authorization", b"Bearer sk-user"),
        (b"x-forwarded-for", b"10.1.2.3"),
        (b"x-forwarded-proto", b"http"),
    ]
    answer = [(b"content-type", b"text/event-stream"), (b"transfer-encoding", b"chunked"), (b"date", b"x")]
    assert response_headers(answer) == [(b"content-type", b"text/event-stream")]


def test_errors_are_in_openais_shape() -> None:
    assert json.loads(error_body(503, "busy")) == {"error": {"message": "busy", "type": "server_error", "code": 503}}


class _Transport:
    """What UpstreamConnection asks of its transport, recorded."""

    def __init__(self) -> None:
        self.reading = True
        self.aborted = False

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def abort(self) -> None:
        self.aborted = True


def _chunked(events: list[bytes]) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    return head + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"


def _relayed(arrivals: list[bytes]) -> tuple[list[bytes], _Transport]:
    """What a relay reads from an upstream connection that receives `arrivals`, one read after each."""

    async def run() -> tuple[list[bytes], _Transport]:
        connection, transport = UpstreamConnection(), _Transport()
        connection.connection_made(transport)  # type: ignore[arg-type]
        pieces = []
        for data in arrivals:
            connection.data_received(data)
            while connection._pieces:
                pieces.append(await connection.read())
        assert await connection.read() == b"" and connection.reusable()
        return pieces, transport

    return asyncio.run(run())


@pytest.mark.parametrize("size", [1, 2, 7, 40, 1 << 20])
def test_a_stream_is_relayed_byte_for_byte_however_its_reads_split_it(size: int) -> None:
    events = [b'data: {"n": %d}\n\n' % n for n in range(12)] + [b"data: [DONE]\n\n"]
    answer = _chunked(events)
    pieces, _ = _relayed([answer[i : i + size] for i in range(0, len(answer), size)])
    assert b"".join(pieces) == b"".join(events)


def test_what_one_read_brings_is_relayed_as_one_piece_not_chunk_by_chunk() -> None:
    """A busy stream costs the relay a wake-up and a write per read, not per event."""
    events = [b"data: %d\n\n" % n for n in range(5)]
    pieces, _ = _relayed([_chunked(events)])
    assert pieces == [b"".join(events)]


def test_reading_from_the_engine_pauses_while_the_client_has_not_taken_what_was_read() -> None:
    async def run() -> list[bool]:
        connection, transport = UpstreamConnection(), _Transport()
        connection.connection_made(transport)  # type: ignore[arg-type]
        connection.data_received(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (READ_AHEAD * 3))
        seen = []
        connection.data_received(b"x" * READ_AHEAD)
        seen.append(transport.reading)  # at the bound: still reading
        connection.data_received(b"x")
        seen.append(transport.reading)  # beyond it: paused
        assert len(await connection.read()) == READ_AHEAD + 1
        seen.append(transport.reading)  # taken: reading again
        return seen

    assert asyncio.run(run()) == [True, False, True]


# ---------------------------------------------------------------------- the process


def test_a_stream_passes_event_by_event(front: str, upstream: Upstream) -> None:
    upstream.gate.clear()
    with httpx.Client(timeout=10) as client, client.stream("GET", f"{front}/v1/stream") as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        lines = response.iter_lines()
        assert next(lines) == "data: first"  # arrived while the rest waits on it: not buffered
        upstream.gate.set()
        rest = [line for line in lines if line]
    assert rest == ["data: 0", "data: 1", "data: 2", "data: [DONE]"]


def test_a_client_that_leaves_ends_the_engines_request(front: str, upstream: Upstream) -> None:
    upstream.gate.clear()
    before = len(upstream.disconnects)
    with httpx.Client(timeout=10) as client, client.stream("GET", f"{front}/v1/stream") as response:
        assert next(response.iter_lines()) == "data: first"
    # The client's connection is closed here; vLLM's request must end too, not run on for nobody.
    wait_for(lambda: len(upstream.disconnects) > before or None, timeout=10, message="the engine to see the client go")
    upstream.gate.set()


def test_a_client_that_leaves_before_the_answer_begins_ends_the_engines_request(front: str, upstream: Upstream) -> None:
    """A completion not streamed sends nothing until it is done: its client's leaving must end
    it too, not leave vLLM generating for nobody until then."""
    upstream.late.clear()
    before = len(upstream.disconnects)
    host, port = front.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/late HTTP/1.1\r\nHost: front\r\ncontent-length: 2\r\n\r\n{}")
        wait_for(lambda: "/v1/late" in upstream.seen or None, timeout=10, message="the engine to get the request")
    try:
        wait_for(
            lambda: len(upstream.disconnects) > before or None, timeout=10, message="the engine to see the client go"
        )
    finally:
        upstream.late.set()


def test_a_stream_arrives_byte_for_byte_wherever_the_engine_split_it(front: str) -> None:
    with httpx.Client(timeout=10) as client, client.stream("GET", f"{front}/v1/ragged") as response:
        received = b"".join(response.iter_bytes())
    assert received == b"".join(RAGGED)


def test_management_never_reaches_the_engine(front: str, upstream: Upstream) -> None:
    with httpx.Client(timeout=10) as client:
        for path in ("/v1/load_lora_adapter", "/v1/unload_%6Cora_adapter", "/adapters"):
            response = client.post(f"{front}{path}", json={"lora_name": "x", "lora_path": "/etc"})
            assert response.status_code == 403, path
            assert "spec.adapters" in response.json()["error"]["message"]
    assert not any("adapter" in path for path in upstream.seen)


def test_bodies_and_queries_arrive_whole_and_the_client_is_the_peer(front: str) -> None:
    body = os.urandom(512 * 1024)
    with httpx.Client(timeout=10) as client:
        headers = {"x-forwarded-for": "127.0.0.1", "x-custom": "kept", "content-type": "application/octet-stream"}
        response = client.post(f"{front}/v1/echo?a=1&b=%2F", content=body, headers=headers)
    echoed = response.json()
    assert echoed["sha256"] == hashlib.sha256(body).hexdigest() and echoed["length"] == len(body)
    assert echoed["query"] == "a=1&b=%2F"
    assert echoed["headers"]["x-custom"] == "kept"
    assert echoed["headers"]["x-forwarded-for"] == "127.0.0.1"  # this test's own address, not its claim
    assert echoed["headers"]["content-length"] == str(len(body))


def test_an_oversized_body_is_refused_before_the_engine_sees_it(front: str, upstream: Upstream) -> None:
    before = len(upstream.seen)
    with httpx.Client(timeout=10) as client:
        declared = client.post(f"{front}/v1/echo", content=b"x" * (MAX_BODY + 1))
        assert declared.status_code == 413 and "limit" in declared.json()["error"]["message"]
        chunked = client.post(f"{front}/v1/echo", content=iter([b"x" * 65536] * (MAX_BODY // 65536 + 2)))
        assert chunked.status_code == 413
    assert upstream.seen[before:] == []


def test_an_unread_answer_is_cut_off_and_the_engine_told(front: str, upstream: Upstream) -> None:
    """A client that reads nothing held its connection and vLLM's request for ever."""
    before = len(upstream.disconnects)
    host, port = front.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    try:
        sock.sendall(b"GET /v1/big HTTP/1.1\r\nHost: front\r\n\r\n")
        wait_for(lambda: len(upstream.disconnects) > before or None, timeout=30, message="the engine's request to end")
        sock.settimeout(10)
        received = 0
        try:  # an end of stream or a reset: either way, closed
            while chunk := sock.recv(1 << 20):
                received += len(chunk)
        except ConnectionResetError:
            pass
        assert received < 64 * 1024 * 1024
    finally:
        sock.close()


def test_an_engine_that_is_down_is_a_503_to_retry_and_the_front_is_unready(tmp_path: Path) -> None:
    port, dead = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with running(
        front_command(dead, port), env=env, log=tmp_path / "front.log", ready_url=f"http://127.0.0.1:{port}/health/live"
    ):
        with httpx.Client(timeout=10) as client:
            response = client.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "hi"})
            assert response.status_code == 503 and response.headers["retry-after"] == "1"
            assert "not answering" in response.json()["error"]["message"]
            assert client.get(f"http://127.0.0.1:{port}/health/ready").status_code == 503
            assert client.get(f"http://127.0.0.1:{port}/health/live").status_code == 200


def test_the_front_exits_cleanly_on_sigterm(upstream: Upstream, tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with running(
        front_command(upstream.port, port),
        env=env,
        log=tmp_path / "front.log",
        ready_url=f"http://127.0.0.1:{port}/health/ready",
        stop_timeout=60,  # a front that ignored the signal would be killed: returncode -9
    ) as process:
        pass
    assert process.returncode == 0


def test_many_health_checks_ask_the_engine_once_a_second(front: str, upstream: Upstream) -> None:
    """vLLM's /health is every client's probe: relayed one for one, 300 of them held it 2.4 s."""

    async def burst() -> list[int]:
        async with httpx.AsyncClient(timeout=10) as client:
            answers = await asyncio.gather(*(client.get(f"{front}/health") for _ in range(100)))
        return [a.status_code for a in answers]

    before = upstream.seen.count("/health")
    started = time.monotonic()
    assert set(asyncio.run(burst())) == {200}
    elapsed = time.monotonic() - started
    assert upstream.seen.count("/health") - before <= elapsed + 2  # once a second, and one more at most


def test_only_the_pods_own_processes_may_drain_the_front() -> None:
    assert is_pod_local({"client": ("127.0.0.1", 40000)}) and is_pod_local({"client": ("::1", 40000)})
    assert not is_pod_local({"client": ("10.244.0.7", 40000)}) and not is_pod_local({"client": None})


def test_vllms_prestop_drains_the_front_each_connection_closing_after_its_answer(
    upstream: Upstream, tmp_path: Path
) -> None:
    """vLLM's preStop hook as the operator renders it (over 3 s) drains the front in two steps.
    First every answer closes its connection: a stream under way ends whole, its connection's
    end with its last bytes (kept alive, its client's next request came here again, and raced
    the later closing), a kept-alive client's next request is answered and told to close, a new
    connection too, and a connection idle meanwhile stays open (closing it then raced clients
    sending on it: 2 of 36 streams failed on the tier). A second before the hook ends, the
    connections kept alive between requests close, but not one whose first request may be
    unread in its socket (closing it reset the client's request). Clients that keep their
    connections alive thus reconnect, to replicas that stay, while vLLM still answers."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    ready = f"http://127.0.0.1:{port}/health/ready"
    with running(front_command(upstream.port, port), env=env, log=tmp_path / "front.log", ready_url=ready):
        upstream.gate.clear()
        streaming = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        streaming.request("GET", "/v1/stream")
        stream = streaming.getresponse()
        assert stream.status == 200 and stream.readline() == b"data: first\n"
        idle, busy = (http.client.HTTPConnection("127.0.0.1", port, timeout=10) for _ in range(2))
        for connection in (idle, busy):
            connection.request("POST", "/v1/echo", body=b"{}")
            assert connection.getresponse().read() and connection.sock is not None  # kept alive

        assert pre_stop_command(port)[1:] == ["-c", pre_stop_script(port, PRE_STOP_SECONDS)]
        hook = subprocess.Popen([sys.executable, "-c", pre_stop_script(port, 3)])
        try:
            fresh = lambda: httpx.post(f"http://127.0.0.1:{port}/v1/echo", content=b"{}", timeout=10)  # noqa: E731
            wait_for(lambda: fresh().headers.get("connection") == "close", timeout=5, interval=0.05)
            upstream.gate.set()
            assert stream.read().endswith(b"data: [DONE]\n\n")  # whole
            assert streaming.sock is not None and select.select([streaming.sock], [], [], 0)[0]
            assert streaming.sock.recv(1) == b"", "the stream's connection stayed open after its answer"
            busy.request("POST", "/v1/echo", body=b"{}")
            answered = busy.getresponse()
            assert answered.status == 200 and answered.getheader("connection") == "close"
            assert idle.sock is not None
            idle.sock.settimeout(0.2)
            with pytest.raises(TimeoutError):  # still open
                idle.sock.recv(1)
            # A client connected, its request not yet read (as when endpoints still lead here).
            opened = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            opened.connect()
            assert hook.wait(10) == 0
        finally:
            hook.kill()
        idle.sock.settimeout(5)
        assert idle.sock.recv(1) == b"", "the idle connection is still open"
        opened.request("POST", "/v1/echo", body=b"{}")  # after the idle ones were closed
        first = opened.getresponse()
        assert first.status == 200 and first.getheader("connection") == "close" and first.read()


def test_a_connection_awaiting_its_request_at_sigterm_is_answered_once_not_reset(
    upstream: Upstream, tmp_path: Path
) -> None:
    """SIGTERM closes the listener and the idle connections; a connection opened just before (as
    when endpoints still lead to a stopping pod) whose request is on its way is answered, told
    to close, and the front then exits. Closed at once, its request met a reset: a stream failed
    with no byte read on the tier."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    ready = f"http://127.0.0.1:{port}/health/ready"
    with running(front_command(upstream.port, port), env=env, log=tmp_path / "front.log", ready_url=ready) as process:
        idle = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        idle.request("POST", "/v1/echo", body=b"{}")
        assert idle.getresponse().read() and idle.sock is not None  # kept alive
        opened = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        opened.connect()
        process.send_signal(signal.SIGTERM)
        idle.sock.settimeout(5)
        assert idle.sock.recv(1) == b"", "the idle connection is still open"  # the shutdown has begun
        opened.request("POST", "/v1/echo", body=b"{}")
        answer = opened.getresponse()
        assert answer.status == 200 and answer.getheader("connection") == "close" and answer.read()
        assert process.wait(10) == 0
