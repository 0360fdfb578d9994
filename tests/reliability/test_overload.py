"""Overload: a burst far above capacity is refused fast, memory stays bounded, service recovers.

A real `python -m model_server serve` process with a deliberately small queue gets a bounded
burst of concurrent requests many times its capacity. Every request gets an answer (200, or
429 with Retry-After, never a hang or a 5xx), the process's resident memory grows by a bounded
amount, and afterwards the queue is empty and the same load is served again in full.
"""

from __future__ import annotations

import asyncio
import collections
import os
import pathlib
import time

import httpx
import numpy as np
import pytest

from testsupport.onnx_models import mlp_model
from testsupport.processes import free_port, running, serve_command

pytestmark = [pytest.mark.slow, pytest.mark.integration]

WIDTH = 256
BURST = 1500
CONCURRENCY = 300
MAX_QUEUE = 16


def rss_bytes(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def gauge(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


async def fire(base: str, total: int, concurrency: int) -> tuple[collections.Counter, list[float], float]:
    """`total` requests over `concurrency` connections; status counts, 429 latencies, seconds."""
    row = np.random.default_rng(0).standard_normal(WIDTH).astype(np.float32).tolist()
    statuses: collections.Counter = collections.Counter()
    refused_latency: list[float] = []
    remaining = iter(range(total))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as client:

        async def worker() -> None:
            for _ in remaining:
                started = time.perf_counter()
                try:
                    response = await client.post("/infer", json={"data": row})
                except httpx.HTTPError as exc:
                    statuses[type(exc).__name__] += 1
                    continue
                statuses[response.status_code] += 1
                if response.status_code == 429:
                    refused_latency.append(time.perf_counter() - started)
                    assert response.headers.get("Retry-After"), "429 without Retry-After"

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return statuses, refused_latency, elapsed


async def test_overload_burst_is_refused_fast_bounded_and_recovers(tmp_path: pathlib.Path) -> None:
    repo = tmp_path / "models"
    mlp_model(repo / "1" / "model.onnx", [WIDTH, 1024, 1024, WIDTH])
    port = free_port()
    env = {**os.environ, "MODEL_SERVER_INTRA_OP_THREADS": "1"}
    command = serve_command(
        repo,
        port,
        "--model-name",
        "burst",
        "--providers",
        "CPUExecutionProvider",
        "--max-batch-size",
        "8",
        "--max-delay-ms",
        "2",
        "--max-queue",
        str(MAX_QUEUE),
        "--no-access-log",
    )
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    with running(command, env=env, log=log, ready_url=base + "/health/ready", stop_timeout=30) as server:
        baseline, _, baseline_s = await fire(base, 200, 8)
        assert baseline == {200: 200}
        rss_before = rss_bytes(server.pid)

        burst, refused_latency, burst_s = await fire(base, BURST, CONCURRENCY)
        rss_after = rss_bytes(server.pid)
        assert sum(burst.values()) == BURST
        assert set(burst) <= {200, 429, 503}, burst  # nothing lost, nothing hung, no 500
        assert burst[429] > 0, "a burst of this size must overflow a 16-deep queue"
        assert burst[200] > 0
        # The queue bound holds: memory does not grow with the backlog of refused requests.
        assert rss_after - rss_before < 150 * 2**20, (rss_before, rss_after)

        async with httpx.AsyncClient(base_url=base, timeout=5) as client:
            metrics = (await client.get("/metrics")).text
        assert gauge(metrics, "model_server_queue_depth") == 0
        recovered, _, recovered_s = await fire(base, 200, 8)
        assert recovered == {200: 200}

        refused_latency.sort()
        p99 = refused_latency[int(len(refused_latency) * 0.99) - 1] if refused_latency else 0.0
        print(
            f"overload: {BURST} requests at concurrency {CONCURRENCY} in {burst_s:.1f} s -> {dict(burst)}; "
            f"429 p50 {refused_latency[len(refused_latency) // 2] * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms; "
            f"RSS {rss_before / 2**20:.0f} -> {rss_after / 2**20:.0f} MiB; throughput before/after "
            f"{200 / baseline_s:.0f}/{200 / recovered_s:.0f} req/s"
        )
    assert server.returncode == 0, log.read_text()[-2000:]
