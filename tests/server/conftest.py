"""Fixtures shared by the model server tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from testsupport.onnx_models import affine_model


@pytest.fixture
def affine_params() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(42)
    return rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)


@pytest.fixture
def affine_repo(tmp_path: Path, affine_params) -> Path:
    """A repository with one version of the affine model."""
    weight, bias = affine_params
    affine_model(tmp_path / "repo" / "1" / "model.onnx", weight, bias)
    return tmp_path / "repo"
