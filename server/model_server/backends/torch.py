"""torch backend for TorchScript (`.pt`) and `torch.export` (`.pt2`) programs.

ROCm builds of torch expose HIP devices as `cuda`, so the same code runs on
AMD GPUs and on CPU. TorchScript files carry no shapes, so an optional
`signature.json` next to the model names and types the tensors:
`{"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}], "outputs": [...]}`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..errors import ModelLoadError
from ..tensors import V2_DATATYPES, TensorSpec, normalize_dim
from .base import Backend

log = logging.getLogger(__name__)

SIGNATURE_FILE = "signature.json"

_TORCH_TO_V2 = {
    "torch.bool": "BOOL",
    "torch.uint8": "UINT8",
    "torch.int8": "INT8",
    "torch.int16": "INT16",
    "torch.int32": "INT32",
    "torch.int64": "INT64",
    "torch.float16": "FP16",
    "torch.float32": "FP32",
    "torch.float64": "FP64",
}


def resolve_device(requested: str, cuda_available: bool) -> str:
    """`auto` picks the GPU (HIP shows up as `cuda` on ROCm) when there is one."""
    if requested == "auto":
        return "cuda" if cuda_available else "cpu"
    if requested == "cuda" and not cuda_available:
        raise ModelLoadError("device 'cuda' was requested but torch sees no GPU")
    return requested


def read_signature(path: Path) -> tuple[list[TensorSpec], list[TensorSpec]] | None:
    """Parse `signature.json` (None if absent; ModelLoadError if malformed)."""
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
        return _specs(raw.get("inputs", [])), _specs(raw.get("outputs", []))
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ModelLoadError(f"malformed {path}: {exc}") from exc


def _specs(items: list[dict[str, Any]]) -> list[TensorSpec]:
    specs = []
    for item in items:
        datatype = item["datatype"]
        if datatype not in V2_DATATYPES:
            raise ValueError(f"unknown datatype {datatype!r} for {item['name']!r}")
        shape = item.get("shape")
        specs.append(
            TensorSpec(
                str(item["name"]),
                datatype,
                None if shape is None else tuple(normalize_dim(d) for d in shape),
            )
        )
    return specs


class TorchBackend(Backend):
    def __init__(
        self,
        path: Path,
        *,
        kind: Literal["torchscript", "export"] = "torchscript",
        device: str = "auto",
        device_index: int = 0,
        threads: int = 0,
    ) -> None:
        super().__init__()
        self.path = Path(path)
        self.kind = kind
        self.requested_device = device
        self.device_index = device_index
        self.threads = threads
        self._module: Any = None
        self._torch: Any = None

    @property
    def platform(self) -> str:  # type: ignore[override]
        return "pytorch_torchscript" if self.kind == "torchscript" else "pytorch_export"

    def load(self) -> None:
        try:
            import torch
        except ImportError as exc:  # the ROCm image may ship without torch
            raise ModelLoadError("torch is not installed in this image") from exc
        self._torch = torch
        self.device = resolve_device(self.requested_device, torch.cuda.is_available())
        if self.device == "cuda":
            self.device = f"cuda:{self.device_index}"
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            if self.kind == "torchscript":
                module = torch.jit.load(str(self.path), map_location=self.device)  # type: ignore[no-untyped-call]
                inputs = [TensorSpec(arg.name, "FP32", None) for arg in module.forward.schema.arguments[1:]]
                outputs: list[TensorSpec] = []
            else:
                program = torch.export.load(str(self.path))
                inputs, outputs = _export_specs(program)
                module = program.module().to(self.device)
        except ModelLoadError:
            raise
        except Exception as exc:
            raise ModelLoadError(f"cannot load torch model {self.path}: {exc}") from exc
        if self.kind == "torchscript":
            module.eval()  # exported programs are already in inference form
        signature = read_signature(self.path.parent / SIGNATURE_FILE)
        if signature is not None:
            inputs, outputs = signature
        self._module = module
        self.inputs, self.outputs = inputs, outputs

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self._torch
        tensors = [torch.from_numpy(_writable(inputs[spec.name])).to(self.device) for spec in self.inputs]
        with torch.inference_mode():
            result = self._module(*tensors)
        return self._name_outputs(result)

    def _name_outputs(self, result: Any) -> dict[str, np.ndarray]:
        if isinstance(result, Mapping):
            return {str(k): _to_numpy(v) for k, v in result.items()}
        values = list(result) if isinstance(result, (tuple, list)) else [result]
        names = [s.name for s in self.outputs]
        if len(names) != len(values):
            names = [f"output_{i}" for i in range(len(values))]
        return {name: _to_numpy(v) for name, v in zip(names, values, strict=True)}

    def close(self) -> None:
        self._module = None


def _export_specs(program: Any) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Names, dtypes and (symbolic -> -1) shapes from an ExportedProgram's graph."""
    user_inputs = list(program.graph_signature.user_inputs)
    user_outputs = list(program.graph_signature.user_outputs)
    by_name = {node.name: node for node in program.graph.nodes}
    inputs = [_fake_spec(name, by_name[name].meta.get("val")) for name in user_inputs]
    output_node = next(n for n in program.graph.nodes if n.op == "output")
    values = [getattr(a, "meta", {}).get("val") for a in output_node.args[0]]
    outputs = [_fake_spec(name, val) for name, val in zip(user_outputs, values, strict=False)]
    return inputs, outputs


def _fake_spec(name: str, val: Any) -> TensorSpec:
    if val is None or not hasattr(val, "shape"):
        return TensorSpec(name, "FP32", None)
    datatype = _TORCH_TO_V2.get(str(val.dtype), "FP32")
    return TensorSpec(name, datatype, tuple(normalize_dim(d) for d in val.shape))


def _writable(arr: np.ndarray) -> np.ndarray:
    return arr if arr.flags.writeable and arr.flags.c_contiguous else np.array(arr, order="C")


def _to_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):
        array: np.ndarray = value.detach().cpu().numpy()
        return array
    return np.asarray(value)
