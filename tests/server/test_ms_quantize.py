"""INT8 quantization: smaller model, outputs within the stated tolerance."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from model_server.__main__ import main
from model_server.quantize import compare_models, quantize_and_check
from testsupport.onnx_models import mlp_model

TOLERANCE = 0.05


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return mlp_model(tmp_path_factory.mktemp("q") / "mlp.onnx", [64, 256, 256, 10])


def run(path, x):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_dynamic_quantization_is_smaller_and_close(mlp, tmp_path):
    out = tmp_path / "mlp.int8.onnx"
    report = quantize_and_check(mlp, out, mode="dynamic", tolerance=TOLERANCE)
    assert out.stat().st_size < mlp.stat().st_size / 3  # FP32 -> INT8 weights
    assert report.quantized_bytes == out.stat().st_size and report.size_ratio < 1 / 3
    assert report.within_tolerance, report.summary()
    # Independent check on fresh data, not the data the report used.
    x = np.random.default_rng(123).standard_normal((16, 64)).astype(np.float32)
    ref, got = run(mlp, x), run(out, x)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < TOLERANCE
    assert not np.array_equal(got, ref)  # it really is a different (quantized) model


def test_static_quantization_with_calibration_file(mlp, tmp_path):
    calibration = tmp_path / "calib.npy"
    np.save(calibration, np.random.default_rng(5).standard_normal((64, 64)).astype(np.float32))
    out = tmp_path / "mlp.qdq.onnx"
    report = quantize_and_check(mlp, out, mode="static", calibration=calibration, tolerance=TOLERANCE)
    assert report.size_ratio < 1 / 3 and report.within_tolerance, report.summary()
    x = np.random.default_rng(321).standard_normal((16, 64)).astype(np.float32)
    max_abs, rel = compare_models(mlp, out, {"x": x})
    assert 0 < rel < TOLERANCE and max_abs > 0


def test_cli_reports_and_fails_above_tolerance(mlp, tmp_path, capsys):
    out = tmp_path / "cli.onnx"
    assert main(["quantize", "--model", str(mlp), "--out", str(out)]) == 0
    assert "relative L2 error" in capsys.readouterr().out and out.exists()
    # An impossible tolerance must fail the command (exit 1), not pass silently.
    assert main(["quantize", "--model", str(mlp), "--out", str(out), "--tolerance", "0"]) == 1
    assert "ABOVE TOLERANCE" in capsys.readouterr().out
    assert main(["quantize", "--model", str(mlp), "--out", str(out), "--mode", "static"]) == 2
    assert "calibration" in capsys.readouterr().out
