"""INT8 quantization with onnxruntime.quantization, plus the accuracy check
that decides whether the smaller model is fit to serve."""

from __future__ import annotations

import argparse
import logging
import math
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

log = logging.getLogger(__name__)

_ORT_FLOAT_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}


@dataclass(frozen=True)
class QuantizationReport:
    mode: str
    original_bytes: int
    quantized_bytes: int
    max_abs_error: float
    relative_error: float  # ||q - f||_2 / ||f||_2 over all outputs
    tolerance: float

    @property
    def within_tolerance(self) -> bool:
        return self.relative_error <= self.tolerance

    @property
    def size_ratio(self) -> float:
        return self.quantized_bytes / self.original_bytes

    def summary(self) -> str:
        verdict = "OK" if self.within_tolerance else "ABOVE TOLERANCE"
        return (
            f"{self.mode} INT8: {self.original_bytes} -> {self.quantized_bytes} bytes "
            f"({self.size_ratio:.2%}); relative L2 error {self.relative_error:.4f} "
            f"(tolerance {self.tolerance}), max abs error {self.max_abs_error:.4g}: {verdict}"
        )


def _session(path: Path) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def sample_inputs(model: Path, rows: int = 32, seed: int = 0) -> dict[str, np.ndarray]:
    """Standard-normal inputs for a float model (dynamic dims: `rows` for the
    batch dimension, 1 elsewhere), for when no calibration data is given."""
    rng = np.random.default_rng(seed)
    result = {}
    for node in _session(model).get_inputs():
        dtype = _ORT_FLOAT_TYPES.get(node.type)
        if dtype is None:
            raise ValueError(f"input '{node.name}' is {node.type}: pass --calibration data")
        shape = [d if isinstance(d, int) and d > 0 else (rows if i == 0 else 1) for i, d in enumerate(node.shape)]
        result[node.name] = rng.standard_normal(shape).astype(dtype)
    return result


def load_calibration(path: Path, model: Path) -> dict[str, np.ndarray]:
    """`.npy` for a single-input model, `.npz` keyed by input name otherwise."""
    names = [i.name for i in _session(model).get_inputs()]
    loaded = np.load(path)
    if isinstance(loaded, np.ndarray):
        if len(names) != 1:
            raise ValueError(f"model has inputs {names}: use an .npz keyed by input name")
        return {names[0]: loaded}
    data = {k: loaded[k] for k in loaded.files}
    missing = set(names) - set(data)
    if missing:
        raise ValueError(f"calibration file lacks inputs {sorted(missing)}")
    return {k: data[k] for k in names}


def _batches(data: Mapping[str, np.ndarray], batch: int) -> Iterator[dict[str, np.ndarray]]:
    total = len(next(iter(data.values())))
    for start in range(0, total, batch):
        yield {k: v[start : start + batch] for k, v in data.items()}


def quantize_model(
    src: Path,
    dst: Path,
    *,
    mode: Literal["dynamic", "static"] = "dynamic",
    calibration: Mapping[str, np.ndarray] | None = None,
    per_channel: bool = False,
) -> None:
    """Weights to INT8 (dynamic), or weights and activations to INT8 in QDQ form
    calibrated on `calibration` (static)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory() as tmp:
        prepared = Path(tmp) / "prepared.onnx"
        try:
            quant_pre_process(str(src), str(prepared), skip_symbolic_shape=False)
        except Exception as exc:  # pre-processing only improves results; go on without it
            log.warning("quantization pre-processing skipped: %s", exc)
            prepared = src
        if mode == "dynamic":
            quantize_dynamic(str(prepared), str(dst), weight_type=QuantType.QInt8, per_channel=per_channel)
            return
        if calibration is None:
            raise ValueError("static quantization needs calibration data (--calibration)")

        batches = _batches(calibration, 16)

        class Reader(CalibrationDataReader):  # type: ignore[misc]  # onnxruntime ships no types
            def __init__(self) -> None:
                self._it = batches

            def get_next(self) -> dict[str, np.ndarray] | None:
                return next(self._it, None)

        quantize_static(
            str(prepared),
            str(dst),
            Reader(),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            per_channel=per_channel,
            calibrate_method=CalibrationMethod.MinMax,
        )


def compare_models(reference: Path, candidate: Path, inputs: Mapping[str, np.ndarray]) -> tuple[float, float]:
    """(max abs error, relative L2 error) of candidate outputs vs. reference."""
    ref = _session(reference).run(None, dict(inputs))
    got = _session(candidate).run(None, dict(inputs))
    diff_sq = ref_sq = 0.0
    max_abs = 0.0
    for a, b in zip(ref, got, strict=True):
        a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
        diff_sq += float(np.sum((a64 - b64) ** 2))
        ref_sq += float(np.sum(a64**2))
        max_abs = max(max_abs, float(np.max(np.abs(a64 - b64))) if a64.size else 0.0)
    return max_abs, math.sqrt(diff_sq) / max(math.sqrt(ref_sq), 1e-12)


def quantize_and_check(
    src: Path,
    dst: Path,
    *,
    mode: Literal["dynamic", "static"] = "dynamic",
    calibration: Path | None = None,
    per_channel: bool = False,
    tolerance: float = 0.05,
) -> QuantizationReport:
    data = load_calibration(calibration, src) if calibration else None
    if mode == "static" and data is None:
        raise ValueError("static quantization needs --calibration data")
    quantize_model(src, dst, mode=mode, calibration=data, per_channel=per_channel)
    check = data if data is not None else sample_inputs(src)
    max_abs, rel = compare_models(src, dst, check)
    return QuantizationReport(mode, _model_bytes(src), _model_bytes(dst), max_abs, rel, tolerance)


def _model_bytes(path: Path) -> int:
    """Model plus external data files next to it."""
    size = path.stat().st_size
    for extra in path.parent.glob(path.name + ".data"):
        size += extra.stat().st_size
    return size


def run_cli(args: argparse.Namespace) -> int:
    logging.basicConfig(level="INFO", format="%(levelname)s %(name)s: %(message)s")
    try:
        report = quantize_and_check(
            Path(args.model),
            Path(args.out),
            mode=args.mode,
            calibration=Path(args.calibration) if args.calibration else None,
            per_channel=args.per_channel,
            tolerance=args.tolerance,
        )
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}")
        return 2
    print(report.summary())
    return 0 if report.within_tolerance else 1
