"""The small interface every runtime implements, so batching, versions and the
HTTP layer never depend on ONNX Runtime or torch directly."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import ClassVar

import numpy as np

from ..tensors import TensorSpec, is_batchable

log = logging.getLogger(__name__)


class Backend(ABC):
    """A loaded model. `infer` is called from one worker thread at a time per
    batching worker; implementations must not touch the event loop."""

    platform: ClassVar[str] = "unknown"

    def __init__(self) -> None:
        self.inputs: list[TensorSpec] = []
        self.outputs: list[TensorSpec] = []
        self.device: str = "cpu"

    @abstractmethod
    def load(self) -> None:
        """Read the model and fill `inputs`/`outputs`; raise on a bad model."""

    @abstractmethod
    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch; outputs keep the batch as their leading dimension."""

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release runtime resources (device memory, sessions)."""

    @property
    def prefers_static_shapes(self) -> bool:
        """True when every new input shape costs a compile (pad batches to buckets)."""
        return False

    @property
    def batchable(self) -> bool:
        return is_batchable(self.inputs, self.outputs)

    def warmup(self, batch_sizes: Iterable[int]) -> list[int]:
        """Run zero-filled batches so the first real request pays no compile or
        allocation cost; returns the sizes actually run."""
        done = []
        for rows in sorted(set(batch_sizes)) if self.batchable else [1]:
            example = example_inputs(self.inputs, rows)
            if example is None:
                log.info("skipping warmup: input shapes are not fully known")
                break
            self.infer(example)
            done.append(rows)
        return done


def example_inputs(specs: Sequence[TensorSpec], rows: int) -> dict[str, np.ndarray] | None:
    """Zero inputs for `specs` with `rows` in the batch dimension and 1 in other
    dynamic dimensions; None when a rank is unknown."""
    result: dict[str, np.ndarray] = {}
    for spec in specs:
        if spec.shape is None:
            return None
        shape = tuple(rows if (i == 0 and d == -1) else (1 if d == -1 else d) for i, d in enumerate(spec.shape))
        if spec.datatype == "BYTES":
            arr = np.full(shape, "", dtype=object)
        else:
            arr = np.zeros(shape, dtype=spec.dtype)
        result[spec.name] = arr
    return result
