"""ONNX Runtime and torch backends against numpy references."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from model_server.backends import create_backend, detect_format
from model_server.backends.base import example_inputs
from model_server.backends.onnx import OnnxBackend, fallback_message, select_providers
from model_server.errors import BackendInputError, ModelLoadError
from model_server.tensors import TensorSpec
from testsupport.onnx_models import affine_model, int_model

from .helpers import make_settings

pytestmark = pytest.mark.filterwarnings("ignore:`torch\\.jit:DeprecationWarning")


def test_device_providers_get_their_device_id():
    from model_server.backends.onnx import provider_entries

    assert provider_entries(["MIGraphXExecutionProvider", "CPUExecutionProvider"], 1) == [
        ("MIGraphXExecutionProvider", {"device_id": "1"}),
        "CPUExecutionProvider",
    ]


def test_provider_selection_keeps_order_and_falls_back_to_cpu():
    requested = ["MIGraphXExecutionProvider", "ROCMExecutionProvider", "CPUExecutionProvider"]
    chosen, skipped = select_providers(requested, ["ROCMExecutionProvider", "CPUExecutionProvider"])
    assert chosen == ["ROCMExecutionProvider", "CPUExecutionProvider"]
    assert skipped == ["MIGraphXExecutionProvider"]
    chosen, skipped = select_providers(["MIGraphXExecutionProvider"], ["CPUExecutionProvider"])
    assert chosen == ["CPUExecutionProvider"] and skipped == ["MIGraphXExecutionProvider"]
    default, _ = select_providers([], ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert default == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    message = fallback_message(requested, ["CPUExecutionProvider"], requested[:2])
    assert "MIGraphXExecutionProvider (unavailable) -> ROCMExecutionProvider (unavailable)" in message


@pytest.mark.parametrize("io_binding", ["off", "on"])
def test_onnx_backend_matches_numpy(tmp_path, affine_params, io_binding):
    weight, bias = affine_params
    path = affine_model(tmp_path / "m.onnx", weight, bias)
    backend = OnnxBackend(
        path,
        providers=["MIGraphXExecutionProvider", "CPUExecutionProvider"],
        intra_op_threads=1,
        io_binding=io_binding,
    )
    backend.load()
    assert backend.providers == ["CPUExecutionProvider"]
    assert backend.inputs == [TensorSpec("x", "FP32", (-1, 4))]
    assert backend.outputs == [TensorSpec("y", "FP32", (-1, 3))]
    assert backend.batchable
    x = np.random.default_rng(1).standard_normal((5, 4)).astype(np.float32)
    out = backend.infer({"x": x})
    np.testing.assert_allclose(out["y"], x @ weight + bias, rtol=1e-5, atol=1e-5)
    assert backend.warmup([1, 8]) == [1, 8]


def test_onnx_backend_reports_runtime_input_errors_as_client_errors(tmp_path, affine_params):
    backend = OnnxBackend(affine_model(tmp_path / "m.onnx", *affine_params), intra_op_threads=1)
    backend.load()
    with pytest.raises(BackendInputError, match="rejected the input"):
        backend.infer({"x": np.zeros((1, 7), np.float32)})


def test_onnx_backend_typed_outputs(tmp_path):
    backend = OnnxBackend(int_model(tmp_path / "ints.onnx"), intra_op_threads=1)
    backend.load()
    a = np.array([[1, 5], [7, -2]], np.int64)
    b = np.array([[3, 5], [1, 2]], np.int64)
    out = backend.infer({"a": a, "b": b})
    assert out["sum"].dtype == np.int64 and out["sum"].tolist() == (a + b).tolist()
    assert out["gt"].dtype == np.bool_ and out["gt"].tolist() == (a > b).tolist()


def test_model_fault_corrupt_onnx_raises_load_error(tmp_path):
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"definitely not protobuf")
    with pytest.raises(ModelLoadError, match="cannot load ONNX model"):
        OnnxBackend(bad).load()


def test_profiling_writes_a_trace(tmp_path, affine_params):
    backend = OnnxBackend(
        affine_model(tmp_path / "m.onnx", *affine_params),
        intra_op_threads=1,
        profiling=True,
        profile_prefix=tmp_path / "prof" / "tiny",
    )
    backend.load()
    backend.infer({"x": np.zeros((2, 4), np.float32)})
    trace = Path(backend.end_profiling())
    assert trace.parent == tmp_path / "prof" and trace.stat().st_size > 0
    assert any(e.get("cat") == "Node" for e in json.loads(trace.read_text()))


def test_example_inputs_fill_batch_and_dynamic_dims():
    specs = [TensorSpec("a", "FP32", (-1, -1, 3)), TensorSpec("b", "INT64", (-1,))]
    example = example_inputs(specs, 4)
    assert example["a"].shape == (4, 1, 3) and example["b"].dtype == np.int64
    assert example_inputs([TensorSpec("t", "FP32", None)], 2) is None


def test_detect_format():
    assert detect_format(Path("m.onnx"), "auto") == "onnx"
    assert detect_format(Path("m.pt"), "auto") == "torchscript"
    assert detect_format(Path("m.pt2"), "torchscript") == "export"
    with pytest.raises(ModelLoadError, match="pass --format"):
        detect_format(Path("m.bin"), "auto")


# --------------------------------------------------------------------------- torch


@pytest.fixture(scope="module")
def torch_linear():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    linear = torch.nn.Linear(4, 3)
    weight = linear.weight.detach().numpy().T.copy()
    bias = linear.bias.detach().numpy().copy()
    return torch, linear, weight, bias


def test_torchscript_backend_with_signature(tmp_path, torch_linear):
    torch, linear, weight, bias = torch_linear
    version = tmp_path / "1"
    version.mkdir()
    torch.jit.trace(linear, torch.zeros(2, 4)).save(str(version / "model.pt"))
    (version / "signature.json").write_text(
        json.dumps(
            {
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 3]}],
            }
        )
    )
    backend = create_backend(version / "model.pt", make_settings(version / "model.pt"))
    backend.load()
    assert backend.platform == "pytorch_torchscript" and backend.device == "cpu"
    assert backend.batchable and [s.name for s in backend.outputs] == ["y"]
    x = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(backend.infer({"x": x})["y"], x @ weight + bias, rtol=1e-5, atol=1e-6)
    assert backend.warmup([1, 4]) == [1, 4]


def test_torchscript_without_signature_uses_forward_argument_names(tmp_path, torch_linear):
    torch, linear, weight, bias = torch_linear
    torch.jit.script(linear).save(str(tmp_path / "model.pt"))
    backend = create_backend(tmp_path / "model.pt", make_settings(tmp_path / "model.pt"))
    backend.load()
    assert [s.name for s in backend.inputs] == ["input"]
    assert backend.warmup([4]) == []  # shapes unknown: nothing to warm up with
    out = backend.infer({"input": np.ones((2, 4), np.float32)})
    np.testing.assert_allclose(out["output_0"], np.ones((2, 4)) @ weight + bias, rtol=1e-5, atol=1e-6)


def test_torch_export_program(tmp_path, torch_linear):
    torch, linear, weight, bias = torch_linear
    batch = torch.export.Dim("batch")
    program = torch.export.export(linear, (torch.zeros(2, 4),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(tmp_path / "model.pt2"))
    backend = create_backend(tmp_path / "model.pt2", make_settings(tmp_path / "model.pt2", format="torchscript"))
    backend.load()
    assert backend.platform == "pytorch_export"
    assert backend.inputs[0].shape == (-1, 4) and backend.inputs[0].datatype == "FP32"
    assert backend.outputs[0].shape == (-1, 3) and backend.batchable
    x = np.random.default_rng(3).standard_normal((5, 4)).astype(np.float32)
    out = backend.infer({backend.inputs[0].name: x})
    np.testing.assert_allclose(next(iter(out.values())), x @ weight + bias, rtol=1e-5, atol=1e-6)


def test_malformed_signature_is_a_load_error(tmp_path, torch_linear):
    torch, linear, *_ = torch_linear
    torch.jit.script(linear).save(str(tmp_path / "model.pt"))
    (tmp_path / "signature.json").write_text('{"inputs": [{"name": "x", "datatype": "FLOAT"}]}')
    backend = create_backend(tmp_path / "model.pt", make_settings(tmp_path / "model.pt"))
    with pytest.raises(ModelLoadError, match="unknown datatype 'FLOAT'"):
        backend.load()
