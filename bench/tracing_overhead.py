"""What tracing costs the model server, measured on real processes, side by side:

  off       no --otlp-traces-endpoint (the default)
  up        tracing every request to an OTLP receiver that answers at once
  stuck     tracing to a receiver that takes each export and never answers
  down      tracing to a port where nothing listens

For each: requests per second and latency percentiles of CONCURRENCY closed-loop clients, as
ratios to `off` (the median of ROUNDS rounds, the modes interleaved in each, so that load from
elsewhere on the machine falls on all of them alike), and the server's resident memory at the
start, half-way and at the end of a run (a stuck collector must cost dropped traces, not growth).

    .venv/bin/python bench/tracing_overhead.py            # ~3 min
    .venv/bin/python bench/tracing_overhead.py --requests 4000 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np

from testsupport.onnx_models import affine_model
from testsupport.otlp import otlp_receiver
from testsupport.payloads import memory
from testsupport.processes import free_port, running, serve_command

# Each mode and the receiver it sends to (None: tracing off).
MODES = {"off": None, "up": "ok", "stuck": "hang", "down": "refuse"}
BODY = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.5, 0.25, 0.125, 1.0]}]}


@contextlib.contextmanager
def server(repo: Path, *flags: str) -> Iterator[tuple[str, int]]:
    port = free_port()
    args = ["--model-name", "tiny", "--no-watch", "--intra-op-threads", "1", "--log-level", "error", *flags]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    url = f"http://127.0.0.1:{port}"
    with running(serve_command(repo, port, *args), env=env, ready_url=f"{url}/health/ready") as process:
        yield url, process.pid


async def load(url: str, requests: int, concurrency: int, pid: int) -> tuple[float, np.ndarray, int]:
    """Closed-loop clients; (requests per second, latencies in ms, resident bytes half-way)."""
    latencies: list[float] = []
    remaining = requests
    half_rss = 0

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            if remaining == requests // 2:
                nonlocal half_rss
                half_rss = memory(pid, "VmRSS")
            started = time.perf_counter()
            reply = await http.post("/v2/models/tiny/infer", json=BODY)
            latencies.append((time.perf_counter() - started) * 1000)
            assert reply.status_code == 200, reply.text

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as http:
        for _ in range(50):  # warm up
            await http.post("/v2/models/tiny/infer", json=BODY)
        started = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return requests / elapsed, np.array(latencies), half_rss


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(repo: Path, flags: list[str], requests: int, concurrency: int) -> dict[str, float]:
    with server(repo, *flags) as (url, pid):
        before, cpu = memory(pid, "VmRSS"), cpu_seconds(pid)
        rps, latencies, half = asyncio.run(load(url, requests, concurrency, pid))
        after, cpu = memory(pid, "VmRSS"), cpu_seconds(pid) - cpu
    return {
        "rps": rps,
        "cpu_ms": cpu * 1000 / (requests + 50),
        "p50": float(np.percentile(latencies, 50)),
        "p99": float(np.percentile(latencies, 99)),
        "rss_mib_before": before / 2**20,
        "rss_mib_half": half / 2**20,
        "rss_mib_after": after / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        repo = Path(work) / "repo"
        rng = np.random.default_rng(0)
        affine_model(repo / "1" / "model.onnx", rng.standard_normal((4, 3)).astype(np.float32), np.zeros(3, np.float32))
        runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
        for _ in range(args.rounds):
            for mode, receiver_mode in MODES.items():
                with otlp_receiver(receiver_mode or "ok") as receiver:
                    flags = ["--otlp-traces-endpoint", receiver.url] if receiver_mode else []
                    runs[mode].append(measure(repo, flags, args.requests, args.concurrency))
                    runs[mode][-1]["spans"] = len(receiver.spans)
    results = {mode: {key: float(np.median([r[key] for r in rs])) for key in rs[0]} for mode, rs in runs.items()}
    base = results["off"]
    print(
        f"{args.requests} requests, {args.concurrency} clients, 1-row v2 requests to a 4x3 affine ONNX model, "
        f"median of {args.rounds} rounds"
    )
    print(
        f"{'mode':6} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'rps/off':>8} {'p50/off':>8} {'p99/off':>8} "
        f"{'CPU ms/req':>10} {'CPU/off':>8} RSS MiB start -> half -> end"
    )
    for mode, r in results.items():
        print(
            f"{mode:6} {r['rps']:8.0f} {r['p50']:7.2f} {r['p99']:7.2f} {r['rps'] / base['rps']:8.2f} "
            f"{r['p50'] / base['p50']:8.2f} {r['p99'] / base['p99']:8.2f} "
            f"{r['cpu_ms']:10.3f} {r['cpu_ms'] / base['cpu_ms']:8.2f} "
            f"{r['rss_mib_before']:.0f} -> {r['rss_mib_half']:.0f} -> {r['rss_mib_after']:.0f}"
        )
    print(f"spans received while up: {results['up'].get('spans', 0):.0f}")


if __name__ == "__main__":
    main()
