"""Prefill/decode disaggregation for real, on loopback: vLLM's NixlConnector over UCX on the CPU
build, and the vLLM router in its P/D mode, for tests/llm/test_pd_processes.py and bench/.

One prefill and one decode vLLM run the container the operator renders for the aggregated
service, with what a role adds: the KV connector's `--kv-transfer-config` and the NIXL side
channel's address (the port the decode side connects to on the prefill side to learn the
prefill engine's KV layout and block addresses). The router runs its rendered command line with
service discovery replaced by static `--prefill` and `--decode` URLs (testsupport/router.py).

The router's P/D protocol with `--kv-connector nixl`: it sends the request to a prefill worker
with `max_tokens: 1` and `kv_transfer_params: {"do_remote_decode": true}`, then the original
request to a decode worker with the prefill answer's `kv_transfer_params` (the prefill engine's
id, its side-channel host and port, the block ids): the decode engine pulls those blocks over
NIXL and computes only the prompt's last, partial block itself. NIXL needs no bootstrap port
(the router's `--prefill URL [BOOTSTRAP_PORT]`, or the pod annotation `vllm.ai/bootstrap-port`
with service discovery): the side channel travels in `kv_transfer_params`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from prometheus_client.parser import text_string_to_metric_families

from inference_operator.builders.common import Role
from inference_operator.builders.disaggregation import nixl_config, nixl_env

T = TypeVar("T")


def nixl_cpu_kv_transfer(role: str) -> dict[str, Any]:
    """vLLM's --kv-transfer-config for `role` (prefill or decode) on the CPU build: NIXL over UCX
    with the KV blocks in host memory, as the operator renders it for a role without GPUs."""
    return dict(nixl_config(Role(role), gpus=0))


# The router's --kv-connector for it.
ROUTER_KV_CONNECTOR = "nixl"


# What a pod's address stands for on loopback: the side channel's, set below, and UCX's port
# range, one per pod in a cluster but shared by every pair on one loopback address.
LOOPBACK_REPLACED = ("VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT", "UCX_TCP_PORT_RANGE")


def role_container(container: Mapping[str, Any], role: str, side_channel_port: int) -> dict[str, Any]:
    """The aggregated vLLM container as `role` of a P/D pair: the same command line plus the
    connector's config and variables as the operator renders them for a role without GPUs (the
    OpenMP threads for the container's CPU limit), and the NIXL side channel on loopback at
    `side_channel_port` (in a pod: the pod's IP, and a port the NetworkPolicy opens to the other
    role only)."""
    wired = [
        var for var in nixl_env(container["resources"]["limits"]["cpu"], gpus=0) if var["name"] not in LOOPBACK_REPLACED
    ]
    names = {var["name"] for var in wired} | set(LOOPBACK_REPLACED)
    env = [var for var in container.get("env") or [] if var["name"] not in names] + wired
    env += [
        {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "value": "127.0.0.1"},
        {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(side_channel_port)},
    ]
    args = [arg for arg in container["args"] if not str(arg).startswith("--kv-transfer-config")]
    args.append(f"--kv-transfer-config={json.dumps(nixl_cpu_kv_transfer(role), separators=(',', ':'))}")
    return {**container, "args": args, "env": env}


PROMPT_SOURCES = "vllm:prompt_tokens_by_source"
NIXL_BYTES = "vllm:nixl_bytes_transferred"


def prompt_token_sources(metrics_text: str) -> dict[str, float]:
    """Where a vLLM engine's prompt tokens came from (its `vllm:prompt_tokens_by_source`, by
    source: local_compute, local_cache_hit, external_kv_transfer), and how many bytes the NIXL
    connector moved (`nixl_bytes`: the sum of its transfer-size histogram) and in how many
    transfers (`nixl_transfers`)."""
    totals = {"local_compute": 0.0, "local_cache_hit": 0.0, "external_kv_transfer": 0.0}
    totals.update(nixl_bytes=0.0, nixl_transfers=0.0)
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == f"{PROMPT_SOURCES}_total" or sample.name == PROMPT_SOURCES:
                source = sample.labels.get("source", "")
                totals[source] = totals.get(source, 0.0) + sample.value
            elif sample.name == f"{NIXL_BYTES}_sum":
                totals["nixl_bytes"] += sample.value
            elif sample.name == f"{NIXL_BYTES}_count":
                totals["nixl_transfers"] += sample.value
    return totals


def enter_together(stack: contextlib.ExitStack, managers: Sequence[contextlib.AbstractContextManager[T]]) -> list[T]:
    """Enter `managers` at once, each in a thread of its own (each vLLM start is minutes of
    mostly waiting), and leave them with `stack`: those that started are stopped even when
    another failed, whose error is raised."""
    with concurrent.futures.ThreadPoolExecutor(len(managers)) as pool:
        futures = [pool.submit(manager.__enter__) for manager in managers]
    for manager, future in zip(managers, futures, strict=True):
        if future.exception() is None:
            stack.push(manager.__exit__)
    return [future.result() for future in futures]
