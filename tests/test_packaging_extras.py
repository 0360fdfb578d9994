"""Each image installs only its extra: the server runs without kopf/kubernetes, `render`
without them too, so the server image stays small and free of the operator's pins."""

from __future__ import annotations

import subprocess
import sys

from testsupport.crd import ROOT

BLOCK = "import sys; sys.modules.update(kopf=None, kubernetes=None); "


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BLOCK + code], capture_output=True, text=True, timeout=120, check=False, cwd=ROOT
    )


def test_model_server_needs_no_operator_libraries() -> None:
    programs = "model_server.storage.cli, model_server.adapters.process"  # the fetcher, the adapters sidecar
    result = run(f"import model_server.app, model_server.__main__, {programs}; print('ok')")
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


def test_render_needs_no_operator_libraries() -> None:
    result = run(
        "from inference_operator.__main__ import main; sys.exit(main(['render', '-f', 'examples/resnet-2gpu.yaml']))"
    )
    assert result.returncode == 0, result.stderr
    assert "amd.com/gpu: '2'" in result.stdout


def test_the_blocker_really_blocks() -> None:
    result = run("import kopf")
    assert result.returncode != 0 and "import of kopf halted" in result.stderr
