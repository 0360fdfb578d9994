"""Connection limits of a real server process, with real sockets on loopback: slow or
silent clients are dropped after the header or body timeout, header bytes and open
connections are capped, and well-behaved clients keep being served meanwhile."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from testsupport.onnx_models import affine_model
from testsupport.processes import free_port, running, serve_command
from testsupport.waiting import DEFAULT_TIMEOUT_S, eventually

pytestmark = pytest.mark.slow

HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 1.5
MAX_CONNECTIONS = 40
MAX_HEADER_BYTES = 4096
KEEP_ALIVE = 3


class Server:
    def __init__(self, port: int, pid: int) -> None:
        self.port = port
        self.pid = pid
        self.url = f"http://127.0.0.1:{port}"

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("connections") / "repo"
    affine_model(repo / "1" / "model.onnx", np.ones((4, 3), np.float32), np.zeros(3, np.float32))
    port = free_port()
    flags = ["--model-name", "tiny", "--no-watch", "--log-level", "warning", "--intra-op-threads", "1"]
    flags += ["--header-timeout", str(HEADER_TIMEOUT), "--body-timeout", str(BODY_TIMEOUT)]
    flags += ["--max-connections", str(MAX_CONNECTIONS), "--max-header-bytes", str(MAX_HEADER_BYTES)]
    flags += ["--keep-alive-timeout", str(KEEP_ALIVE)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    url = f"http://127.0.0.1:{port}/health/ready"
    with running(serve_command(repo, port, *flags), env=env, ready_url=url) as process:
        yield Server(port, process.pid)


def read_until_closed(conn: socket.socket, limit: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes (or `limit` s pass), and when it closed."""
    started = time.monotonic()
    conn.settimeout(0.2)
    data = b""
    while time.monotonic() - started < limit:
        try:
            chunk = conn.recv(4096)
        except TimeoutError:
            continue
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return data, time.monotonic() - started


def live(server: Server) -> bool:
    return httpx.get(f"{server.url}/health/live", timeout=5).status_code == 200


#: Past this a connection the server should have closed is not late but kept open: far longer
#: than any of its timeouts, so that a busy machine is never the reason.
CLOSED_WITHIN = DEFAULT_TIMEOUT_S


def test_silent_connection_is_closed_after_the_header_timeout(server):
    """Closed by the server with the header timeout's 408 (the keep-alive timeout, the other that
    could close it, says nothing)."""
    with server.connect() as conn:
        reply, took = read_until_closed(conn, limit=CLOSED_WITHIN)
    assert took < CLOSED_WITHIN, "the server kept a silent connection open"
    assert reply.startswith(b"HTTP/1.1 408")


def test_slowloris_headers_are_cut_off_at_the_header_timeout(server):
    """Headers dribbled a few bytes at a time, each well within any idle timeout: each connection
    is cut off before its head is whole (it takes the dribble some 50 header timeouts to send)."""
    request = b"GET /health/live HTTP/1.1\r\nHost: test\r\n" + b"X-Padding: y\r\n" * 200
    conns = [server.connect() for _ in range(10)]
    closed_at: dict[int, int] = {}  # by connection: how many bytes of its head had been sent
    try:
        sent = 0
        while len(closed_at) < len(conns) and sent < len(request):
            for index, conn in enumerate(conns):
                if index in closed_at:
                    continue
                try:
                    conn.sendall(request[sent : sent + 3])
                except OSError:  # reset: the server has closed it
                    closed_at[index] = sent
            sent += 3
            time.sleep(0.05)
            for index, conn in enumerate(conns):
                if index not in closed_at:
                    conn.settimeout(0.001)
                    with contextlib.suppress(TimeoutError, BlockingIOError):
                        conn.recv(4096)  # the 408, or the close
                        closed_at[index] = sent
    finally:
        for conn in conns:
            conn.close()
    print(f"slow clients dropped after {max(closed_at.values(), default=0)} of {len(request)} bytes of their head")
    assert len(closed_at) == len(conns), "slow clients still connected"
    assert max(closed_at.values()) < len(request), "a slow client's head was whole before it was cut off"
    assert live(server)


