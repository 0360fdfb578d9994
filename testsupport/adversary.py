"""Hostile clients against one listening port, and what they do to the process behind it.

Every port the project ships must stay answerable under clients that try to hold it:
pipelined requests, thousands of idle or half-sent connections, uploads that stall, oversized
heads on every request of a connection, and, the other way, answers nobody reads (clients that
never read, read a byte a second, or leave before the answer's head, asking for answers many
times their requests). `attack` runs one of them against a `Target` (host, port, the path that
says it is alive, the process's pid) while a watcher asks that path over a new connection, as
the kubelet does, sends another client's ordinary request, and reads the process's resident
memory and threads from /proc; the `Report` says how bad it got, judged by `Bounds`: the
kubelet's own rule for a restart (its probe's timeout and failure threshold), the process's
memory limit, its threads. A new port is a new `Target`: the attacks know nothing of what
serves it.
"""

from __future__ import annotations

import contextlib
import resource
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import adversary_h2

MiB = 1 << 20
#: The watcher's clients come from another loopback address than the attacks, as the
#: kubelet's do from the node's.
WATCHER_ADDRESS = "127.0.0.2"


@dataclass(frozen=True)
class Target:
    """One listening port and the process that serves it."""

    name: str
    host: str
    port: int
    health_path: str
    pid: int
    #: Where a POST with a body goes (stalled uploads); the health path if None.
    upload_path: str | None = None
    #: HTTP (each attack as HTTP/1.1) or GRPC (each attack in its HTTP/2 shape, adversary_h2.py).
    protocol: str = "http"
    #: A whole request whose answer is many times its size (`request`): what the answer-side
    #: attacks ask for. None: a GET of the health path.
    answer_request: bytes | None = None
    #: Another client's ordinary request, which must be answered 2xx while an attack runs. None:
    #: a GET of the health path.
    ordinary_request: bytes | None = None

    def ordinary(self) -> bytes:
        return self.ordinary_request or request("GET", self.health_path)


HTTP, GRPC = "http", "grpc"


