"""Each program is a package of its own (server/<program>/), and the commands the operator and
the chart render keep starting it: `python -m model_server.storage` is the model fetcher,
`python -m model_server.adapters` the adapters sidecar (`python -m model_server front|activator`,
the vLLM front and the activator, are run by tests/server/test_vllm_front.py and
test_activator_grpc.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def usage(*args: str) -> str:
    result = subprocess.run([sys.executable, *args, "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize(
    ("rendered", "program"),
    [("model_server.storage", "model_fetcher"), ("model_server.adapters", "adapters_sidecar")],
)
def test_the_rendered_command_runs_the_program_package(rendered: str, program: str) -> None:
    assert usage("-m", rendered) == usage("-m", program)
