"""Real processes on loopback: a free port, start a command, wait until it answers, stop it.

The tests, the benchmarks and the demo run the model server, the operator and Prometheus as
real processes; they all start, wait and stop them the same way, here.
"""

from __future__ import annotations

import contextlib
import pathlib
import random
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import httpx

from testsupport.waiting import NeverHappened, eventually


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that nothing uses right now, below the kernel's ephemeral range.

    A port from `bind(0)` is drawn from that range, as every outgoing connection's source port
    is: on a busy address a client could take it before the server it was meant for started
    (the tier's Prometheus on the bridge: "bind: address already in use"). No connection is
    given a port below the range, so only another server can take one there. Also below
    Kubernetes' NodePort range (30000-32767), which the real-pods tier's kube-proxy programs."""
    first = min(_ephemeral_range()[0], _NODE_PORTS)
    for _ in range(1000):
        port = random.randrange(_LOWEST_PORT, first)
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port on {host} in {_LOWEST_PORT}-{first - 1}")


_LOWEST_PORT = 10_000
_NODE_PORTS = 30_000


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def serve_command(model: pathlib.Path, port: int, *flags: str, host: str = "127.0.0.1") -> list[str]:
    """`python -m model_server serve` for `model` on `host:port`, with further `flags`."""
    return [
        sys.executable,
        "-m",
        "model_server",
        "serve",
        "--model",
        str(model),
        "--host",
        host,
        "--port",
        str(port),
        *flags,
    ]


def _tail(log: pathlib.Path | None) -> str:
    return f":\n{log.read_text(errors='replace')[-3000:]}" if log is not None and log.exists() else ""


def wait_http(
    url: str,
    process: subprocess.Popen[Any] | None = None,
    *,
    timeout: float = 60,
    log: pathlib.Path | None = None,
) -> None:
    """Poll `url` until it answers 200; fail at once if `process` exits first (with its log)."""

    def ready() -> bool:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {process.returncode}{_tail(log)}")
        return httpx.get(url, timeout=2).status_code == 200

    try:
        eventually(ready, timeout=timeout, interval=0.1, what=url, ignore=(httpx.HTTPError,))
    except NeverHappened as exc:
        raise RuntimeError(f"{url} not ready after {timeout}s{_tail(log)}") from exc


def stop(process: subprocess.Popen[Any], timeout: float = 10, sig: int = signal.SIGTERM) -> int:
    """Send `sig` (SIGTERM: a graceful stop), kill after `timeout`; the exit code."""
    if process.poll() is None:
        process.send_signal(sig)
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait(10)


@contextlib.contextmanager
def running(
    args: Sequence[str],
    *,
    log: pathlib.Path | None = None,
    env: Mapping[str, str] | None = None,
    cwd: pathlib.Path | None = None,
    ready_url: str | None = None,
    timeout: float = 60,
    stop_timeout: float = 10,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `args` (output to `log`, else inherited), wait for `ready_url`, stop on the way out.

    After the block, the process has exited and `returncode` says how.
    """
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(log.open("wb")) if log is not None else None
        process = subprocess.Popen(
            list(args), env=None if env is None else dict(env), cwd=cwd, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            if ready_url is not None:
                wait_http(ready_url, process, timeout=timeout, log=log)
            yield process
        finally:
            stop(process, stop_timeout)
