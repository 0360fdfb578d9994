"""A stop signal to the pod's processes as PID 1, as in a container: the model server and the
model fetcher each run as their container's first process, and PID 1 ignores any signal it has
no handler for. Each is started here in a PID namespace of its own (`unshare --pid`) and sent
SIGTERM while it is still starting or blocked."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from testsupport.onnx_models import affine_model
from testsupport.processes import free_port, serve_command
from testsupport.waiting import eventually

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="a PID namespace needs root and unshare"
)


def as_pid_1(command: list[str], log: pathlib.Path) -> tuple[subprocess.Popen, int]:
    """`command` as PID 1 of a new PID namespace with its own /proc, as in a container (vLLM's CPU
    worker reads /proc/<its pid>/status: under the host's /proc it read another process's, or
    failed when no host process had that pid); the unshare process and the command's own pid."""
    outer = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", *command],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    children = eventually(
        lambda: subprocess.run(["pgrep", "-P", str(outer.pid)], capture_output=True, text=True).stdout.split(),
        interval=0.01,
        what="the namespace's first process",
    )
    return outer, int(children[0])


def seconds_to_exit(outer: subprocess.Popen, pid: int, timeout: float) -> float:
    started = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    try:
        outer.wait(timeout)
    except subprocess.TimeoutExpired:
        outer.kill()
        outer.wait()
        pytest.fail(f"still running {timeout:.0f} s after SIGTERM")
    return time.monotonic() - started


@pytest.mark.parametrize("after", [0.2, 3.0])
def test_the_server_stops_on_a_sigterm_sent_while_it_starts(tmp_path: pathlib.Path, after: float) -> None:
    """A pod deleted as it starts (a scale-down, a rollout, a canary rolled back): the SIGTERM
    came while Python was importing, was ignored, and the server ran on until the kubelet's
    SIGKILL 60 s later, holding its GPU. Now it is remembered and acted on once started."""
    repo = tmp_path / "repo"
    affine_model(repo / "1" / "model.onnx", np.ones((4, 3), np.float32), np.zeros(3, np.float32))
    command = serve_command(repo, free_port(), "--model-name", "tiny", "--shutdown-delay", "0.5", "--no-watch")
    outer, pid = as_pid_1(command, tmp_path / "server.log")
    time.sleep(after)
    took = seconds_to_exit(outer, pid, timeout=60)
    print(f"SIGTERM {after} s after start: exited {took:.1f} s later")
    assert outer.returncode == 0, (tmp_path / "server.log").read_text()[-2000:]


def test_the_fetcher_stops_on_sigterm_while_a_download_hangs(tmp_path: pathlib.Path) -> None:
    """The init container's fetcher, blocked on a source that never answers, used to ignore
    SIGTERM and hold the pod for its whole grace period."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/model.onnx"
    command = [sys.executable, "-m", "model_server.storage", url, str(tmp_path / "models"), "--deadline", "600"]
    outer, pid = as_pid_1(command, tmp_path / "fetch.log")
    try:
        # The request is out and waits for an answer that never comes.
        eventually(lambda: accepted, what=f"the fetch's request ({(tmp_path / 'fetch.log')})")
        took = seconds_to_exit(outer, pid, timeout=60)
    finally:
        listener.close()
    print(f"fetcher stopped {took:.2f} s after SIGTERM")
    assert outer.returncode == 128 + signal.SIGTERM
    assert "stopped by signal 15" in (tmp_path / "fetch.log").read_text()
    assert not any((tmp_path / "models").glob("model.onnx"))


def catches(pid: int, sig: signal.Signals) -> bool:
    """Whether process `pid` has a handler for `sig` (its SigCgt mask in /proc)."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


def test_the_adapters_sidecar_stops_on_a_sigterm_sent_while_it_imports(tmp_path: pathlib.Path) -> None:
    """A vLLM pod deleted as it starts: the sidecar, PID 1 of its container, ignored a SIGTERM
    that came before uvicorn's handler was in place (its imports take ~0.3 s), and ran on until
    the kubelet's SIGKILL. Sent the moment it has any SIGTERM handler, i.e. still importing
    (uvicorn's would answer with a graceful exit 0), it now ends at once with 143."""
    (tmp_path / "adapters.json").write_text('{"adapters": []}')
    command = [
        sys.executable, "-m", "model_server.adapters", f"--desired={tmp_path / 'adapters.json'}",
        f"--dir={tmp_path / 'files'}", "--engine=http://127.0.0.1:9", f"--port={free_port()}", "--host=127.0.0.1",
    ]  # fmt: skip
    outer, pid = as_pid_1(command, tmp_path / "sidecar.log")
    eventually(lambda: catches(pid, signal.SIGTERM) or outer.poll() is not None, interval=0.002, what="a handler")
    assert outer.poll() is None, (tmp_path / "sidecar.log").read_text()
    took = seconds_to_exit(outer, pid, timeout=60)
    print(f"sidecar stopped {took:.2f} s after SIGTERM")
    assert outer.returncode == 128 + signal.SIGTERM, (tmp_path / "sidecar.log").read_text()
    assert "adapters sidecar stopped by signal 15" in (tmp_path / "sidecar.log").read_text()