def request(method: str, path: str, body: bytes = b"", *, host: str = "adversary", **headers: str) -> bytes:
    """A whole HTTP/1.1 request, kept alive, with its Content-Length when it has a body."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@dataclass(frozen=True)
class Probe:
    """The kubelet's probe of the process (its liveness): a check fails when no success comes
    within `timeout_s`, and the container is restarted after `failure_threshold` consecutive
    failures. Read from the probe the chart or the operator renders (`of`), so the suite holds
    a port to what its pod is really judged by."""

    timeout_s: float
    failure_threshold: int

    @classmethod
    def of(cls, probe: Mapping[str, Any]) -> Probe:
        """From a pod's probe object; Kubernetes' defaults where it leaves a field out."""
        return cls(float(probe.get("timeoutSeconds", 1)), int(probe.get("failureThreshold", 3)))


@dataclass(frozen=True)
class Bounds:
    """What the process may do under attack: never fail `probe.failure_threshold` health checks
    in a row (the kubelet would restart it), serve another client's ordinary request, keep its
    resident memory under `rss_limit_bytes` (its configured limit) and its growth under
    `rss_growth_bytes`, and start at most `extra_threads`.

    The watcher's checks run back to back, not a probe period apart, so a run of failures here
    is a shorter outage than the kubelet needs to see before it restarts: the bound is stricter
    than the kubelet, never looser, and one slow check on a busy machine is no failure of it."""

    probe: Probe
    rss_limit_bytes: int | None = None
    #: Whether another client's ordinary requests are asked (HTTP ports; a gRPC port's health
    #: checks are calls of another client already).
    another_client: bool = True
    rss_growth_bytes: int = 256 * MiB
    extra_threads: int = 4


@dataclass
class Report:
    """How the process fared under one attack."""

    target: str
    attack: str
    connections: int = 0
    #: Each health check in order: seconds to its answer, None if none came.
    health: list[float | None] = field(default_factory=list)
    served_checks: int = 0
    #: Another client's ordinary requests that got no 2xx answer, and what they got instead.
    served_failures: list[str] = field(default_factory=list)
    #: Of the ordinary requests, those first refused with 503 and Retry-After, then asked again.
    served_after_retry: int = 0
    rss_before: int = 0
    rss_peak: int = 0
    threads_before: int = 0
    threads_peak: int = 0
    notes: list[str] = field(default_factory=list)

    def failures_in_a_row(self, probe: Probe) -> int:
        """The longest run of consecutive health checks the kubelet would count as failed."""
        longest = run = 0
        for latency in self.health:
            run = run + 1 if latency is None or latency > probe.timeout_s else 0
            longest = max(longest, run)
        return longest

    def problems(self, bounds: Bounds) -> list[str]:
        """Every bound the process broke, in words; empty if it held."""
        found = [f"{self.target}, {self.attack}: {note}" for note in self.notes]
        prefix = f"{self.target}, {self.attack}:"
        probe = bounds.probe
        in_a_row = self.failures_in_a_row(probe)
        if in_a_row >= probe.failure_threshold:
            found.append(
                f"{prefix} {in_a_row} health checks in a row unanswered within {probe.timeout_s:g}s: the kubelet "
                f"restarts after {probe.failure_threshold}"
            )
        if self.served_failures:
            found.append(
                f"{prefix} {len(self.served_failures)} of {self.served_checks} ordinary requests of another client "
                f"not served: {sorted(set(self.served_failures))}"
            )
        if bounds.another_client and not self.served_checks:
            found.append(f"{prefix} no ordinary request of another client was answered at all")
        if self.rss_peak - self.rss_before > bounds.rss_growth_bytes:
            grown = (self.rss_peak - self.rss_before) / MiB
            found.append(f"{prefix} resident memory grew {grown:.0f} MiB (bound {bounds.rss_growth_bytes / MiB:.0f})")
        if bounds.rss_limit_bytes is not None and self.rss_peak > bounds.rss_limit_bytes:
            found.append(
                f"{prefix} resident memory {self.rss_peak / MiB:.0f} MiB, over its limit of "
                f"{bounds.rss_limit_bytes / MiB:.0f} MiB"
            )
        if self.threads_peak - self.threads_before > bounds.extra_threads:
            found.append(f"{prefix} threads {self.threads_before} -> {self.threads_peak}")
        return found

    def summary(self) -> str:
        answered = [latency for latency in self.health if latency is not None]
        worst = max(answered, default=0.0)
        return (
            f"{self.target}, {self.attack} ({self.connections} connections): health worst "
            f"{worst * 1000:.0f} ms in {len(self.health)} checks, {len(self.health) - len(answered)} unanswered; "
            f"ordinary requests {self.served_checks - len(self.served_failures)} of {self.served_checks} served "
            f"({self.served_after_retry} after a Retry-After); "
            f"RSS {self.rss_before / MiB:.0f} -> {self.rss_peak / MiB:.0f} MiB; "
            f"threads {self.threads_before} -> {self.threads_peak}"
        )


def process_status(pid: int) -> tuple[int, int]:
    """The process's resident memory (bytes) and thread count, from /proc/PID/status."""
    rss = threads = 0
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss, threads


