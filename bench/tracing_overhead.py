"""What tracing costs the model server, measured on real processes, side by side:

  off       no --otlp-traces-endpoint (the default)
  up        tracing every request to an OTLP receiver that answers at once
  stuck     tracing to a receiver that takes each export and never answers
  down      tracing to a port where nothing listens

For each: requests per second and latency percentiles of CONCURRENCY closed-loop clients, as
ratios to `off`, and the server's resident memory before and after (a stuck collector must
cost dropped spans, not growth).

    .venv/bin/python bench/tracing_overhead.py            # ~1 min
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

BODY = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.5, 0.25, 0.125, 1.0]}]}


@contextlib.contextmanager
def server(repo: Path, *flags: str) -> Iterator[tuple[str, int]]:
    port = free_port()
    args = ["--model-name", "tiny", "--no-watch", "--intra-op-threads", "1", "--log-level", "error", *flags]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    url = f"http://127.0.0.1:{port}"
    with running(serve_command(repo, port, *args), env=env, ready_url=f"{url}/health/ready") as process:
        yield url, process.pid


async def load(url: str, requests: int, concurrency: int) -> tuple[float, np.ndarray]:
    """Closed-loop clients; (requests per second, latencies in ms)."""
    latencies: list[float] = []
    remaining = requests

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
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
    return requests / elapsed, np.array(latencies)


def measure(repo: Path, flags: list[str], requests: int, concurrency: int) -> dict[str, float]:
    with server(repo, *flags) as (url, pid):
        before = memory(pid, "VmRSS")
        rps, latencies = asyncio.run(load(url, requests, concurrency))
        after = memory(pid, "VmRSS")
    return {
        "rps": rps,
        "p50": float(np.percentile(latencies, 50)),
        "p99": float(np.percentile(latencies, 99)),
        "rss_mib_before": before / 2**20,
        "rss_mib_after": after / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        repo = Path(work) / "repo"
        rng = np.random.default_rng(0)
        affine_model(repo / "1" / "model.onnx", rng.standard_normal((4, 3)).astype(np.float32), np.zeros(3, np.float32))
        results = {"off": measure(repo, [], args.requests, args.concurrency)}
        for mode, receiver_mode in (("up", "ok"), ("stuck", "hang"), ("down", "refuse")):
            with otlp_receiver(receiver_mode) as receiver:
                flags = ["--otlp-traces-endpoint", receiver.url]
                results[mode] = measure(repo, flags, args.requests, args.concurrency)
                if mode == "up":
                    results[mode]["spans"] = len(receiver.spans)
    base = results["off"]
    print(f"{args.requests} requests, {args.concurrency} clients, 1-row v2 requests to a 4x3 affine ONNX model")
    print(f"{'mode':6} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'rps/off':>8} {'p50/off':>8} {'p99/off':>8} RSS MiB")
    for mode, r in results.items():
        print(
            f"{mode:6} {r['rps']:8.0f} {r['p50']:7.2f} {r['p99']:7.2f} {r['rps'] / base['rps']:8.2f} "
            f"{r['p50'] / base['p50']:8.2f} {r['p99'] / base['p99']:8.2f} "
            f"{r['rss_mib_before']:.0f} -> {r['rss_mib_after']:.0f}"
        )
    print(f"spans received while up: {results['up'].get('spans', 0):.0f}")


if __name__ == "__main__":
    main()
