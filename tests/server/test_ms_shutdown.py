"""The real process: `python -m model_server serve`, env settings, metrics port,
and SIGTERM draining every accepted request."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading

import httpx
import pytest

from model_server.lifecycle import Shutdown
from testsupport.onnx_models import slow_scale_model
from testsupport.processes import free_port, serve_command
from testsupport.waiting import eventually, eventually_async


async def poll(client: httpx.AsyncClient, url: str, predicate, timeout: float = 30.0):
    async def answer() -> httpx.Response | None:
        response = await client.get(url)
        return response if predicate(response) else None

    return await eventually_async(answer, timeout=timeout, what=url, ignore=(httpx.TransportError,))


def gauge(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(f'{name}{{model="drainer"}}'):
            return float(line.rsplit(" ", 1)[1])
    return -1.0


@pytest.mark.slow
async def test_sigterm_drains_every_accepted_request_and_exits_zero(tmp_path):
    repo = tmp_path / "models"
    # Each call keeps the runtime busy for about a second: requests queue behind it.
    slow_scale_model(repo / "1" / "model.onnx", 3.0, iterations=800_000)
    port, metrics_port = free_port(), free_port()
    env = {
        **os.environ,
        "MODEL_NAME": "drainer",
        "MODEL_SERVER_MAX_QUEUE": "64",
        "MODEL_SERVER_INTRA_OP_THREADS": "1",
        "MODEL_SERVER_SHUTDOWN_DELAY_S": "0.5",
    }
    cmd = serve_command(
        repo,
        port,
        "--metrics-port",
        str(metrics_port),
        "--format",
        "onnx",
        "--providers",
        "MIGraphXExecutionProvider,ROCMExecutionProvider,CPUExecutionProvider",
        # Behind the busy runtime, requests wait up to 5 s for a batch of 64: queued at SIGTERM.
        "--max-batch-size",
        "64",
        "--max-delay-ms",
        "5000",
        "--drain-timeout",
        "20",
        "--no-watch",
    )
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:
            await poll(client, "/health/ready", lambda r: r.status_code == 200)
            scrape = await client.get(f"http://127.0.0.1:{metrics_port}/metrics")
            assert 'model_server_inflight_requests{model="drainer"}' in scrape.text

            values = list(range(20))
            pending = [asyncio.ensure_future(client.post("/infer", json={"data": [v, 0, 0, 0]})) for v in values]
            await poll(client, "/metrics", lambda r: gauge(r.text, "model_server_inflight_requests") == len(values))
            assert gauge((await client.get("/metrics")).text, "model_server_queue_depth") > 0
            proc.send_signal(signal.SIGTERM)
            not_ready = await poll(client, "/health/ready", lambda r: r.status_code == 503, timeout=5)
            late = await client.post("/infer", json={"data": [100, 0, 0, 0]})  # still inside the delay
            replies = await asyncio.gather(*pending)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = proc.stdout.read()
    assert not_ready.json()["reason"] == "shutting down"
    assert [r.status_code for r in replies] == [200] * len(values), log
    assert [r.json()["result"][0] for r in replies] == [3.0 * v for v in values]
    assert late.status_code == 200 and late.json()["result"][0] == 300.0
    assert code == 0, log
    assert "MIGraphXExecutionProvider (unavailable) -> ROCMExecutionProvider (unavailable)" in log
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{base}/health/live", timeout=2)


async def test_shutdown_stop_from_another_thread_wakes_the_app_at_once():
    shutdown = Shutdown(drain_timeout_s=30)
    waiter = asyncio.ensure_future(shutdown.wait_stopping())
    await asyncio.sleep(0.01)
    assert not waiter.done() and not shutdown.draining
    threading.Timer(0.05, shutdown.stop).start()  # as the shutdown-delay timer does
    await asyncio.wait_for(waiter, timeout=2)
    assert shutdown.draining and shutdown.stopping


async def test_shutdown_stopped_before_anyone_waits_is_not_missed():
    shutdown = Shutdown(drain_timeout_s=30)
    shutdown.stop()
    await asyncio.wait_for(shutdown.wait_stopping(), timeout=1)


def test_shutdown_drain_budget_counts_from_the_listener_closing():
    now = [100.0]
    shutdown = Shutdown(drain_timeout_s=20, clock=lambda: now[0])
    shutdown.drain()
    now[0] += 7  # the shutdown delay does not use up the drain budget
    assert shutdown.draining and not shutdown.stopping and shutdown.drain_budget() == 20
    shutdown.stop()
    now[0] += 12
    assert shutdown.drain_budget() == 8
    now[0] += 60
    assert shutdown.drain_budget() == 0.5  # the queues always get a moment


@pytest.mark.slow
def test_while_draining_responses_close_kept_alive_connections(tmp_path):
    """During the shutdown delay (the pod is leaving the Service) the server still answers, and
    each answer closes its connection, so a client's next request opens a new connection
    instead of racing the listener's close on a kept-alive one."""
    repo = tmp_path / "models"
    slow_scale_model(repo / "1" / "model.onnx", 3.0, iterations=10)
    port = free_port()
    env = {**os.environ, "MODEL_NAME": "drainer", "MODEL_SERVER_SHUTDOWN_DELAY_S": "20"}
    cmd = serve_command(repo, port, "--format", "onnx", "--drain-timeout", "5")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    body = {"data": [[1.0, 2.0, 3.0, 4.0]]}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            ready = lambda: client.get("/health/ready").status_code == 200  # noqa: E731
            eventually(ready, what="the server's readiness", ignore=(httpx.TransportError,))
            serving = client.post("/infer", json=body)
            assert serving.status_code == 200
            assert serving.headers.get("connection", "").lower() != "close"  # kept alive while serving
            proc.send_signal(signal.SIGTERM)
            eventually(lambda: client.get("/health/ready").status_code == 503, what="readiness turned false")
            for _ in range(3):  # each on a new connection, each answered and closed
                draining = client.post("/infer", json=body)
                assert draining.status_code == 200
                assert draining.headers["connection"] == "close"
    finally:
        proc.kill()
        proc.wait(10)
