"""The operator image and the kind end-to-end script, as far as they can be checked here
(no Docker daemon, no kind): consistency with the chart, shellcheck, the e2e model."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.chart import helm as h

DOCKERFILE = h.ROOT / "operator" / "Dockerfile"
RUN_SH = h.ROOT / "e2e" / "run.sh"


def test_operator_image_runs_as_the_user_the_chart_expects() -> None:
    text = DOCKERFILE.read_text()
    defaults = h.values_of(h.CHART / "values.yaml")
    uid = defaults["podSecurityContext"]["runAsUser"]
    assert re.search(rf"^USER {uid}:{defaults['podSecurityContext']['runAsGroup']}$", text, re.MULTILINE)
    assert re.search(r'^ENTRYPOINT \["inference-operator"\]$', text, re.MULTILINE)
    assert (h.CHART / "templates" / "deployment.yaml").read_text().count("command: [inference-operator]") == 1


def test_operator_image_leaves_the_model_server_out() -> None:
    install = [line for line in DOCKERFILE.read_text().splitlines() if "pip install" in line]
    assert install and all("[server" not in line and "[cpu" not in line for line in install)
    assert "COPY server" not in DOCKERFILE.read_text()


def test_e2e_script_is_shellcheck_clean() -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    done = subprocess.run(["shellcheck", "-x", str(RUN_SH)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout


def test_e2e_script_uses_what_the_chart_and_operator_name() -> None:
    text = RUN_SH.read_text()
    subprocess.run(["bash", "-n", str(RUN_SH)], check=True, timeout=30)
    assert "charts/rocm-inference-operator" in text and "amd.com~1gpu" in text
    # The label the operator's builders put on owned objects, used to check cleanup.
    from inference_operator.builders.common import OWNER_LABEL

    assert f"-l {OWNER_LABEL}=e2e" in text


def test_e2e_model_is_a_valid_onnx_model(tmp_path) -> None:
    ort = pytest.importorskip("onnxruntime")
    subprocess.run(
        [sys.executable, str(h.ROOT / "e2e" / "make_model.py"), str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    session = ort.InferenceSession(str(tmp_path / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"x": np.ones((2, 4), np.float32)})
    assert out.shape == (2, 3)
