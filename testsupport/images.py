"""The project's images, built for real with podman, offline, for the real-pods tier.

The Dockerfiles are the shipped ones (server/Dockerfile, operator/Dockerfile) with build
arguments that swap the ROCm base for a Debian base made here by debootstrap from Debian's
package registry, and PyPI for a directory of wheels built beforehand: the builds run with
`--network=none --pull=never`, and every image name is `localhost/...`.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

from testsupport.nodecluster import build_image, save_image

ROOT = pathlib.Path(__file__).resolve().parents[1]
CACHE = (
    pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "rocm-inference-operator" / "pods"
)
BASE_IMAGE = "localhost/debian-python:bookworm"
MODEL_SERVER_IMAGE = "localhost/rocm-inference/model-server:dev"
OPERATOR_IMAGE = "localhost/rocm-inference/operator:dev"
OFFLINE = "--no-index --find-links=/wheels"


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


def base_image() -> str:
    """Debian bookworm with python3 and venv, made by debootstrap once per machine."""
    if _podman_has(BASE_IMAGE):
        return BASE_IMAGE
    with tempfile.TemporaryDirectory(prefix="rio-rootfs-") as tmp:
        rootfs = pathlib.Path(tmp) / "rootfs"
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                "--include=python3,python3-venv,ca-certificates",
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
        subprocess.run(["podman", "import", "-", BASE_IMAGE], stdin=tar.stdout, check=True, capture_output=True)
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


def build_all(out: pathlib.Path) -> list[pathlib.Path]:
    """Build the model-server (CPU variant) and operator images from the shipped Dockerfiles and
    save them as docker-archive tarballs in `out`, for the node's containerd to import."""
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
    out.mkdir(parents=True, exist_ok=True)
    return [
        save_image(tag, out / f"{tag.rsplit('/', 1)[1].replace(':', '-')}.tar")
        for tag in (MODEL_SERVER_IMAGE, OPERATOR_IMAGE)
    ]
