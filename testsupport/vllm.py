"""Real vLLM on loopback, for the LLM tests and bench/: its venv, a tiny Llama, a kubelet stand-in.

vLLM's CPU build lives in a venv of its own (scripts/setup-vllm.sh; it pins its own torch and
transformers). The callers play the kubelet: they take the container the operator rendered and
run its own command line here, with the volume mounts, the pod address and the device wiring of
a real node replaced by their loopback equivalents.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from typing import Any

from testsupport.processes import wait_http

VENV = pathlib.Path(
    os.environ.get("VLLM_VENV")
    or pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
    / "rocm-inference-operator"
    / "vllm-venv"
)
# What a CPU node needs instead of a GPU's memory: the KV cache in host RAM (GiB). And a
# node-local cache for vLLM's compiled graphs (half of its start on a CPU is torch.compile),
# kept beside the venv, so later runs on the same machine start faster.
CPU_BACKEND_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CACHE_ROOT": str(VENV.parent / "vllm-cache")}
TINY_LLAMA_SCRIPT = pathlib.Path(__file__).with_name("tiny_llama.py")


class VllmNotInstalled(RuntimeError):
    """The vLLM venv is missing: a test skips (or fails in CI), a benchmark stops."""


def vllm_python() -> pathlib.Path:
    """The vLLM venv's interpreter (scripts/setup-vllm.sh installs it)."""
    python = VENV / "bin" / "python"
    if not python.exists():
        raise VllmNotInstalled(f"vLLM is not installed in {VENV} (run scripts/setup-vllm.sh)")
    return python


def build_tiny_llama(out: pathlib.Path | None = None) -> pathlib.Path:
    """A random-weight Llama (hidden 128, 2 heads) and a word-level tokenizer, built locally.

    Built afresh (seeded, so the same bytes) at a fixed path beside the venv by default: vLLM keys
    its compile cache on the model's path, and a warm cache saves a minute of start-up.
    """
    out = out or VENV.parent / "tiny-llama"
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(vllm_python()), str(TINY_LLAMA_SCRIPT), str(out)], check=True, capture_output=True, timeout=300)
    return out


def local_path(value: str, mounts: Mapping[str, pathlib.Path]) -> str:
    """`value` with a volume's mount path replaced by the local directory standing in for it."""
    for mount_path, local in mounts.items():
        if value == mount_path or value.startswith(mount_path + "/"):
            return str(local) + value[len(mount_path) :]
    return value


def kubelet_command(
    container: Mapping[str, Any], mounts: Mapping[str, pathlib.Path], host: str, port: int
) -> list[str]:
    """The container's command line as a node would run it, on loopback: the image's `python3`
    is the vLLM venv's, volume paths are local directories, the pod's address is `host:port`."""
    command = [str(vllm_python()) if part == "python3" else str(part) for part in container["command"]]
    args = []
    for arg in container["args"]:
        flag, _, value = str(arg).partition("=")
        if flag == "--host":
            value = host
        elif flag == "--port":
            value = str(port)
        else:
            value = local_path(value, mounts)
        args.append(f"{flag}={value}" if value else flag)
    return command + args


def kubelet_env(
    container: Mapping[str, Any],
    home: pathlib.Path,
    cache_root: pathlib.Path | None = None,
    mounts: Mapping[str, pathlib.Path] | None = None,
) -> dict[str, str]:
    """The container's environment (plain values; device selection is the node's business), with
    the compile cache at `cache_root` (default: the node-local one) and volume paths local."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **CPU_BACKEND_ENV}
    for var in container.get("env") or []:
        if "value" in var and not var["name"].endswith("VISIBLE_DEVICES"):
            env[var["name"]] = local_path(var["value"], mounts or {})
    env["HOME"] = str(home)  # the pod's /tmp emptyDir
    # A local directory stands in for the pod's cache volume (VLLM_CACHE_ROOT), and ROCm's caches
    # rendered under it (AITER, MIOpen, Triton) move with it.
    rendered = {var["name"]: var.get("value", "") for var in container.get("env") or []}.get("VLLM_CACHE_ROOT")
    env["VLLM_CACHE_ROOT"] = str(cache_root) if cache_root else CPU_BACKEND_ENV["VLLM_CACHE_ROOT"]
    if rendered:
        for name, value in list(env.items()):
            if name != "VLLM_CACHE_ROOT" and value.startswith(rendered.rstrip("/") + "/"):
                env[name] = env["VLLM_CACHE_ROOT"] + value[len(rendered.rstrip("/")) :]
    return env


@contextlib.contextmanager
def running_vllm(
    container: Mapping[str, Any],
    model_dir: pathlib.Path,
    mount_path: str,
    port: int,
    workdir: pathlib.Path,
    timeout: float = 600,
    cache_root: pathlib.Path | None = None,
    volumes: Mapping[str, pathlib.Path] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """vLLM started from `container`, ready on 127.0.0.1:`port`; its process group is stopped
    on the way out (the API server runs the engine in a child process). `volumes` maps more
    mount paths to local directories. The process carries `startup_seconds`: exec to healthy."""
    home = workdir / "home"
    home.mkdir(exist_ok=True)
    log = workdir / "vllm.log"
    mounts = {mount_path: model_dir, **(volumes or {})}
    command = kubelet_command(container, mounts, "127.0.0.1", port)
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            env=kubelet_env(container, home, cache_root, mounts),
            cwd=workdir,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        started = time.monotonic()
        wait_http(f"http://127.0.0.1:{port}/health", process, timeout=timeout, log=log)
        process.startup_seconds = time.monotonic() - started  # type: ignore[attr-defined]
        yield process
    finally:
        stop_group(process)


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, SIGKILL what is left after 30 s (and the engine after it)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
    # The engine process may outlive the API server by a moment.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
