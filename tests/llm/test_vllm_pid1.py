"""Real vLLM (CPU) as its pod runs it, PID 1 of its own PID namespace, stopped while it imports:
a pod deleted as it starts. vLLM's first SIGTERM handler comes only after its imports: as PID 1
itself the signal was dropped and vLLM went on to load its model and serve; under the operator's
init it ends before it gets past them. Each case waits for its event (the exit, a log line of
vLLM's next steps), never for a window, so a loaded machine only makes it slower."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import time

import pytest

from inference_operator.builders import Owner, build_all
from inference_operator.engines.vllm import ENGINE_COMMAND
from inference_operator.models import parse_spec
from tests.llm.conftest import (
    tiny_llama,  # noqa: F401  (a fixture)
    vllm_python,
)
from tests.server.test_ms_pid1 import as_pid_1
from testsupport.processes import free_port
from testsupport.vllm import kubelet_command, kubelet_env
from testsupport.waiting import eventually

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(shutil.which("unshare") is None, reason="a PID namespace needs unshare"),
]

MOUNT = "/mnt/models"
# What vLLM logs once past its imports: loading the model, warming it up, serving.
GONE_ON = ("Loading weights", "Warming up model", "Starting vLLM", "Application startup complete")
#: How long either event may take on a loaded 2-core machine: past it, the event is missing.
LOADED_MACHINE_S = 240


def rendered_vllm() -> dict:
    spec = parse_spec({"model": {"uri": "pvc://models/tiny"}, "runtime": {"engine": "vllm", "maxModelLen": 256}})
    (deployment,) = [o for o in build_all(Owner("tiny", "ml", "u-1", spec)) if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


@pytest.mark.parametrize("init", [True, False], ids=["under-the-init", "vllm-as-pid-1"])
def test_a_sigterm_while_vllm_imports(tmp_path: pathlib.Path, tiny_llama: pathlib.Path, init: bool) -> None:  # noqa: F811
    vllm_python()
    container = rendered_vllm()
    if not init:  # what the pod ran before: vLLM itself as PID 1
        container = {**container, "command": ENGINE_COMMAND}
    (tmp_path / "home").mkdir()
    env = kubelet_env(container, tmp_path / "home", tmp_path / "cache", {MOUNT: tiny_llama})
    command = kubelet_command(container, {MOUNT: tiny_llama}, "127.0.0.1", free_port())
    # `env` execs the command: the namespace's PID 1 is the init, or vLLM.
    outer, pid = as_pid_1(["env", "-i", *[f"{k}={v}" for k, v in env.items()], *command], tmp_path / "vllm.log")
    log = tmp_path / "vllm.log"
    time.sleep(1.0)  # importing: its first handler is seconds away
    os.kill(pid, signal.SIGTERM)
    try:
        if init:  # the event: the namespace ends, and it ends before vLLM gets anywhere
            eventually(lambda: outer.poll() is not None, timeout=LOADED_MACHINE_S, what="the init's exit")
            assert not any(step in log.read_text() for step in GONE_ON), log.read_text()[-2000:]
            assert outer.returncode != 0, "vLLM's status (killed by SIGTERM) passed back"
        else:  # what the init is for: the signal was lost, and vLLM went on past its imports
            eventually(
                lambda: any(step in log.read_text() for step in GONE_ON) or outer.poll() is not None,
                timeout=LOADED_MACHINE_S,
                what="vLLM past its imports",
            )
            assert outer.poll() is None, f"vLLM exited ({outer.returncode}): {log.read_text()[-2000:]}"
    finally:
        if outer.poll() is None:
            outer.kill()
            outer.wait()
