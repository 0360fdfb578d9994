"""Each image installs only its extra: the server runs without kopf/kubernetes, `render`
without them too, so the server image stays small and free of the operator's pins. And the demo
installs only its own extra: the programs, ONNX Runtime's CPU build and the emulated cluster."""

from __future__ import annotations

import subprocess
import sys

from tests import extras
from testsupport.crd import ROOT

BLOCK = "import sys; sys.modules.update(kopf=None, kubernetes=None); "


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BLOCK + code], capture_output=True, text=True, timeout=120, check=False, cwd=ROOT
    )


def test_model_server_needs_no_operator_libraries() -> None:
    programs = "model_fetcher.cli, adapters_sidecar.process"  # the fetcher, the adapters sidecar
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


# --- the demo: `bash scripts/demo.sh` installs the `demo` extra and nothing else

# What the demo adds to the two programs' own dependencies: ONNX Runtime's CPU build (the model
# server runs the demo's ONNX model on the CPU) and kmock (the emulated cluster builds on it).
DEMO_ADDS = {"onnxruntime", "kmock"}


def test_demo_script_installs_the_demo_extra_alone() -> None:
    """No scripts/setup.sh (test and lint tools, the Helm engine, apt for Prometheus and etcd),
    no vLLM venv, no apt: one pip install of the demo extra into .venv, then the demo."""
    lines = [line.split("#", 1)[0].strip() for line in (ROOT / "scripts" / "demo.sh").read_text().splitlines()]
    commands = [line for line in lines if line]
    installs = [c for c in commands if "pip install" in c]
    assert installs == [
        ".venv/bin/python -m pip install --quiet --upgrade pip",
        ".venv/bin/python -m pip install --quiet --no-compile -e '.[demo]'",
    ], installs
    for word in ("setup.sh", "setup-vllm", "apt", "helm", "sudo", "requirements"):
        assert not [c for c in commands if word in c], f"scripts/demo.sh runs {word}"
    assert commands[-1] == "exec .venv/bin/python scripts/demo.py"


def test_demo_extra_is_the_programs_and_onnx_runtime_and_the_emulator() -> None:
    """The demo extra holds no test, lint or LLM tool (no pytest, ruff, torch, vLLM): only what
    the operator and the model server need, plus DEMO_ADDS."""
    demo = extras.names(extras.requirements("demo"))
    programs = extras.names(extras.requirements("operator")) | extras.names(extras.requirements("server"))
    assert demo - programs == DEMO_ADDS
    assert programs <= demo
    assert "torch" not in demo


def test_the_test_venv_runs_the_demo_too() -> None:
    """scripts/test.sh installs `test` and `dev`: the demo's extra is within them (tests/test_demo.py
    runs the demo there)."""
    assert extras.names(extras.requirements("demo")) <= extras.names(extras.requirements("test"))
