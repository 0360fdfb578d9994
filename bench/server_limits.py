"""The model server's bounds against hostile input, measured on a real process:

  1. peak resident memory added by one large JSON body (and four at once), per body size
     and kind, as a multiple of the body, under a 2 GiB memory limit (mnist-cpu's);
  2. the longest the server went without answering /health/live while it took that body;
  3. how long a slow client (headers a few bytes a second) keeps its connection, and how
     many file descriptors N half-sent requests hold.

    .venv/bin/python bench/server_limits.py                       # ~2 min
    .venv/bin/python bench/server_limits.py --baseline-src OLD/server   # side by side with
                                                                        # another checkout

With `--baseline-src`, sections 1-2 also run the server from that source tree (without
the flags it may not know) and print both, with the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np

from testsupport import payloads
from testsupport.liveness import post_and_watch_liveness
from testsupport.onnx_models import affine_model
from testsupport.payloads import MiB, memory, reset_peak
from testsupport.processes import free_port, running, serve_command

WIDTH = 1024
POD = 2048 * MiB


@contextlib.contextmanager
def server(repo: Path, src: str | None, *flags: str) -> Iterator[tuple[str, int]]:
    port = free_port()
    args = ["--model-name", "tiny", "--no-watch", "--max-delay-ms", "0", "--intra-op-threads", "1"]
    args += ["--log-level", "error", *flags]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src] if src else sys.path)}
    url = f"http://127.0.0.1:{port}"
    with running(serve_command(repo, port, *args), env=env, ready_url=f"{url}/health/ready") as process:
        yield url, process.pid


def new_flags(src: str | None) -> list[str]:
    return [] if src else ["--memory-limit-bytes", str(POD)]


def peak_growth(url: str, pid: int, bodies: list[bytes]) -> tuple[list[int], int]:
    before = memory(pid, "VmRSS")
    reset_peak(pid)

    async def post_all() -> list[int]:
        async with httpx.AsyncClient(base_url=url, timeout=300) as client:
            answers = await asyncio.gather(
                *(
                    client.post("/v2/models/tiny/infer", content=b, headers={"content-type": "application/json"})
                    for b in bodies
                )
            )
        return [a.status_code for a in answers]

    statuses = asyncio.run(post_all())
    return statuses, memory(pid, "VmHWM") - before


def longest_silence(url: str, body: bytes) -> tuple[int, float, float]:
    """(status, request seconds, longest stretch without a liveness answer after the body was sent)."""
    port = int(url.rsplit(":", 1)[1])
    status, elapsed, answers = post_and_watch_liveness(port, body, timeout=300)
    marks = [0.0, *answers, elapsed]
    return status, elapsed, max(b - a for a, b in zip(marks, marks[1:], strict=False))


BODIES = {
    "floats 16 MiB": lambda: payloads.v2_body(b"0.1234567,", 16 * MiB, WIDTH),
    "floats 32 MiB": lambda: payloads.v2_body(b"0.1234567,", 32 * MiB, WIDTH),
    "floats 60 MiB": lambda: payloads.v2_body(b"0.1234567,", 60 * MiB, WIDTH),
    "small ints 16 MiB": lambda: payloads.v2_body(b"1,", 16 * MiB, WIDTH),
    "empty lists 16 MiB": lambda: payloads.lists_body(16 * MiB, WIDTH),
}


def memory_section(repo: Path, src: str | None) -> dict[str, dict[str, float]]:
    results: dict[str, dict[str, float]] = {}
    for name, make in BODIES.items():
        body = make()
        with server(repo, src, *new_flags(src)) as (url, pid):
            statuses, growth = peak_growth(url, pid, [body])
            status, took, silence = longest_silence(url, body)
        results[name] = {"status": statuses[0], "peak_mib": growth / MiB, "x_body": growth / len(body)}
        results[name] |= {"request_s": took, "longest_silence_s": silence}
    body = BODIES["floats 16 MiB"]()
    with server(repo, src, *new_flags(src)) as (url, pid):
        statuses, growth = peak_growth(url, pid, [body] * 4)
    results["4 x floats 16 MiB at once"] = {
        "status": max(statuses),
        "peak_mib": growth / MiB,
        "x_body": growth / len(body),
    }
    return results


def slow_clients(repo: Path, connections: int) -> dict[str, float]:
    with server(repo, None, "--max-connections", "1024") as (url, pid):
        port = int(url.rsplit(":", 1)[1])
        baseline = len(os.listdir(f"/proc/{pid}/fd"))
        # One slowloris: a header line every half second, never finishing.
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(b"GET /health/live HTTP/1.1\r\n")
            conn.settimeout(0.5)
            dropped = None
            while time.monotonic() - started < 120:
                try:
                    conn.sendall(b"X-a: b\r\n")
                    conn.recv(4096)  # the 408, or the close
                    dropped = time.monotonic() - started
                    break
                except TimeoutError:
                    continue
                except OSError:
                    dropped = time.monotonic() - started
                    break
        # N half-sent requests at once.
        socks = []
        for _ in range(connections):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /infer HTTP/1.1\r\nHost: b\r\n")
            socks.append(s)
        time.sleep(1)
        held = len(os.listdir(f"/proc/{pid}/fd")) - baseline
        began = time.monotonic()
        while len(os.listdir(f"/proc/{pid}/fd")) > baseline + 2 and time.monotonic() - began < 120:
            time.sleep(0.2)
        released = time.monotonic() - began + 1
        for s in socks:
            s.close()
    return {
        "slowloris_dropped_after_s": dropped if dropped is not None else float("nan"),
        "half_sent_requests": connections,
        "fds_held": held,
        "all_released_after_s": released,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-src", help="another checkout's server/ directory to compare with")
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        affine_model(repo / "1" / "model.onnx", np.ones((WIDTH, 1), np.float32), np.zeros(1, np.float32))
        figures: dict[str, object] = {"this": memory_section(repo, None)}
        if args.baseline_src:
            figures["baseline"] = memory_section(repo, args.baseline_src)
        figures["connections"] = slow_clients(repo, args.connections)
    this = figures["this"]
    base = figures.get("baseline", {})
    print(f"{'body':28} {'status':>6} {'peak MiB':>9} {'x body':>7} {'silence s':>10}   baseline: peak MiB, silence s")
    for name, row in this.items():  # type: ignore[union-attr]
        line = f"{name:28} {row['status']:6.0f} {row['peak_mib']:9.0f} {row['x_body']:7.1f} "
        line += f"{row.get('longest_silence_s', float('nan')):10.2f}"
        if name in base:  # type: ignore[operator]
            b = base[name]  # type: ignore[index]
            line += f"   {b['peak_mib']:.0f} ({b['peak_mib'] / max(row['peak_mib'], 1):.1f}x ours)"
            line += f", {b.get('longest_silence_s', float('nan')):.2f}"
        print(line)
    print(json.dumps(figures["connections"]))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
