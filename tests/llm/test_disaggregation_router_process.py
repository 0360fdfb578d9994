"""The router's P/D command line as the operator renders it, run by the real `vllm-router` binary
(scripts/setup-router.sh): it accepts every flag (P/D mode, the two roles' selectors, the
connector) and starts in vLLM's prefill/decode mode. On loopback there is no cluster to discover
pods in: the router says so and serves without workers, which is all this checks."""

from __future__ import annotations

import os
import pathlib
import subprocess

import httpx
import pytest

from inference_operator.builders import Owner, build_all
from inference_operator.models import parse_spec
from testsupport.processes import free_port
from testsupport.router import RouterNotInstalled, router_executable
from testsupport.vllm import stop_group
from testsupport.waiting import eventually

SPEC = {
    "model": {"uri": "pvc://models/llama", "name": "llama"},
    "runtime": {"engine": "vllm"},
    "resources": {"gpu": {"count": 0}},
    "routing": {"router": {}},
    "disaggregation": {"kvTransfer": {"connector": "nixl"}},
}


def loopback(args: list[str], port: int, metrics_port: int) -> list[str]:
    """The rendered arguments with the pod's addresses replaced by loopback ones."""
    replaced = {
        "--host": "127.0.0.1",
        "--port": str(port),
        "--prometheus-host": "127.0.0.1",
        "--prometheus-port": str(metrics_port),
    }
    out = []
    for arg in args:
        flag, sep, _ = arg.partition("=")
        out.append(f"{flag}={replaced[flag]}" if sep and flag in replaced else arg)
    return out


def test_the_router_starts_in_pd_mode_from_the_rendered_command_line(tmp_path: pathlib.Path) -> None:
    try:
        executable = router_executable()
    except RouterNotInstalled as missing:
        pytest.skip(str(missing))
    objects = build_all(Owner("llama", "ml", "u-1", parse_spec(SPEC)))
    (router,) = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "llama-router")[
        "spec"
    ]["template"]["spec"]["containers"]
    assert router["command"] == ["vllm-router"]
    port, metrics_port = free_port(), free_port()
    log = tmp_path / "router.log"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "KUBECONFIG": str(tmp_path / "no-cluster"),  # no cluster here: discovery is skipped
    }
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(executable), *loopback(router["args"], port, metrics_port)],
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        started = eventually(
            lambda: (
                next((line for line in log.read_text().splitlines() if "Starting router on" in line), None)
                or (process.poll() is not None and f"exited: {log.read_text()[-2000:]}")
            ),
            timeout=60,
            what="the router's start line",
        )
        assert "mode: VllmPrefillDecode" in started, started
        assert "exited" not in started
        answer = eventually(
            lambda: httpx.get(f"http://127.0.0.1:{port}/liveness", timeout=2),
            timeout=60,
            ignore=(httpx.HTTPError,),
            what="/liveness",
        )
        assert answer.status_code == 200
    finally:
        stop_group(process)
