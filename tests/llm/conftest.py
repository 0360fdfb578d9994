"""Real vLLM for the LLM tests: its fixtures. The venv, the tiny Llama and the kubelet stand-in
live in testsupport/vllm.py, which bench/ shares; here a missing venv becomes a skip (a failure
in CI)."""

from __future__ import annotations

import os
import pathlib

import pytest

from tests.conftest import cluster, operator  # noqa: F401  (fixtures)
from testsupport import vllm


def vllm_python() -> pathlib.Path:
    """The vLLM venv's interpreter; CI installs it (scripts/setup.sh), elsewhere the test skips."""
    try:
        return vllm.vllm_python()
    except vllm.VllmNotInstalled as missing:
        if os.environ.get("CI"):
            pytest.fail(str(missing))
        pytest.skip(str(missing))


@pytest.fixture(scope="module")
def tiny_llama() -> pathlib.Path:
    """testsupport.vllm.build_tiny_llama's model, at its fixed path beside the venv."""
    vllm_python()
    out = vllm.build_tiny_llama()
    assert (out / "config.json").exists() and (out / "tokenizer.json").exists()
    return out
