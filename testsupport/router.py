"""The vLLM project's router (vllm-router) on loopback, for the router tests and bench/.

It lives in a venv of its own (scripts/setup-router.sh). The caller plays the kubelet: it takes
the router container the operator rendered (builders/router.py) and runs its command line here,
with the Kubernetes service discovery replaced by static worker URLs (there are no pods to
watch on loopback) and the pod's ports by free ones.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import random
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from inference_operator.builders import Owner, build_all
from inference_operator.models import parse_spec
from testsupport.processes import wait_http
from testsupport.vllm import stop_group

VENV = pathlib.Path(
    os.environ.get("VLLM_ROUTER_VENV")
    or pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
    / "rocm-inference-operator"
    / "router-venv"
)
# Flags of service discovery, which static worker URLs replace; `--selector` takes the values
# that follow it up to the next flag.
DISCOVERY_FLAGS = ("--service-discovery", "--selector", "--service-discovery-namespace", "--service-discovery-port")


@dataclasses.dataclass(frozen=True)
class PdWorkers:
    """The router's P/D mode over static workers: prefill and decode base URLs, and the KV
    connector that moves the cache between them (it decides the router's handshake)."""

    prefill: Sequence[str]
    decode: Sequence[str]
    kv_connector: str = "nixl"


class RouterNotInstalled(RuntimeError):
    """The router venv is missing: a test skips (or fails in CI), a benchmark stops."""


def rendered_containers(
    spec: Mapping[str, Any], name: str, namespace: str = "ml"
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The vLLM container and the router container the operator renders for `spec` (with
    routing.router) as service `name`."""
    objects = build_all(Owner(name, namespace, "u-1", parse_spec(dict(spec))))
    containers = {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]["containers"] for o in objects if o["kind"] == "Deployment"
    }
    (vllm,) = containers[name]
    (router,) = containers[f"{name}-router"]
    return vllm, router


def router_executable() -> pathlib.Path:
    """The venv's `vllm-router` (scripts/setup-router.sh installs it)."""
    executable = VENV / "bin" / "vllm-router"
    if not executable.exists():
        raise RouterNotInstalled(f"vllm-router is not installed in {VENV} (run scripts/setup-router.sh)")
    return executable


def static_command(
    container: Mapping[str, Any],
    workers: Sequence[str],
    port: int,
    metrics_port: int,
    policy: str | None = None,
    pd: PdWorkers | None = None,
) -> list[str]:
    """The container's command line on loopback: discovery replaced by `--worker-urls` (or, in
    P/D mode, by `pd`'s `--prefill` and `--decode` URLs), the ports by `port` and
    `metrics_port`, and the policy by `policy` when given."""
    args: list[str] = []
    skipping = False
    for arg in container["args"]:
        flag, _, _ = str(arg).partition("=")
        if flag.startswith("--"):
            skipping = flag in DISCOVERY_FLAGS
        if skipping:
            continue
        if flag == "--host" or flag == "--prometheus-host":
            arg = f"{flag}=127.0.0.1"
        elif flag == "--port":
            arg = f"{flag}={port}"
        elif flag == "--prometheus-port":
            arg = f"{flag}={metrics_port}"
        elif flag == "--policy" and policy is not None:
            arg = f"{flag}={policy}"
        args.append(str(arg))
    assert container["command"] == ["vllm-router"], container["command"]
    if pd is None:
        return [str(router_executable()), *args, "--worker-urls", *workers]
    static = ["--vllm-pd-disaggregation", "--kv-connector", pd.kv_connector]
    for url in pd.prefill:
        static += ["--prefill", url]
    for url in pd.decode:
        static += ["--decode", url]
    return [str(router_executable()), *args, *static]


@contextlib.contextmanager
def running_router(
    container: Mapping[str, Any],
    workers: Sequence[str],
    port: int,
    metrics_port: int,
    workdir: pathlib.Path,
    policy: str | None = None,
    timeout: float = 120,
    pd: PdWorkers | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """The router from `container` in front of `workers` (or in P/D mode over `pd`), ready (its
    /readiness answers 200: it has healthy workers) on 127.0.0.1:`port`; stopped on the way out."""
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "router.log"
    command = static_command(container, workers, port, metrics_port, policy, pd)
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(workdir)},
            cwd=workdir,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_http(f"http://127.0.0.1:{port}/readiness", process, timeout=timeout, log=log)
        yield process
    finally:
        stop_group(process)


# --------------------------------------------------------------------- a shared-prefix workload

# Words of the tiny Llama's vocabulary (testsupport/tiny_llama.py): a prompt of them is as many
# tokens as words, and no two prefixes drawn from them tokenize alike.
VOCABULARY = (
    "the operator scales model server on latency a replica serves tokens to many users prometheus "
    "scrapes metrics of every pod and autoscaler reads them time first token grows when requests "
    "wait in queue more replicas share load"
).split()
# A chat template for the tiny Llama, which has none: the messages' contents, one after the other.
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }} {% endfor %}"


def shared_prefix_prompts(prefixes: int, users: int, prefix_words: int, seed: int) -> list[list[str]]:
    """`prefixes` long system prompts (`prefix_words` tokens each), each followed by the short
    question of each of `users` users: the prompts of one prefix, for every prefix."""
    draw = random.Random(seed)
    groups = []
    for _ in range(prefixes):
        system = " ".join(draw.choice(VOCABULARY) for _ in range(prefix_words))
        groups.append([f"{system} {' '.join(draw.choice(VOCABULARY) for _ in range(6))}" for _ in range(users)])
    return groups


SERIES = {
    "requests": "vllm:request_success_total",
    "queries": "vllm:prefix_cache_queries_total",
    "hits": "vllm:prefix_cache_hits_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
}


def replica_counters(metrics_text: str) -> dict[str, float]:
    """A vLLM replica's counters that tell where prompts went and what its prefix cache saved
    (SERIES: each summed over its label sets), from its /metrics exposition."""
    totals = dict.fromkeys(SERIES, 0.0)
    names = {series: key for key, series in SERIES.items()}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name in names:
                totals[names[sample.name]] += sample.value
    return totals