def test_slow_body_is_cut_off_at_the_body_timeout_with_408(server):
    with server.connect() as conn:
        conn.sendall(
            b"POST /infer HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n" + b'{"data": ['
        )
        reply, took = read_until_closed(conn, limit=CLOSED_WITHIN)
    assert took < CLOSED_WITHIN, "the server kept a stalled body's connection open"
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b"body not received" in reply  # the body timeout's own answer
    assert live(server)


def test_endless_headers_are_refused_with_431(server):
    with server.connect() as conn:
        conn.sendall(b"GET /health/live HTTP/1.1\r\nHost: test\r\n")
        with contextlib.suppress(OSError):
            for _ in range(2 * MAX_HEADER_BYTES // 1024):
                conn.sendall(b"X-Long: " + b"a" * 1014 + b"\r\n")
        reply, _ = read_until_closed(conn, limit=5)
    assert reply.startswith(b"HTTP/1.1 431"), reply[:200]


def test_connections_beyond_the_cap_are_closed_at_once_and_fds_stay_bounded(server):
    baseline = server.open_fds()
    conns = [server.connect() for _ in range(3 * MAX_CONNECTIONS)]
    try:
        time.sleep(0.3)
        held = server.open_fds() - baseline
        refused = 0
        for conn in conns:
            conn.settimeout(0.5)
            with contextlib.suppress(TimeoutError):
                if conn.recv(4096).startswith(b"HTTP/1.1 503"):
                    refused += 1
        # Once the half-open ones time out, a new client is served again.
        eventually(
            lambda: server.open_fds() <= baseline + 2,
            timeout=max(DEFAULT_TIMEOUT_S, 10 * HEADER_TIMEOUT),
            interval=0.1,
            what="the half-open connections closed by their header timeout",
        )
        after = server.open_fds() - baseline
    finally:
        for conn in conns:
            conn.close()
    print(f"{len(conns)} connections: server held {held} more fds, {refused} refused with 503, {after} left after")
    assert held <= MAX_CONNECTIONS + 2
    assert refused >= len(conns) - MAX_CONNECTIONS - 2
    assert after <= 2
    assert live(server)


def test_keep_alive_clients_are_served_across_requests(server):
    with httpx.Client(base_url=server.url) as client:
        first = client.post("/infer", json={"data": [1, 2, 3, 4]})
        time.sleep(HEADER_TIMEOUT / 2)
        second = client.post("/infer", json={"data": [1, 2, 3, 4]})
    assert first.status_code == second.status_code == 200
    assert first.json()["result"] == second.json()["result"] == [10.0, 10.0, 10.0]


def test_an_idle_kept_alive_connection_stays_open_for_the_keep_alive_timeout(server):
    """uvicorn's own 5 s closed connections that clients still meant to use: a client sending its
    next request as the server closed got a reset (a load test lost one request of 1,500).
    The server now keeps them for --keep-alive-timeout (75 s by default, longer than the
    proxies in front of it keep theirs)."""
    with server.connect() as conn:
        conn.sendall(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        reply = conn.recv(4096)
        assert reply.startswith(b"HTTP/1.1 200")
        _, idle = read_until_closed(conn, limit=CLOSED_WITHIN)
    # Never before its keep-alive timeout (a load can only make it later), and closed at all.
    assert KEEP_ALIVE - 0.5 < idle < CLOSED_WITHIN, idle


@pytest.mark.parametrize("path", ["/infer", "/v2/models/m/infer"])
def test_a_client_gone_mid_body_is_a_499_and_no_error_in_the_log(tmp_path, path):
    """It was logged as ERROR with a traceback (fast path) and counted as code="500", which
    feeds the chart's 5xx alert."""
    import socket
    import time

    import httpx
    import numpy as np

    from testsupport.onnx_models import affine_model
    from testsupport.processes import free_port, running, serve_command

    model = affine_model(tmp_path / "repo" / "1" / "model.onnx", np.ones((4, 3), np.float32), np.zeros(3, np.float32))
    port = free_port()
    log = tmp_path / "server.log"
    command = serve_command(model.parent.parent, port, "--model-name", "m", "--providers", "CPUExecutionProvider")
    with running(command, log=log, ready_url=f"http://127.0.0.1:{port}/health/ready"):
        for declared in (1_000, 300_000):  # read inline, and through the body budget
            conn = socket.create_connection(("127.0.0.1", port))
            conn.sendall(
                f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {declared}\r\n\r\n".encode()
                + b'{"data": [1, 2'
            )
            time.sleep(0.3)
            conn.close()
        time.sleep(0.5)
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    counted = [line for line in metrics.splitlines() if line.startswith("model_server_requests_total{")]
    assert any('code="499"' in line and line.endswith(" 2.0") for line in counted), counted
    assert not any('code="500"' in line and not line.endswith(" 0.0") for line in counted), counted
    text = log.read_text()
    assert "Traceback" not in text and "ERROR" not in text, text[-2000:]


def test_oversized_headers_completed_by_a_later_read_are_refused_with_431(server):
    """100 KiB of headers sent in two writes got a 200: the read that completed them was not counted."""
    lines = [b"X-Big-%d: " % i + b"a" * 10_240 + b"\r\n" for i in range(10)]
    with server.connect() as conn:
        conn.sendall(b"GET /health/live HTTP/1.1\r\nHost: test\r\n" + b"".join(lines[:6]))
        time.sleep(0.2)
        with contextlib.suppress(OSError):
            conn.sendall(b"".join(lines[6:]) + b"\r\n")
        reply, _ = read_until_closed(conn, limit=5)
    assert reply.startswith(b"HTTP/1.1 431"), reply[:200]
    assert live(server)


@pytest.mark.parametrize(("fields", "status"), [(90, b"200"), (150, b"431")])
def test_header_fields_are_capped(server, fields: int, status: bytes):
    """1,000 connections of 60 KB of tiny headers took the server from 95 MiB to 1 GiB: every
    field is a pair of objects. Past 100 fields a request is refused before any is made."""
    head = b"GET /health/live HTTP/1.1\r\nHost: test\r\n" + b"".join(b"a%d: b\r\n" % i for i in range(fields))
    with server.connect() as conn:
        conn.sendall(head + b"Connection: close\r\n\r\n")
        reply, _ = read_until_closed(conn, limit=5)
    assert reply.startswith(b"HTTP/1.1 " + status), reply[:200]


@pytest.mark.parametrize("complete", [True, False])
def test_a_kept_alive_connections_second_request_has_the_same_header_limits(server, complete: bool):
    """A first request and the head of a second in one write: the bytes after the first head were
    never counted, so the second request's 5,000 fields were parsed into objects (300 connections
    of 10,000 took the server from 97 to 294 MiB) and, once complete, served. Every request of a
    connection is now refused past the limits."""
    second = b"GET /health/live HTTP/1.1\r\nHost: test\r\n" + b"a: b\r\n" * 5_000 + (b"\r\n" if complete else b"")
    with server.connect() as conn:
        conn.sendall(b"GET /health/live HTTP/1.1\r\nHost: test\r\n\r\n" + second)
        reply, _ = read_until_closed(conn, limit=5)
    assert reply.startswith(b"HTTP/1.1 200"), reply[:200]
    assert reply.count(b"HTTP/1.1 ") == 2 and b"HTTP/1.1 431" in reply, reply
    assert live(server)


def threads_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("Threads:"))


def test_the_metrics_port_has_the_same_limits_and_no_thread_per_connection(tmp_path):
    """prometheus_client's server started a thread per connection with no timeout: 1,000 half-sent
    requests made 1,000 threads (9 -> 1,009), held for as long as the clients liked. The metrics
    port is now served on the server's loop, with its header timeout, byte and connection caps."""
    repo = tmp_path / "repo"
    affine_model(repo / "1" / "model.onnx", np.ones((4, 3), np.float32), np.zeros(3, np.float32))
    port, metrics_port = free_port(), free_port()
    flags = ["--model-name", "tiny", "--no-watch", "--log-level", "warning", "--metrics-port", str(metrics_port)]
    flags += ["--header-timeout", str(HEADER_TIMEOUT), "--max-header-bytes", str(MAX_HEADER_BYTES)]
    with running(serve_command(repo, port, *flags), ready_url=f"http://127.0.0.1:{port}/health/ready") as process:
        before = threads_of(process.pid)
        conns = [socket.create_connection(("127.0.0.1", metrics_port), timeout=10) for _ in range(200)]
        try:
            for conn in conns:
                conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: test\r\n")
            scrape = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
            during = threads_of(process.pid)
            replies = [read_until_closed(conn, limit=10 * HEADER_TIMEOUT)[0] for conn in conns[:5]]
        finally:
            for conn in conns:
                conn.close()
        with socket.create_connection(("127.0.0.1", metrics_port), timeout=10) as conn:
            conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: test\r\nX-Big: " + b"a" * 2 * MAX_HEADER_BYTES + b"\r\n\r\n")
            oversized, _ = read_until_closed(conn, limit=5)
    print(f"threads: {before} before, {during} with 200 half-sent requests on the metrics port")
    assert scrape.status_code == 200 and "model_server_requests_total" in scrape.text
    assert during <= before + 2
    assert all(reply.startswith(b"HTTP/1.1 408") for reply in replies), replies
    assert oversized.startswith(b"HTTP/1.1 431"), oversized[:200]


def get(conn: socket.socket, path: str) -> bytes:
    """One GET on a kept-alive connection, its answer (head and the small body that follows)."""
    conn.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    conn.settimeout(5)
    reply = b""
    while b"\r\n\r\n" not in reply:
        chunk = conn.recv(4096)
        if not chunk:
            return reply
        reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    length = int(
        next((line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), b"0")
    )
    while len(body) < length:
        body += conn.recv(4096)
    return head + b"\r\n\r\n" + body


def wait_closed(conn: socket.socket, limit: float = 5) -> bool:
    _, took = read_until_closed(conn, limit)
    return took < limit


def test_at_the_cap_a_new_connection_closes_the_longest_idle_one(server):
    """1,024 idle keep-alive connections (refreshed before their 75 s) made every new connection a
    503, the kubelet's liveness probe included, and the pod was restarted."""
    idle = [server.connect() for _ in range(MAX_CONNECTIONS)]
    try:
        for conn in idle:
            assert get(conn, "/health/live").startswith(b"HTTP/1.1 200")
        get(idle[0], "/health/live")  # the first is now the most recently used
        with server.connect() as newcomer:
            assert get(newcomer, "/health/live").startswith(b"HTTP/1.1 200")
            assert wait_closed(idle[1])  # idle longest: closed for the newcomer
            assert get(idle[0], "/health/ready").startswith(b"HTTP/1.1 200")
    finally:
        for conn in idle:
            conn.close()


def stalled_upload(server: Server) -> socket.socket:
    conn = server.connect()
    conn.sendall(
        b"POST /infer HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n" + b'{"data": ['
    )
    return conn


def test_with_every_connection_busy_probes_are_still_answered(server):
    """At the cap with a request in flight on every connection, there is no connection to close:
    a few more may still ask the probe paths, and anything else is a 503."""
    busy = [stalled_upload(server) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.2)  # every upload's head is in: each connection is busy
        for path in ("/health/live", "/health/ready", "/v2/health/live"):
            with server.connect() as probe:
                assert get(probe, path).startswith(b"HTTP/1.1 200"), path
                assert wait_closed(probe)  # its slot is for the next probe
        with server.connect() as other:
            assert get(other, "/v2/models/tiny").startswith(b"HTTP/1.1 503")
    finally:
        for conn in busy:
            conn.close()


def test_at_the_cap_the_client_holding_most_waiting_connections_gives_one_up(server):
    """One client's half-sent requests fill the cap: a new connection from it closes its own
    oldest, not an older half-sent request of another client."""
    other = socket.create_connection(("127.0.0.1", server.port), timeout=10, source_address=("127.0.0.2", 0))
    flood: list[socket.socket] = []
    try:
        other.sendall(b"GET /health/live HTTP/1.1\r\n")
        flood = [server.connect() for _ in range(MAX_CONNECTIONS)]
        for conn in flood:
            conn.sendall(b"GET /health/live HTTP/1.1\r\n")
        # Closed for the newcomer with a 503 (the header timeout would close it with a 408).
        reply, _ = read_until_closed(flood[0], limit=CLOSED_WITHIN)
        assert reply.startswith(b"HTTP/1.1 503"), reply
        other.sendall(b"Host: test\r\n\r\n")
        other.settimeout(5)
        assert other.recv(4096).startswith(b"HTTP/1.1 200")
    finally:
        other.close()
        for conn in flood:
            conn.close()


def test_pipelined_requests_are_answered_in_order_a_few_parsed_at_a_time(server):
    """A connection's pipelined requests beyond the first 16 wait unparsed, reading paused, until
    those are answered (a read of 1,578 was 1,578 requests in memory at once): all 400 are still
    answered, in the order sent."""
    paths = ["/health/live" if i % 3 else "/health/ready" for i in range(400)]
    with server.connect() as conn:
        conn.sendall(b"".join(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode() for path in paths))
        replies = b""
        conn.settimeout(10)
        while replies.count(b"HTTP/1.1 200") < len(paths):
            chunk = conn.recv(65536)
            assert chunk, f"closed after {replies.count(b'HTTP/1.1 200')} answers"
            replies += chunk
    bodies = [part.rsplit(b"\r\n\r\n", 1)[-1] for part in replies.split(b"HTTP/1.1 200")[1:]]
    assert [b"live" in body for body in bodies] == ["live" in path for path in paths]


def test_connection_table_makes_room_idle_longest_first_then_the_busiest_clients_oldest_waiting():
    from bounded_http.http_protocol import ConnectionTable

    table: ConnectionTable[str] = ConnectionTable(max_connections=4, probe_slots=1)
    for name, peer in [("a1", "a"), ("b1", "b"), ("a2", "a"), ("a3", "a")]:
        assert table.admit(name, peer) == ("open", None)
    table.set("b1", "idle")
    table.set("a2", "idle")
    assert table.admit("c1", "c") == ("open", "b1")  # idle longest
    table.set("a2", "busy")
    # Waiting: a1, a3 (client a), c1 (client c): a holds the most, its oldest goes.
    assert table.admit("c2", "c") == ("open", "a1")
    table.set("a3", "busy")
    assert table.admit("d1", "d") == ("open", "c1")  # c has two waiting, d none yet
    for name in ("c2", "d1"):
        table.set(name, "busy")
    # Every connection busy: one may come beyond the cap for the probes, then it makes room for the next.
    assert table.admit("kubelet1", "k") == ("probes only", None)
    assert table.admit("kubelet2", "k") == ("probes only", "kubelet1")
    table.set("kubelet2", "busy")
    assert table.admit("kubelet3", "k") == ("refused", None)
    table.remove("a2")
    assert table.admit("e1", "e") == ("open", None)
    assert len(table.states) - len(table.probes) == 4 and not table.idle
