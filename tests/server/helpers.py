"""Test helpers: tiny ONNX models built with onnx.helper, test settings, and a
real uvicorn server on a loopback port."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import uvicorn
from onnx import TensorProto, helper, numpy_helper
from prometheus_client import CollectorRegistry

from model_server.app import create_app
from model_server.settings import ServerSettings

OPSET = [helper.make_opsetid("", 17)]


def save_model(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=OPSET, producer_name="tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def affine_model(path: Path, weight: np.ndarray, bias: np.ndarray, batch: str | int = "N") -> Path:
    """y = x @ W + b with input x [batch, in] FP32 and output y [batch, out]."""
    n_in, n_out = weight.shape
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["y"]),
        ],
        "affine",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, n_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, n_out])],
        [
            numpy_helper.from_array(weight.astype(np.float32), "W"),
            numpy_helper.from_array(bias.astype(np.float32), "b"),
        ],
    )
    return save_model(graph, path)


def scale_model(path: Path, factor: float, width: int = 4) -> Path:
    """y = x * factor: each version of a repository gets its own factor."""
    return affine_model(path, np.eye(width, dtype=np.float32) * factor, np.zeros(width, np.float32))


def int_model(path: Path) -> Path:
    """Two INT64 inputs: `sum` = a + b (INT64) and `gt` = a > b (BOOL)."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["sum"]), helper.make_node("Greater", ["a", "b"], ["gt"])],
        "ints",
        [
            helper.make_tensor_value_info("a", TensorProto.INT64, ["N", 2]),
            helper.make_tensor_value_info("b", TensorProto.INT64, ["N", 2]),
        ],
        [
            helper.make_tensor_value_info("sum", TensorProto.INT64, ["N", 2]),
            helper.make_tensor_value_info("gt", TensorProto.BOOL, ["N", 2]),
        ],
    )
    return save_model(graph, path)


def mlp_model(path: Path, sizes: list[int], seed: int = 0) -> Path:
    """Dense ReLU MLP with He-initialised weights (quantization and bench)."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    prev = "x"
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        w = (rng.standard_normal((a, b)) * np.sqrt(2.0 / a)).astype(np.float32)
        inits += [
            numpy_helper.from_array(w, f"W{i}"),
            numpy_helper.from_array(np.zeros(b, np.float32), f"b{i}"),
        ]
        nodes += [
            helper.make_node("MatMul", [prev, f"W{i}"], [f"m{i}"]),
            helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
        ]
        prev = f"a{i}"
        if i < len(sizes) - 2:
            nodes.append(helper.make_node("Relu", [prev], [f"r{i}"]))
            prev = f"r{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", sizes[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", sizes[-1]])],
        inits,
    )
    return save_model(graph, path)


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
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        if wait_ready:
            repo = app.state.server.repository
            while repo.not_ready_reason() is not None:
                assert time.monotonic() < deadline, f"model not ready: {repo.not_ready_reason()}"
                time.sleep(0.01)
        yield running
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
