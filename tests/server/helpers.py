"""Test helpers: test settings and a real uvicorn server on a loopback port (the models
themselves come from testsupport.onnx_models)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import uvicorn
from prometheus_client import CollectorRegistry

from model_server.app import create_app
from model_server.backends.base import Backend
from model_server.settings import ServerSettings
from testsupport.waiting import eventually, eventually_async


def make_settings(model: Path, **overrides) -> ServerSettings:
    """Settings for tests: one ORT thread, no file watching unless asked."""
    base = dict(
        model=model,
        model_name="tiny",
        intra_op_threads=1,
        inter_op_threads=1,
        max_delay_ms=2,
        watch=False,
        providers=["CPUExecutionProvider"],
        drain_timeout_s=5,
    )
    base.update(overrides)
    return ServerSettings(**base)


class RunningServer:
    def __init__(self, app, url: str, registry: CollectorRegistry) -> None:
        self.app = app
        self.url = url
        self.registry = registry

    @property
    def state(self):
        return self.app.state.server

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        return self.registry.get_sample_value(name, labels or {})

    def wait_scanned(self, timeout: float = 30) -> None:
        """Until the repository's first scan has finished (the server runs in another thread)."""
        eventually(lambda: self.state.repository.scanned, timeout=timeout, interval=0.01, what="the first scan")


def wait_started(app: Any, started: Callable[[], bool], wait_ready: bool, timeout: float = 30) -> None:
    """Until `started()` (the server thread listens) and, with `wait_ready`, the model is ready."""
    eventually(started, timeout=timeout, interval=0.01, what="the server's start")
    if wait_ready:
        repo = app.state.server.repository
        eventually(
            lambda: repo.not_ready_reason() is None, timeout=timeout, interval=0.01, what="the model's readiness"
        )


@contextlib.contextmanager
def running_server(settings: ServerSettings, *, wait_ready: bool = True, **app_kwargs) -> Iterator[RunningServer]:
    """A real uvicorn server for `settings` on a free loopback port, in a thread."""
    registry = CollectorRegistry()
    app = create_app(settings, registry=registry, gpu_reader=app_kwargs.pop("gpu_reader", None), **app_kwargs)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    running = RunningServer(app, f"http://127.0.0.1:{port}", registry)
    try:
        wait_started(app, lambda: server.started, wait_ready)
        yield running
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


class HeldRuntime:
    """A backend factory whose ONNX instances hold every request (not warmup) until
    `release()`: the runtime stays busy, so requests pile up behind it the same way
    on every run (adaptive batching only forms batches behind a busy runtime)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.held = 0  # request calls that reached the runtime

    def release(self) -> None:
        self.gate.set()

    def __call__(self, path: Path, settings: ServerSettings, version: str, index: int) -> Backend:
        from model_server.backends.onnx import OnnxBackend

        gate, runtime = self.gate, self

        class Held(OnnxBackend):
            warming = False

            def warmup(self, batch_sizes: Iterable[int]) -> list[int]:
                self.warming = True
                try:
                    return super().warmup(batch_sizes)
                finally:
                    self.warming = False

            def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
                if not self.warming:
                    runtime.held += 1
                    gate.wait(30)
                return super().infer(inputs)

        return Held(path, providers=settings.providers, intra_op_threads=1, device_id=index)


async def until(condition: Callable[[], bool], timeout: float = 30) -> None:
    """Poll `condition` on the running loop (the server runs in another thread)."""
    await eventually_async(condition, timeout=timeout, interval=0.005)


def binary_request(
    shape: list[int], blob: bytes, datatype: str = "FP32", **fields: Any
) -> tuple[bytes, dict[str, str]]:
    """A v2 request whose input `x` travels in the binary extension: its body and headers.
    `fields` go into the JSON header beside `inputs` (`outputs`, `parameters`)."""
    header = json.dumps(
        {
            "inputs": [
                {"name": "x", "datatype": datatype, "shape": shape, "parameters": {"binary_data_size": len(blob)}}
            ],
            **fields,
        }
    ).encode()
    return header + blob, {"Inference-Header-Content-Length": str(len(header)), "content-type": "application/json"}
