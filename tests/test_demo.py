"""The README's demo, end to end: the Deployment the operator writes starts the real server. It
runs with every installed distribution outside the `demo` extra unimportable (the test and lint
tools, torch, ...), in its own process and in the operator's and the server's it starts, as in
the venv `bash scripts/demo.sh` makes."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from tests import extras
from testsupport.crd import ROOT

# The command README.md and docs/getting-started.md give: an install, then scripts/demo.py.
DEMO_COMMAND = "bash scripts/demo.sh"


def demo_env(tmp_path: pathlib.Path) -> dict[str, str]:
    allowed = extras.installed_closure(extras.requirements("demo"))
    blocked = extras.blocking_path(tmp_path / "outside-demo-extra", extras.modules_outside(allowed))
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(blocked) + (f":{path}" if path else "")}


def test_outside_the_demo_extra_nothing_imports(tmp_path: pathlib.Path) -> None:
    """The blocking is real: torch and pytest (installed here) fail to import, numpy and kmock
    (in the demo extra) import."""
    env = demo_env(tmp_path)
    for module, works in (("torch", False), ("pytest", False), ("numpy", True), ("kmock", True)):
        result = subprocess.run(
            [sys.executable, "-c", f"import {module}"], env=env, capture_output=True, text=True, timeout=60
        )
        assert (result.returncode == 0) == works, (module, result.stderr[-500:])
        if not works:
            assert "outside the demo extra" in result.stderr


@pytest.mark.slow
@pytest.mark.integration
def test_demo_serves_the_applied_service(tmp_path: pathlib.Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "demo.py")],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env=demo_env(tmp_path),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "amd.com/gpu: '2'" in out
    assert "value: 0,1" in out
    assert "matches numpy: True" in out
    table = out.split("kubectl get ris -n ml", 1)[1].splitlines()
    assert table[2].split()[:4] == ["resnet-2gpu", "True", "1", "2"]
    assert "'model_version': '3'" in out  # the spec's model.version reached the server


def test_the_demo_command_ends_in_the_demo_this_module_runs() -> None:
    """`bash scripts/demo.sh` installs, then runs scripts/demo.py, the program the test above runs
    (a demo.sh that ran anything else would leave the documented command untested)."""
    script = ROOT / DEMO_COMMAND.split()[1]
    lines = [line.strip() for line in script.read_text().splitlines()]
    steps = [line for line in lines if line and not line.startswith(("#", "set ", "cd "))]
    assert steps and "scripts/demo.py" in steps[-1], steps
