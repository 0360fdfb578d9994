"""Small ONNX models built with onnx.helper, for the tests, the benchmarks and the demo.

Each is a few lines of linear algebra, so a test can compute the expected answer with numpy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

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


def slow_scale_model(path: Path, factor: float, iterations: int, width: int = 4) -> Path:
    """y = x * factor after `iterations` trips of a do-nothing Loop: a model whose every
    call keeps the runtime busy for a while, so requests queue behind it."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Abs", ["v_in"], ["abs"])],
        "spin",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, ["N", width]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("abs", TensorProto.FLOAT, ["N", width]),
        ],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Loop", ["trips", "cond", "x"], ["spun"], body=body),
            helper.make_node("Sub", ["spun", "spun"], ["zero"]),  # depends on the loop: not folded
            helper.make_node("Mul", ["x", "factor"], ["scaled"]),
            helper.make_node("Add", ["scaled", "zero"], ["y"]),
        ],
        "slow_scale",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])],
        [
            numpy_helper.from_array(np.array(iterations, np.int64), "trips"),
            numpy_helper.from_array(np.array(True), "cond"),
            numpy_helper.from_array(np.array(factor, np.float32), "factor"),
        ],
    )
    return save_model(graph, path)
