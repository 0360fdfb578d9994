"""`python bench/emulated_device.py serve ...`: the model server, with its ONNX Runtime call
replaced by an accelerator-shaped wait.

`EMULATED_DEVICE_SECONDS` (JSON, rows -> seconds) says how long a call of that many rows takes.
The call sleeps that long with the GIL released and no CPU used, as a host thread does while a
GPU computes, then returns zeros of the model's output shapes. One call at a time, as one
device runs one batch's kernels at a time: a second batch in flight waits its turn.
Everything else is the server as it ships: HTTP, JSON, the batcher, the executor thread,
metrics and the answer. Importing this module changes nothing; running it does.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping

import numpy as np

from model_server.backends.base import Backend

ENV = "EMULATED_DEVICE_SECONDS"
InferFn = Callable[[Backend, Mapping[str, np.ndarray]], dict[str, np.ndarray]]


def device_call(seconds: Mapping[int, float]) -> InferFn:
    """A `Backend.infer` for a device whose call of N rows takes `seconds[N]` (the largest
    entry's time past the table's end), one call at a time."""
    table = {int(rows): float(s) for rows, s in seconds.items()}
    largest = max(table)
    device = threading.Lock()

    def infer(self: Backend, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = next(iter(inputs.values())).shape[0]
        with device:
            time.sleep(table[min(rows, largest)])
        return {
            spec.name: np.zeros((rows, *(max(1, d) for d in (spec.shape or (-1,))[1:])), dtype=spec.dtype)
            for spec in self.outputs
        }

    return infer


if __name__ == "__main__":
    from model_server.__main__ import main
    from model_server.backends.onnx import OnnxBackend

    OnnxBackend.infer = device_call(json.loads(os.environ[ENV]))  # type: ignore[method-assign]
    sys.exit(main(sys.argv[1:]))
