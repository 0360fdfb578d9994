"""bench/emulated_device.py, the device-shaped runtime behind bench/device_ceiling.py: what the
benchmark's figures rest on. A call takes its table's time, uses no CPU meanwhile, runs one at a
time, and answers with the model's output shapes; launched, it is the real server in front of it."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import sys
import threading
import time
import urllib.request
from types import SimpleNamespace

import numpy as np
import pytest

from model_server.tensors import TensorSpec
from testsupport.onnx_models import mlp_model
from testsupport.processes import free_port, running, serve_command

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def emulated():
    spec = importlib.util.spec_from_file_location("emulated_device", BENCH / "emulated_device.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BACKEND = SimpleNamespace(outputs=[TensorSpec("y", "FP32", (-1, 3)), TensorSpec("ids", "INT64", (-1, -1))])


class Waits:
    """The device's waits, recorded in order (each begins and ends), then made for real."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.events: list[tuple[str, str]] = []

    def sleep(self, seconds: float) -> None:
        self.seconds.append(seconds)
        name = threading.current_thread().name
        self.events.append(("begin", name))
        time.sleep(seconds)
        self.events.append(("end", name))


@pytest.fixture
def waits(emulated, monkeypatch: pytest.MonkeyPatch) -> Waits:
    recorded = Waits()
    monkeypatch.setattr(emulated, "time", SimpleNamespace(sleep=recorded.sleep))
    return recorded


def test_a_call_answers_zeros_of_the_outputs_shapes_after_its_tables_time(emulated, waits: Waits) -> None:
    infer = emulated.device_call({"1": 0.01, "2": 0.05})
    out = infer(BACKEND, {"x": np.ones((2, 4), np.float32)})
    assert out["y"].shape == (2, 3) and out["y"].dtype == np.float32 and not out["y"].any()
    assert out["ids"].shape == (2, 1) and out["ids"].dtype == np.int64
    # Past the table's end, the largest entry's time.
    assert infer(BACKEND, {"x": np.ones((7, 4), np.float32)})["y"].shape == (7, 3)
    assert waits.seconds == [0.05, 0.05]


def test_calls_run_one_at_a_time_and_wait_without_cpu(emulated, waits: Waits) -> None:
    infer = emulated.device_call({1: 0.2})
    cpu: list[float] = []

    def call() -> None:
        before = time.thread_time()
        infer(BACKEND, {"x": np.ones((1, 4), np.float32)})
        cpu.append(time.thread_time() - before)

    threads = [threading.Thread(target=call, name=f"call-{n}") for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Two calls on one device: the second's wait began after the first's ended.
    (first, begun), (ended, by), (second, then), (last, _) = waits.events
    assert (first, ended, second, last) == ("begin", "end", "begin", "end") and begun == by != then
    # Waiting on the device is not computing: a busy loop would show 0.2 s of CPU here.
    assert max(cpu) < 0.05, cpu


def test_launched_it_is_the_real_server_in_front_of_the_device(tmp_path: pathlib.Path) -> None:
    model = mlp_model(tmp_path / "model.onnx", [4, 8, 3])
    port = free_port()
    command = serve_command(model, port, "--model-name", "m", "--log-level", "warning")
    command = [sys.executable, str(BENCH / "emulated_device.py"), *command[command.index("serve") :]]
    env = {**os.environ, "EMULATED_DEVICE_SECONDS": json.dumps({1: 0.2})}
    base = f"http://127.0.0.1:{port}"
    with running(command, env=env, log=tmp_path / "server.log", ready_url=f"{base}/v2/models/m/ready", timeout=120):
        body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
        request = urllib.request.Request(
            f"{base}/v2/models/m/infer", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.load(response)
        # The real model would not answer zeros for this input; the device does.
        assert answer["outputs"][0]["shape"] == [1, 3] and answer["outputs"][0]["data"] == [0.0, 0.0, 0.0]
