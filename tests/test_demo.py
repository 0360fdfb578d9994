"""The README's demo, end to end: the Deployment the operator writes starts the real server."""

from __future__ import annotations

import subprocess
import sys

import pytest

from testsupport.crd import ROOT


@pytest.mark.slow
@pytest.mark.integration
def test_demo_serves_the_applied_service() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "demo.py")], capture_output=True, text=True, timeout=240, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "amd.com/gpu: '2'" in out
    assert "value: 0,1" in out
    assert "matches numpy: True" in out
    table = out.split("kubectl get ris -n ml", 1)[1].splitlines()
    assert table[2].split()[:4] == ["resnet-2gpu", "True", "1", "2"]
    assert "'model_version': '3'" in out  # the spec's model.version reached the server
