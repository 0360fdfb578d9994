"""The sidecar as a process: the guard copied next to vLLM, the status port (bounded like the
model server's ports), the loop until SIGTERM, the command line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from bounded_http import signals
from bounded_http.http_protocol import ConnectionLimits, LimitedHttpProtocol
from model_fetcher.errors import FetchError
from model_fetcher.limits import Limits, parse_size
from model_fetcher.trust import trust_ca_bundle

from . import guard
from .sidecar import Engine, Sidecar

log = logging.getLogger("model_server.adapters")

DESCRIPTION = "LoRA adapters of a vLLM pod, loaded and unloaded while it serves: the pod's `adapters` sidecar."

GUARD_MODULE = "rocm_inference_guard"  # the name vLLM imports it under (--middleware)
# The status port's bounds, as the model server's ports have them (its clients are the kubelet's
# probes and the operator, a request or two every few seconds): a client that sends its headers
# slowly, or keeps many connections, holds no memory and no slot for long. 256 connections: enough
# that busy pipelining clients still leave room for the probes, few enough that stalled uploads
# on all of them fit the container's memory (docs/measurements.md#the-figures-behind-the-codes-limits).
STATUS_LIMITS = ConnectionLimits(
    header_timeout_s=5.0,
    body_timeout_s=5.0,
    max_header_bytes=16 * 1024,
    max_connections=256,
    probe_paths=frozenset({"/health/live", "/ready"}),  # answered even with every connection busy
)
STATUS_KEEP_ALIVE_SECONDS = 5
STOP_POLL_SECONDS = 0.1  # how often a step under way looks whether SIGTERM came (as uvicorn does)


def install_guard(plugins: Path) -> Path:
    """guard.py as `rocm_inference_guard.py` in `plugins`, for vLLM's --middleware."""
    plugins.mkdir(parents=True, exist_ok=True)
    target = plugins / f"{GUARD_MODULE}.py"
    partial = plugins / f".{GUARD_MODULE}.py.partial"
    shutil.copyfile(guard.__file__, partial)
    partial.rename(target)
    return target


def status_app(sidecar: Sidecar) -> Starlette:
    """The kubelet's probes and the operator's status reads; nothing here changes anything."""

    async def adapters(request: Request) -> JSONResponse:
        return JSONResponse(sidecar.status())

    async def ready(request: Request) -> JSONResponse:
        settled = sidecar.ready()
        return JSONResponse({"ready": settled}, status_code=200 if settled else 503)

    async def live(request: Request) -> JSONResponse:
        return JSONResponse({"live": True})

    return Starlette(
        routes=[Route("/adapters", adapters), Route("/ready", ready), Route("/health/live", live)],
    )


def status_server(sidecar: Sidecar, host: str, port: int) -> uvicorn.Server:
    """The status port, bounded like the model server's (bounded_http.http_protocol)."""
    config = uvicorn.Config(
        status_app(sidecar),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_keep_alive=STATUS_KEEP_ALIVE_SECONDS,
        http=LimitedHttpProtocol.with_limits(STATUS_LIMITS),
    )
    return uvicorn.Server(config)


async def run(args: argparse.Namespace) -> None:
    """Serve the status, and keep vLLM's adapters equal to the list until SIGTERM, which uvicorn
    catches: a step under way is abandoned (its fetch thread dies with the process), so the
    container stops at once instead of at the end of its grace period."""
    limits = Limits(max_bytes=args.max_bytes, deadline_seconds=args.deadline)
    sidecar = Sidecar(Path(args.desired), Path(args.dir), Engine(args.engine), limits)
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    server = status_server(sidecar, args.host, args.port)
    serving = asyncio.create_task(server.serve())
    log.info("adapters sidecar on %s:%d, vLLM at %s", args.host, args.port, args.engine)

    received = False

    def stopping() -> bool:
        nonlocal received  # a stop signal from before uvicorn's handler (signals.py remembered it)
        received = received or signals.take_received() is not None
        return received or server.should_exit or serving.done()

    try:
        while not stopping():
            step = asyncio.create_task(sidecar.step())
            while not step.done() and not stopping():
                await asyncio.wait({step}, timeout=STOP_POLL_SECONDS)
            if not step.done():
                step.cancel()
                log.info("stopping: the step under way is abandoned")
                break
            if not step.cancelled() and step.exception() is not None:  # the probes go on; so do the steps
                log.error("adapters step failed", exc_info=step.exception())
            await asyncio.wait({serving}, timeout=args.interval)
    finally:
        server.should_exit = True
        await serving
        await sidecar.engine.client.aclose()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m model_server.adapters", description=DESCRIPTION)
    p.add_argument("--desired", required=True, help="the ConfigMap's adapters.json")
    p.add_argument("--dir", required=True, help="where adapters are fetched (a volume vLLM mounts at the same path)")
    p.add_argument("--engine", default="http://127.0.0.1:8080", help="vLLM's URL on loopback")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8081)
    p.add_argument("--plugins", help="copy vLLM's adapter guard middleware here first")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between two looks")
    p.add_argument("--max-bytes", type=parse_size, default=parse_size("20Gi"))
    p.add_argument("--deadline", type=float, default=1800.0, help="seconds one adapter's fetch may take")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    # From here a stop signal is remembered and acted on once the loop runs: uvicorn restores
    # this handler after its graceful stop and raises the signal again, which then ends nothing.
    signals.remember_stop_signals()
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        trust_ca_bundle(os.environ)  # the platform's CA, as for the model's fetch
    except FetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.plugins:
        install_guard(Path(args.plugins))
    asyncio.run(run(args))
    return 0
