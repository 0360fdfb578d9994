"""Write a tiny ONNX model (y = x @ W + b, x: [batch, 4] float32 -> y: [batch, 3]) for the
kind end-to-end test: small enough to build into a "modelcar" image in a second.

    python e2e/make_model.py OUT_DIR      # writes OUT_DIR/1/model.onnx
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def build() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weights = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "W")
    bias = numpy_helper.from_array(np.zeros(3, dtype=np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])],
        "e2e-linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        initializer=[weights, bias],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = pathlib.Path(sys.argv[1]) / "1" / "model.onnx"
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(build(), out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
