"""ONNX Runtime backend: MIGraphX / ROCm execution providers with CPU fallback."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..errors import BackendInputError, ModelLoadError
from ..settings import DEFAULT_PROVIDERS
from ..tensors import ORT_TO_V2, TensorSpec, normalize_dim
from .base import Backend

log = logging.getLogger(__name__)

#: Providers whose tensors live in device memory, where IO binding saves copies.
DEVICE_PROVIDERS = {
    "MIGraphXExecutionProvider": "cuda",
    "ROCMExecutionProvider": "cuda",
    "CUDAExecutionProvider": "cuda",
}


def select_providers(requested: Sequence[str], available: Sequence[str]) -> tuple[list[str], list[str]]:
    """Keep the requested providers that this onnxruntime build has, in order,
    always ending with CPU; return (chosen, skipped)."""
    wanted = list(requested) or list(DEFAULT_PROVIDERS)
    chosen = [p for p in wanted if p in available]
    skipped = [p for p in wanted if p not in available]
    if "CPUExecutionProvider" not in chosen:
        chosen.append("CPUExecutionProvider")
    return chosen, skipped


def provider_entries(providers: Sequence[str], device_id: int) -> list[str | tuple[str, dict[str, str]]]:
    """ORT's provider argument: device providers get their `device_id` option."""
    return [(p, {"device_id": str(device_id)}) if p in DEVICE_PROVIDERS else p for p in providers]


def fallback_message(requested: Sequence[str], chosen: Sequence[str], skipped: Sequence[str]) -> str:
    """One log line that shows the whole fallback chain, e.g.
    `MIGraphXExecutionProvider -> ROCMExecutionProvider (unavailable) -> CPU`."""
    chain = " -> ".join(f"{p} (unavailable)" if p in skipped else p for p in (list(requested) or DEFAULT_PROVIDERS))
    return f"execution providers requested: {chain}; using {', '.join(chosen)}"


class OnnxBackend(Backend):
    platform = "onnxruntime_onnx"

    def __init__(
        self,
        path: Path,
        *,
        providers: Sequence[str] = DEFAULT_PROVIDERS,
        intra_op_threads: int = 0,
        inter_op_threads: int = 0,
        profiling: bool = False,
        profile_prefix: Path | None = None,
        io_binding: Literal["auto", "on", "off"] = "auto",
        spinning: bool = False,
        device_id: int = 0,
    ) -> None:
        super().__init__()
        self.path = Path(path)
        self.requested_providers = list(providers)
        self.intra_op_threads = intra_op_threads
        self.inter_op_threads = inter_op_threads
        self.profiling = profiling
        self.profile_prefix = profile_prefix
        self.io_binding_mode = io_binding
        self.spinning = spinning
        self.device_id = device_id
        self.providers: list[str] = []
        self._session: Any = None  # onnxruntime.InferenceSession (untyped)
        self._output_names: list[str] = []
        self._binding_device: str | None = None

    def load(self) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if not self.spinning:
            # Idle runtime threads would otherwise spin and starve the event loop
            # that parses requests on the same cores.
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        if self.intra_op_threads:
            options.intra_op_num_threads = self.intra_op_threads
        if self.inter_op_threads:
            options.inter_op_num_threads = self.inter_op_threads
            if self.inter_op_threads > 1:
                options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
        if self.profiling:
            options.enable_profiling = True
            if self.profile_prefix is not None:
                self.profile_prefix.parent.mkdir(parents=True, exist_ok=True)
                options.profile_file_prefix = str(self.profile_prefix)

        chosen, skipped = select_providers(self.requested_providers, ort.get_available_providers())
        log.info(fallback_message(self.requested_providers, chosen, skipped))
        try:
            session = ort.InferenceSession(
                str(self.path), sess_options=options, providers=provider_entries(chosen, self.device_id)
            )
        except Exception as exc:  # onnxruntime raises its own hierarchy
            raise ModelLoadError(f"cannot load ONNX model {self.path}: {exc}") from exc
        self._session = session
        self.providers = session.get_providers()
        device = DEVICE_PROVIDERS.get(self.providers[0])
        self.device = f"{device}:{self.device_id}" if device else "cpu"
        self.inputs = [_spec(i) for i in session.get_inputs()]
        self.outputs = [_spec(o) for o in session.get_outputs()]
        self._output_names = [o.name for o in self.outputs]
        if self.io_binding_mode == "on" or (self.io_binding_mode == "auto" and self.providers[0] in DEVICE_PROVIDERS):
            self._binding_device = DEVICE_PROVIDERS.get(self.providers[0], "cpu")

    @property
    def prefers_static_shapes(self) -> bool:
        return bool(self.providers) and self.providers[0] == "MIGraphXExecutionProvider"

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        session = self._session
        if session is None:
            raise RuntimeError("model is not loaded")
        try:
            if self._binding_device is not None:
                values = self._run_bound(inputs)
            else:
                values = session.run(self._output_names, dict(inputs))
        except Exception as exc:
            if _is_input_error(exc):
                raise BackendInputError(f"the model rejected the input: {exc}") from exc
            raise
        return dict(zip(self._output_names, values, strict=True))

    def _run_bound(self, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """IO binding: inputs are copied to the device once, outputs are allocated
        there by the runtime and copied back in one go."""
        session = self._session
        binding = session.io_binding()
        for name, arr in inputs.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(arr))
        device_id = 0 if self._binding_device == "cpu" else self.device_id
        for name in self._output_names:
            binding.bind_output(name, self._binding_device, device_id)
        try:
            session.run_with_iobinding(binding)
        except Exception as exc:
            if _is_input_error(exc) or self._binding_device == "cpu":
                raise
            log.warning("IO binding failed on %s (%s); using plain runs", self._binding_device, exc)
            self._binding_device = None
            plain: list[np.ndarray] = session.run(self._output_names, dict(inputs))
            return plain
        bound: list[np.ndarray] = binding.copy_outputs_to_cpu()
        return bound

    def end_profiling(self) -> str | None:
        """Write the profile (if enabled) and return its path."""
        if self._session is not None and self.profiling:
            path: str = self._session.end_profiling()
            return path
        return None

    def close(self) -> None:
        if self.profiling:
            path = self.end_profiling()
            if path:
                log.info("wrote ONNX Runtime profile %s", path)
        self._session = None


def _spec(node: Any) -> TensorSpec:
    shape = None if node.shape is None else tuple(normalize_dim(d) for d in node.shape)
    return TensorSpec(node.name, ORT_TO_V2.get(node.type, node.type), shape)


def _is_input_error(exc: Exception) -> bool:
    """ONNX Runtime signals bad feeds (shape, type) with its InvalidArgument class."""
    return type(exc).__name__ == "InvalidArgument"
