"""Hostile clients against one listening port, and what they do to the process behind it.

Every port the project ships must stay answerable under clients that try to hold it:
pipelined requests, thousands of idle or half-sent connections, uploads that stall, and
oversized heads on every request of a connection. `attack` runs one of them against a
`Target` (host, port, the path that says it is alive, the process's pid) while a watcher
asks that path over a new connection, as the kubelet does, and reads the process's
resident memory and threads from /proc; the `Report` says how bad it got. A new port is a
new `Target`: the attacks know nothing of what serves it.
"""

from __future__ import annotations

import contextlib
import resource
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

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


HTTP, GRPC = "http", "grpc"


@dataclass(frozen=True)
class Bounds:
    """What the process may do under attack: answer its health path within `health_s`, grow its
    resident memory by at most `rss_growth_bytes`, and start at most `extra_threads`."""

    health_s: float = 1.0
    rss_growth_bytes: int = 256 * MiB
    extra_threads: int = 4


@dataclass
class Report:
    """How the process fared under one attack."""

    target: str
    attack: str
    connections: int = 0
    health_checks: int = 0
    health_worst_s: float = 0.0
    health_failures: int = 0
    rss_before: int = 0
    rss_peak: int = 0
    threads_before: int = 0
    threads_peak: int = 0
    notes: list[str] = field(default_factory=list)

    def problems(self, bounds: Bounds) -> list[str]:
        """Every bound the process broke, in words; empty if it held."""
        found = [f"{self.target}, {self.attack}: {note}" for note in self.notes]
        prefix = f"{self.target}, {self.attack}:"
        if self.health_failures:
            found.append(f"{prefix} {self.health_failures} of {self.health_checks} health checks unanswered")
        if self.health_worst_s > bounds.health_s:
            found.append(f"{prefix} health answered after {self.health_worst_s:.2f}s (bound {bounds.health_s}s)")
        if self.rss_peak - self.rss_before > bounds.rss_growth_bytes:
            grown = (self.rss_peak - self.rss_before) / MiB
            found.append(f"{prefix} resident memory grew {grown:.0f} MiB (bound {bounds.rss_growth_bytes / MiB:.0f})")
        if self.threads_peak - self.threads_before > bounds.extra_threads:
            found.append(f"{prefix} threads {self.threads_before} -> {self.threads_peak}")
        return found

    def summary(self) -> str:
        return (
            f"{self.target}, {self.attack} ({self.connections} connections): health worst "
            f"{self.health_worst_s * 1000:.0f} ms in {self.health_checks} checks, {self.health_failures} failed; "
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
    request = f"GET {target.health_path} HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n".encode()
    try:
        with socket.create_connection(
            (target.host, target.port), timeout=timeout, source_address=(WATCHER_ADDRESS, 0)
        ) as conn:
            conn.sendall(request)
            reply = b""
            while chunk := conn.recv(65536):
                reply += chunk
    except OSError:
        return None
    if not reply.startswith(b"HTTP/1.1 200"):
        return None
    return time.monotonic() - started


class _Watcher:
    """Health checks in a loop and /proc samples between them, on a thread of its own."""

    def __init__(self, target: Target, report: Report, timeout: float) -> None:
        self.target = target
        self.report = report
        self.timeout = timeout
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"watch-{target.name}")

    def __enter__(self) -> _Watcher:
        self.report.rss_before, self.report.threads_before = process_status(self.target.pid)
        self.report.rss_peak, self.report.threads_peak = self.report.rss_before, self.report.threads_before
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(self.timeout + 5)

    def sample(self) -> None:
        with contextlib.suppress(OSError):
            rss, threads = process_status(self.target.pid)
            self.report.rss_peak = max(self.report.rss_peak, rss)
            self.report.threads_peak = max(self.report.threads_peak, threads)

    def check(self) -> None:
        latency = health_check(self.target, self.timeout)
        self.report.health_checks += 1
        if latency is None:
            self.report.health_failures += 1
        else:
            self.report.health_worst_s = max(self.report.health_worst_s, latency)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self.check()
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
}


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


def attack(target: Target, name: str, *, hold_s: float = 2.0, scale: int | None = None, timeout: float = 5.0) -> Report:
    """Run attack `name` against `target`, hold it `hold_s`, let go; the report covers the
    attack, the hold and one health check after."""
    run, default_scale = (adversary_h2.ATTACKS if target.protocol == GRPC else ATTACKS)[name]
    report = Report(target.name, name)
    with _Watcher(target, report, timeout) as watcher:
        conns = run(target, default_scale if scale is None else scale)
        report.connections = len(conns)
        with _closing(conns):
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
    if health_check(target, timeout) is None:
        report.notes.append("health unanswered after the attack")
    return report
