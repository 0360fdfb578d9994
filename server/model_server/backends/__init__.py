"""Backend selection: which runtime loads a given model file."""

from __future__ import annotations

from pathlib import Path

from ..cpu_budget import threads_per_instance
from ..errors import ModelLoadError
from ..settings import ServerSettings
from .base import Backend

#: Model file names looked for in a version directory, per format.
MODEL_FILES: dict[str, tuple[str, ...]] = {
    "onnx": ("model.onnx",),
    "torchscript": ("model.pt", "model.pth", "model.torchscript"),
    "export": ("model.pt2",),
}

_SUFFIX_FORMAT = {
    ".onnx": "onnx",
    ".pt": "torchscript",
    ".pth": "torchscript",
    ".torchscript": "torchscript",
    ".pt2": "export",
}


def detect_format(path: Path, requested: str) -> str:
    """`auto` -> by file suffix; `torchscript` also accepts `.pt2` export programs."""
    suffix_format = _SUFFIX_FORMAT.get(path.suffix.lower())
    if requested == "auto":
        if suffix_format is None:
            raise ModelLoadError(f"cannot tell the format of {path.name}; pass --format")
        return suffix_format
    if requested == "torchscript" and suffix_format == "export":
        return "export"
    return requested


def create_backend(path: Path, settings: ServerSettings, *, version: str = "1", device_index: int = 0) -> Backend:
    """A not-yet-loaded backend for one model file on one device, configured from settings."""
    fmt = detect_format(path, settings.format)
    threads = threads_per_instance(settings.intra_op_threads, settings.instances)
    if fmt == "onnx":
        from .onnx import OnnxBackend

        return OnnxBackend(
            path,
            providers=settings.providers,
            intra_op_threads=threads,
            inter_op_threads=settings.inter_op_threads,
            profiling=settings.profiling,
            profile_prefix=settings.profile_dir / f"{settings.name}-v{version}-d{device_index}",
            io_binding=settings.io_binding,
            device_id=device_index,
        )
    from .torch import TorchBackend

    return TorchBackend(
        path,
        kind="export" if fmt == "export" else "torchscript",
        device=settings.device,
        device_index=device_index,
        threads=threads,
    )


__all__ = ["MODEL_FILES", "Backend", "create_backend", "detect_format"]
