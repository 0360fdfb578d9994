"""The import contracts (pyproject.toml, `lint-imports` in scripts/check.sh) catch what they
are for: a copy of the tree with a violating import fails them, naming the import."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LINT_IMPORTS = pathlib.Path(sys.executable).parent / "lint-imports"


def _tree_copy(tmp_path: pathlib.Path) -> pathlib.Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.onnx", "*.pt")
    for package in ("operator", "server", "testsupport", "tests"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


def _lint(tree: pathlib.Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tree / 'operator'}:{tree / 'server'}:{tree}"}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=tree, env=env, capture_output=True, text=True, timeout=120
    )


def _append(path: pathlib.Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n{line}  # noqa\n")


@pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="lint-imports is installed with the dev extra")
def test_violating_imports_break_the_contracts(tmp_path: pathlib.Path) -> None:
    tree = _tree_copy(tmp_path)
    assert _lint(tree).returncode == 0, "the tree as it is keeps its contracts"

    package = tree / "operator" / "inference_operator"
    _append(package / "ownership.py", "import subprocess")  # a pure module starting a process
    _append(package / "models" / "names.py", "from .. import status")  # the bottom layer importing upwards
    _append(package / "models" / "names.py", "from . import service")  # a part of the spec importing the whole
    _append(package / "handlers" / "canary.py", "from . import adapters")  # one feature's handlers importing another's
    _append(package / "prometheus" / "promql.py", "from ..autoscaler import policy")  # metrics importing a feature
    _append(package / "prometheus" / "client.py", "from . import promql")  # the query client importing the queries
    _append(package / "k8s.py", "from .builders import common")  # the API client importing a builder
    _append(package / "builders" / "http_route.py", "from ..stages import canary")  # a builder importing a stage
    _append(package / "stages" / "canary.py", "from . import scale_to_zero")  # one stage importing another
    _append(package / "policy.py", "import detect_secrets")  # the secret detectors beyond the pods' status
    _append(tree / "server" / "model_server" / "batching.py", "import starlette")  # the core importing HTTP
    _append(tree / "server" / "model_server" / "tensors.py", "from . import dataplane")  # a layer importing upwards
    server = tree / "server" / "model_server"
    programs = tree / "server"
    _append(programs / "model_fetcher" / "web.py", "from model_server import dataplane")  # the fetcher using the server
    _append(programs / "adapters_sidecar" / "guard.py", "import httpx")  # vLLM's guard importing beyond the stdlib
    _append(server / "repository.py", "from . import quantize")  # the server importing one of the programs
    _append(server / "grpc_server.py", "from .api import errors")  # gRPC answering through the HTTP layer
    _append(programs / "bounded_http" / "limits.py", "import vllm_front")  # the shared package importing a program
    # One program importing another.
    _append(programs / "vllm_front" / "server.py", "from inference_activator import routes")
    result = _lint(tree)
    assert result.returncode != 0
    report = " ".join(result.stdout.split())
    assert "inference_operator.ownership is not allowed to import subprocess" in report
    assert "inference_operator.models is not allowed to import inference_operator.status" in report
    assert "inference_operator.models.names is not allowed to import inference_operator.models.service" in report
    assert "inference_operator.handlers.canary is not allowed to import inference_operator.handlers.adapters" in report
    assert "inference_operator.prometheus is not allowed to import inference_operator.autoscaler" in report
    prometheus = "inference_operator.prometheus"
    assert f"{prometheus}.client is not allowed to import {prometheus}.promql" in report
    assert "inference_operator.k8s is not allowed to import inference_operator.builders" in report
    assert "inference_operator.builders is not allowed to import inference_operator.stages" in report
    assert "inference_operator.stages.canary is not allowed to import inference_operator.stages.scale_to_zero" in report
    assert "inference_operator.policy -> detect_secrets" in report
    assert "model_server.batching is not allowed to import starlette" in report
    assert "model_server.tensors is not allowed to import model_server.dataplane" in report
    assert "model_fetcher is not allowed to import model_server" in report
    assert "adapters_sidecar.guard is not allowed to import httpx" in report
    assert "model_server.repository is not allowed to import model_server.quantize" in report
    assert "model_server.grpc_server is not allowed to import model_server.api" in report
    assert "bounded_http is not allowed to import vllm_front" in report
    assert "vllm_front is not allowed to import inference_activator" in report
