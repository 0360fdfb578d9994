"""Answers nobody reads, against a real server process on loopback: an answer's bytes are held
in the request bodies' budget until its client has drained them, a client holds at most its
share, the next large answer past it is a 503 with Retry-After while probes and other clients
are served, and a connection that leaves its answer unread is dropped, its bytes given back."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest

from bounded_http.budgets import ReadBudget
from model_server.settings import ServerSettings
from testsupport.onnx_models import affine_model
from testsupport.processes import free_port, running, serve_command
from testsupport.waiting import eventually

pytestmark = pytest.mark.slow

MEMORY_LIMIT = 256 << 20
WRITE_TIMEOUT = 2.0
ROWS = 1024
OTHER_CLIENT = "127.0.0.2"


@dataclass(frozen=True)
class Server:
    port: int
    pid: int


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server of an embedding-like model (4 inputs, 256 outputs: the answer ~100x the request)."""
    repo = tmp_path_factory.mktemp("answers") / "repo"
    weight = np.random.default_rng(0).normal(size=(4, 256)).astype(np.float32)
    affine_model(repo / "1" / "model.onnx", weight, np.zeros(256, np.float32))
    port = free_port()
    flags = ["--model-name", "m", "--no-watch", "--log-level", "warning", "--intra-op-threads", "1"]
    flags += ["--memory-limit-bytes", str(MEMORY_LIMIT), "--write-timeout", str(WRITE_TIMEOUT)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    log = tmp_path_factory.mktemp("answers-log") / "server.log"
    with running(
        serve_command(repo, port, *flags), env=env, log=log, ready_url=f"http://127.0.0.1:{port}/health/ready"
    ) as process:
        yield Server(port, process.pid)


def share() -> int:
    """One client's share of the answers' budget, from the settings the server derives it from."""
    settings = ServerSettings(model="m", memory_limit_bytes=MEMORY_LIMIT)
    return ReadBudget(max(settings.max_body_bytes, settings.parse_memory_bytes // 4)).total // 2


def infer(rows: int) -> bytes:
    values = ",".join(["0.123456"] * (4 * rows))
    body = f'{{"inputs":[{{"name":"x","datatype":"FP32","shape":[{rows},4],"data":[{values}]}}]}}'.encode()
    head = (
        f"POST /v2/models/m/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
    )
    return head.encode() + b"\r\n\r\n" + body


def unread(server: Server, request: bytes) -> tuple[socket.socket, bytes]:
    """A connection with a 4 KiB receive buffer that asks and reads only its answer's head."""
    conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    conn.settimeout(30)
    conn.connect(("127.0.0.1", server.port))
    conn.sendall(request)
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = conn.recv(1)
        assert chunk, "closed before the answer's head"
        head += chunk
    return conn, head


def whole(server: Server, request: bytes, source: str = OTHER_CLIENT) -> tuple[bytes, bytes]:
    """One request over a new connection from `source`, read to its close: head and body."""
    line, rest = request.split(b"\r\n", 1)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30, source_address=(source, 0)) as conn:
        conn.sendall(line + b"\r\nConnection: close\r\n" + rest)
        reply = b""
        while chunk := conn.recv(1 << 16):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    return head, body


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))


def test_a_client_holds_its_share_of_unread_answers_then_gets_503_while_others_are_served(server: Server) -> None:
    head, body = whole(server, infer(ROWS))
    assert head.startswith(b"HTTP/1.1 200"), head
    size = len(body)
    assert size > 64 * 1024 and size * 2 <= share(), (size, share())  # large, two fit in a share
    fitting = share() // size
    held: list[socket.socket] = []
    try:
        for _ in range(fitting):
            conn, head = unread(server, infer(ROWS))
            assert head.startswith(b"HTTP/1.1 200"), head
            held.append(conn)
        before = rss(server.pid)
        refused = []
        for _ in range(20):
            conn, head = unread(server, infer(ROWS))
            held.append(conn)
            refused.append(head)
        assert all(h.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in h.lower() for h in refused), refused
        # Twenty more unread answers were not kept: nowhere near 20 x the answer in memory.
        assert rss(server.pid) - before < 4 * size
        probe, _ = whole(server, b"GET /health/live HTTP/1.1\r\nHost: t\r\n\r\n", source="127.0.0.1")
        assert probe.startswith(b"HTTP/1.1 200"), probe
        other, other_body = whole(server, infer(ROWS))
        assert other.startswith(b"HTTP/1.1 200") and len(other_body) == size, other
    finally:
        for conn in held:
            conn.close()


def test_an_answer_left_unread_is_dropped_after_the_write_timeout_and_its_bytes_come_back(server: Server) -> None:
    held = []
    try:
        for _ in range(64):  # the client's whole share, taken
            conn, head = unread(server, infer(ROWS))
            held.append(conn)
            if not head.startswith(b"HTTP/1.1 200"):
                break
        assert head.startswith(b"HTTP/1.1 503"), head
        started = time.monotonic()

        def answered() -> bytes | None:
            conn, head = unread(server, infer(ROWS))
            held.append(conn)
            return head if head.startswith(b"HTTP/1.1 200") else None

        # The share comes back once the unread answers' connections are dropped, and never before
        # their write timeout (a lower bound: a busy machine only makes it later).
        eventually(answered, interval=0.2, what="an answer once the unread ones are dropped")
        assert time.monotonic() - started >= WRITE_TIMEOUT / 2
    finally:
        for conn in held:
            conn.close()


def answered_with(server: Server, code: int) -> int:
    """Inference requests counted under `code` by the server's own metrics."""
    _, body = whole(server, b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n", source="127.0.0.1")
    prefix = b"model_server_requests_total{"
    return sum(
        int(float(line.rsplit(b" ", 1)[1]))
        for line in body.splitlines()
        if line.startswith(prefix) and b'code="%d"' % code in line
    )


def test_an_answer_for_a_client_already_gone_is_not_made(server: Server) -> None:
    """Clients that send a request for a large answer and leave at once: the server sees them
    gone after inference and makes no answer (499), rather than encoding it for nobody."""
    before = answered_with(server, 499) + answered_with(server, 200)
    gone_before = answered_with(server, 499)
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as conn:
            conn.sendall(infer(ROWS))
    eventually(  # until the server has come to every one of them
        lambda: answered_with(server, 499) + answered_with(server, 200) >= before + 20,
        interval=0.1,
        what="every request counted",
    )
    assert answered_with(server, 499) - gone_before >= 10