def raise_fd_limit() -> int:
    """This process's open-file limit raised to its hard limit (thousands of sockets); the new limit."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def health_check(target: Target, timeout: float) -> float | None:
    """Seconds to a complete 200 from the health path over a new connection; None if none came."""
    if target.protocol == GRPC:
        return adversary_h2.health_check(target, WATCHER_ADDRESS, timeout)
    started = time.monotonic()
    status = exchange(target, request("GET", target.health_path, host="probe", Connection="close"), timeout)
    if status != "200":
        return None
    return time.monotonic() - started


def exchange(target: Target, whole_request: bytes, timeout: float) -> str:
    """One request over a new connection from the watcher's address: the answer's status code, or
    what went wrong. The answer is read to its end (its Content-Length, or the connection's close)."""
    return _exchange(target, whole_request, timeout)[0]


# The longest Retry-After an ordinary client is taken to honour before it asks once more.
MAX_RETRY_AFTER_S = 2.0


def retry_after(head: bytes) -> float | None:
    """The seconds a 503's Retry-After asks for (None: none, or not in seconds)."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"retry-after":
            try:
                return float(value.strip())
            except ValueError:
                return None
    return None


def _exchange(target: Target, whole_request: bytes, timeout: float) -> tuple[str, bytes]:
    """`exchange`, and the answer's head (empty when none came)."""
    head = b""
    try:
        with socket.create_connection(
            (target.host, target.port), timeout=timeout, source_address=(WATCHER_ADDRESS, 0)
        ) as conn:
            if b"\r\nconnection:" not in whole_request.split(b"\r\n\r\n", 1)[0].lower():
                line, rest = whole_request.split(b"\r\n", 1)
                whole_request = line + b"\r\nConnection: close\r\n" + rest  # its end is the answer's end
            conn.sendall(whole_request)
            reply = b""
            while b"\r\n\r\n" not in reply:
                chunk = conn.recv(65536)
                if not chunk:
                    return "closed before the answer's head", b""
                reply += chunk
            head, _, body = reply.partition(b"\r\n\r\n")
            lengths = [line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
            length = int(lengths[0].split(b":", 1)[1]) if lengths else None
            while length is None or len(body) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                body += chunk
    except TimeoutError:
        return f"no answer within {timeout:g}s", head
    except OSError as exc:
        return type(exc).__name__, head
    status = head.split(b" ", 2)[1].decode(errors="replace") if head.startswith(b"HTTP/1.1 ") else "not HTTP"
    return status, head


class _Watcher:
    """Health checks and another client's ordinary requests in a loop, /proc samples between
    them, on a thread of its own."""

    def __init__(self, target: Target, report: Report, timeout: float, served_timeout: float) -> None:
        self.target = target
        self.report = report
        self.timeout = timeout
        self.served_timeout = served_timeout
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"watch-{target.name}")

    def __enter__(self) -> _Watcher:
        self.report.rss_before, self.report.threads_before = process_status(self.target.pid)
        self.report.rss_peak, self.report.threads_peak = self.report.rss_before, self.report.threads_before
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(max(self.timeout, self.served_timeout) + 5)

    def sample(self) -> None:
        with contextlib.suppress(OSError):
            rss, threads = process_status(self.target.pid)
            self.report.rss_peak = max(self.report.rss_peak, rss)
            self.report.threads_peak = max(self.report.threads_peak, threads)

    def check(self) -> None:
        self.report.health.append(health_check(self.target, self.timeout))

    def serve(self) -> None:
        """Another client's ordinary request (an HTTP port's: a gRPC port's is its health call)."""
        if self.target.protocol == GRPC:
            return
        status, head = _exchange(self.target, self.target.ordinary(), self.served_timeout)
        wait = retry_after(head) if status == "503" else None
        if wait is not None and wait <= MAX_RETRY_AFTER_S:
            # Overload answered as overload (503 with Retry-After): a client asks again once, after
            # the wait it was told; only a second refusal counts against the port.
            self.report.served_after_retry += 1
            time.sleep(wait)
            status, _ = _exchange(self.target, self.target.ordinary(), self.served_timeout)
        self.report.served_checks += 1
        if not status.startswith("2"):
            self.report.served_failures.append(status)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self.check()
            self.sample()
            self.serve()
            self.sample()
            self._stop.wait(0.05)


# ---------------------------------------------------------------------- the attacks


def _connect(target: Target) -> socket.socket:
    return socket.create_connection((target.host, target.port), timeout=10)


def _send_without_waiting(conn: socket.socket, data: bytes) -> None:
    """As much of `data` as the socket takes now: a server that stops reading does not hold us."""
    conn.setblocking(False)
    with contextlib.suppress(BlockingIOError, ConnectionError):
        conn.send(data)


def _read_answers(conn: socket.socket, count: int, timeout: float) -> int:
    """How many HTTP answers arrive on `conn` (up to `count`) before `timeout` or its close."""
    conn.settimeout(timeout)
    seen, tail = 0, b""
    with contextlib.suppress(OSError):
        while seen < count:
            chunk = conn.recv(65536)
            if not chunk:
                break
            window = tail + chunk  # a status line may span two reads
            seen += window.count(b"HTTP/1.1 ") - tail.count(b"HTTP/1.1 ")
            tail = window[-8:]
    return seen


def pipelined(target: Target, scale: int) -> list[socket.socket]:
    """`scale` connections, each writing 50 requests at once before reading any answer."""
    request = f"GET {target.health_path} HTTP/1.1\r\nHost: adversary\r\n\r\n".encode()
    conns = [_connect(target) for _ in range(scale)]
    for conn in conns:
        conn.sendall(request * 50)
    return conns


def idle(target: Target, scale: int) -> list[socket.socket]:
    """`scale` kept-alive connections, each after one answered request, then silent."""
    request = f"GET {target.health_path} HTTP/1.1\r\nHost: adversary\r\n\r\n".encode()
    conns = []
    for _ in range(scale):
        conn = _connect(target)
        conn.sendall(request)
        _read_answers(conn, 1, timeout=5)
        conns.append(conn)
    return conns


def half_open(target: Target, scale: int) -> list[socket.socket]:
    """`scale` connections that send half a request's head and nothing more."""
    head = f"GET {target.health_path} HTTP/1.1\r\nHost: adversary\r\n".encode()
    conns = []
    for _ in range(scale):
        conn = _connect(target)
        _send_without_waiting(conn, head)
        conns.append(conn)
    return conns


def stalled_uploads(target: Target, scale: int) -> list[socket.socket]:
    """`scale` POSTs declaring 60 MiB that stop after 300 KiB of a JSON body."""
    path = target.upload_path or target.health_path
    head = (
        f"POST {path} HTTP/1.1\r\nHost: adversary\r\nContent-Type: application/json\r\n"
        f"Content-Length: {60 * MiB}\r\n\r\n"
    ).encode()
    body = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [' + b"1," * (150 * 1024)
    conns = []
    for _ in range(scale):
        conn = _connect(target)
        _send_without_waiting(conn, head + body)
        conns.append(conn)
    return conns


def huge_headers(target: Target, scale: int) -> list[socket.socket]:
    """`scale` connections writing, at once, a request and the head of a second with 10,000 fields:
    the limits must hold for every request of a connection, not only the first."""
    first = f"GET {target.health_path} HTTP/1.1\r\nHost: adversary\r\n\r\n".encode()
    second = f"GET {target.health_path} HTTP/1.1\r\nHost: adversary\r\n".encode() + b"a: b\r\n" * 10_000
    conns = []
    for _ in range(scale):
        conn = _connect(target)
        _send_without_waiting(conn, first + second)
        conns.append(conn)
    return conns


def _small_window(target: Target) -> socket.socket:
    """A connection with a 4 KiB receive buffer: the server's answer stays on its side."""
    conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    conn.settimeout(10)
    conn.connect((target.host, target.port))
    return conn


def _answer_request(target: Target) -> bytes:
    return target.answer_request or request("GET", target.health_path)


def unread_answers(target: Target, scale: int) -> list[socket.socket]:
    """`scale` connections asking for a large answer and never reading a byte of it."""
    whole = _answer_request(target)
    conns = []
    for _ in range(scale):
        conn = _small_window(target)
        conn.sendall(whole)
        conns.append(conn)
    return conns


def slow_readers(target: Target, scale: int) -> list[socket.socket]:
    """`scale` connections asking for a large answer and reading it a byte a second, each."""
    conns = unread_answers(target, scale)
    threading.Thread(target=_read_a_byte_a_second, args=(conns,), daemon=True, name="slow-readers").start()
    return conns


def _read_a_byte_a_second(conns: list[socket.socket]) -> None:
    """One byte from each connection every second, until they are all closed (by `attack`)."""
    for conn in conns:
        conn.setblocking(False)
    while any(conn.fileno() >= 0 for conn in conns):
        for conn in conns:
            with contextlib.suppress(OSError, ValueError):
                conn.recv(1)
        time.sleep(1.0)


def gone_before_head(target: Target, scale: int) -> list[socket.socket]:
    """`scale` clients that send a whole request for a large answer and leave at once, before the
    answer's head: the server computes answers for nobody."""
    whole = _answer_request(target)
    for _ in range(scale):
        with _small_window(target) as conn:
            conn.sendall(whole)
    return unread_answers(target, 1)  # its answer's head says the server has come to the last of them


Attack = Callable[[Target, int], list[socket.socket]]
#: Each attack and its scale. The connection counts broke the model server before its limits
#: held; pipelining is kept to 1,000 requests: a burst of 30,000 over 300 connections is CPU the
#: loop serves in order, and held a new connection's first answer 3-4 s (memory stays bounded).
ATTACKS: dict[str, tuple[Attack, int]] = {
    "pipelined": (pipelined, 20),
    "idle": (idle, 2_000),
    "half-open": (half_open, 2_000),
    "stalled uploads": (stalled_uploads, 1_000),
    "huge headers": (huge_headers, 300),
    "unread answers": (unread_answers, 80),
    "slow readers": (slow_readers, 40),
    "gone before the head": (gone_before_head, 200),
}


#: The attacks on the answer side: held once every connection has its answer's first bytes.
ANSWER_ATTACKS = frozenset({"unread answers", "slow readers", "gone before the head"})


def _await_answers(conns: list[socket.socket], timeout: float) -> int:
    """Wait until every connection has bytes of an answer to read (none is read), at most
    `timeout`; how many have none."""
    pending = list(conns)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        readable, _, _ = select.select(pending, [], [], max(0.0, min(1.0, deadline - time.monotonic())))
        pending = [conn for conn in pending if conn not in readable]
    return len(pending)


def attacks(protocol: str) -> list[str]:
    """The attacks a port of `protocol` is held to: a gRPC port's include large messages at once."""
    return list(adversary_h2.ATTACKS if protocol == GRPC else ATTACKS)


@contextlib.contextmanager
def _closing(conns: list[socket.socket] | list[adversary_h2.Client]) -> Iterator[None]:
    try:
        yield
    finally:
        for conn in conns:
            conn.close()


def attack(
    target: Target,
    name: str,
    probe: Probe,
    *,
    hold_s: float = 2.0,
    scale: int | None = None,
    timeout: float = 5.0,
    served_timeout: float = 15.0,
    answers_s: float = 60.0,
) -> Report:
    """Run attack `name` against `target`, hold it `hold_s`, let go; the report covers the
    attack, the hold and one health check after. Health checks wait the `probe`'s timeout, as
    the kubelet does; another client's ordinary request waits `served_timeout`. An attack on the
    answer side is held from when every answer has begun (at most `answers_s`)."""
    run, default_scale = (adversary_h2.ATTACKS if target.protocol == GRPC else ATTACKS)[name]
    report = Report(target.name, name)
    with _Watcher(target, report, probe.timeout_s, served_timeout) as watcher:
        conns = run(target, default_scale if scale is None else scale)
        report.connections = len(conns)
        with _closing(conns):
            if name in ANSWER_ATTACKS and target.protocol != GRPC:
                unanswered = _await_answers(conns, answers_s)  # type: ignore[arg-type]
                if unanswered:
                    report.notes.append(f"{unanswered} of {len(conns)} answers not begun within {answers_s:g}s")
            deadline = time.monotonic() + hold_s
            while time.monotonic() < deadline:
                watcher.sample()
                time.sleep(0.02)
            if name == "pipelined":
                answered = sum(
                    conn.answers(50, timeout)
                    if isinstance(conn, adversary_h2.Client)
                    else _read_answers(conn, 50, timeout)
                    for conn in conns
                )
                if answered < 50 * len(conns):
                    report.notes.append(f"{answered} of {50 * len(conns)} pipelined requests answered")
    # Answerable again once it is let go, as the kubelet judges: a restart takes
    # failureThreshold checks in a row without an answer, so one slow check is none.
    after = 0
    while after < probe.failure_threshold and health_check(target, timeout) is None:
        after += 1
    if after >= probe.failure_threshold:
        report.notes.append(f"health unanswered after the attack: {after} checks in a row")
    return report
