"""Prefill/decode disaggregation for real, as processes on loopback: one prefill and one decode
vLLM (CPU build, the tiny random Llama) joined by vLLM's NixlConnector over UCX with the KV
blocks in host memory, and the vLLM router in its P/D mode in front of them (testsupport/pd.py has
the configuration and the protocol).

Both vLLM run the container the operator renders for the aggregated service; each role adds only
its --kv-transfer-config and the NIXL side channel's address. The aggregated answer to compare
with is the prefill vLLM's own to a plain request: without the router's `kv_transfer_params` a
role's engine computes and generates the whole request itself, as one aggregated replica does
(a third vLLM just for it would be another minute of a core). Shown here: completions and chat,
streamed and not, answer through the router exactly as the aggregated engine does at temperature
0; the decode engine computes no prompt (vLLM's own prompt-token counters by source
on the decode process: every prompt token arrived by KV transfer, at most a block computed per
request) and its NIXL transfer counters moved bytes; and with the prefill process killed the
router answers a 5xx at once, not a hang, and serves again once a new prefill is up.

Each vLLM start takes a core for a minute or more on a busy 2-core machine: the processes are
started once for the module, together.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from testsupport.pd import ROUTER_KV_CONNECTOR, enter_together, prompt_token_sources, role_container
from testsupport.processes import free_port
from testsupport.router import (
    CHAT_TEMPLATE,
    VOCABULARY,
    PdWorkers,
    RouterNotInstalled,
    rendered_containers,
    router_executable,
    running_router,
)
from testsupport.vllm import running_vllm
from testsupport.waiting import eventually

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NAME = "tiny"
MODEL = "tiny"
MOUNT = "/mnt/models"
BLOCK = 32  # a KV block in tokens (vLLM's CPU default is 128: the prompts here span several)
SPEC = {
    "model": {"uri": "pvc://models/tiny-llama", "name": MODEL},
    "runtime": {
        "engine": "vllm",
        "maxModelLen": 512,
        "args": ["--max-num-seqs=4", "--seed=0", "--trust-request-chat-template", f"--block-size={BLOCK}"],
    },
    "resources": {"gpu": {"count": 0}, "cpu": "1", "memory": "4Gi"},
    "replicas": 1,
    "routing": {"router": {"replicas": 1}},
}


def rendered() -> tuple[dict[str, Any], dict[str, Any]]:
    """The vLLM container and the router container the operator renders for SPEC."""
    vllm, router = rendered_containers(SPEC, NAME)
    return vllm, router


@dataclass
class Stack:
    router: str
    prefill: str
    decode: str
    prefill_process: subprocess.Popen[bytes]
    prefill_container: dict[str, Any]
    prefill_port: int


@pytest.fixture(scope="module")
def stack(tiny_llama: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Prefill and decode vLLM, ready, and the router in P/D mode over them."""
    try:
        router_executable()
    except RouterNotInstalled as missing:
        pytest.skip(str(missing))
    vllm, router = rendered()
    ports = {role: free_port() for role in ("prefill", "decode")}
    containers = {role: role_container(vllm, role, free_port()) for role in ports}
    with contextlib.ExitStack() as exits:
        processes = enter_together(
            exits,
            [
                running_vllm(containers[role], tiny_llama, MOUNT, port, tmp_path_factory.mktemp(role), timeout=900)
                for role, port in ports.items()
            ],
        )
        urls = {role: f"http://127.0.0.1:{port}" for role, port in ports.items()}
        router_port = free_port()
        pd = PdWorkers(prefill=[urls["prefill"]], decode=[urls["decode"]], kv_connector=ROUTER_KV_CONNECTOR)
        exits.enter_context(
            running_router(router, [], router_port, free_port(), tmp_path_factory.mktemp("router"), pd=pd)
        )
        yield Stack(
            router=f"http://127.0.0.1:{router_port}",
            prefill=urls["prefill"],
            decode=urls["decode"],
            prefill_process=processes[0],
            prefill_container=containers["prefill"],
            prefill_port=ports["prefill"],
        )


def prompt(seed: int, words: int) -> str:
    """`words` words of the tiny Llama's vocabulary (as many tokens), different for each seed."""
    return " ".join(VOCABULARY[(seed * 7 + index * (seed + 3)) % len(VOCABULARY)] for index in range(words))


def completion(seed: int) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt(seed, 3 * BLOCK + 5), "max_tokens": 8, "temperature": 0}


def chat(seed: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": prompt(seed, 2 * BLOCK)},
            {"role": "user", "content": prompt(seed + 1, 9)},
        ],
        "max_tokens": 8,
        "temperature": 0,
        "chat_template": CHAT_TEMPLATE,
    }


def answer(base: str, path: str, body: dict[str, Any]) -> tuple[str, int]:
    """The generated text of a non-streamed request, and its prompt's length in tokens."""
    response = httpx.post(f"{base}{path}", json=body, timeout=300)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    text = choice["text"] if "text" in choice else choice["message"]["content"]
    return text, response.json()["usage"]["prompt_tokens"]


def streamed(base: str, path: str, body: dict[str, Any]) -> str:
    """The generated text of a streamed request, its chunks put together."""
    with httpx.stream("POST", f"{base}{path}", json={**body, "stream": True}, timeout=300) as stream:
        assert stream.status_code == 200, stream.read()
        assert stream.headers["content-type"].startswith("text/event-stream")
        events = [line.removeprefix("data: ") for line in stream.iter_lines() if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]", events
    parts = []
    for event in events[:-1]:
        for choice in json.loads(event)["choices"]:
            parts.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
    return "".join(parts)


def sources(base: str) -> dict[str, float]:
    return prompt_token_sources(httpx.get(f"{base}/metrics", timeout=30).text)


def moved(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {key: after[key] - before.get(key, 0.0) for key in after}


@pytest.mark.proven_on_pods("tests/llm/test_vllm_pods.py")
@pytest.mark.timeout(1800)
def test_answers_through_the_router_equal_the_aggregated_service_streamed_and_not(stack: Stack) -> None:
    for seed, (path, make) in enumerate((("/v1/completions", completion), ("/v1/chat/completions", chat))):
        body = make(seed)
        expected, _ = answer(stack.prefill, path, body)  # the whole request on one engine
        assert expected.strip(), expected
        assert answer(stack.router, path, body)[0] == expected, path
        assert streamed(stack.router, path, body) == expected, path


@pytest.mark.proven_on_pods("tests/llm/test_vllm_pods.py")
@pytest.mark.timeout(1800)
def test_the_decode_engine_receives_the_prompt_through_nixl_and_computes_none_of_it(stack: Stack) -> None:
    decode_before, prefill_before = sources(stack.decode), sources(stack.prefill)
    prompt_tokens = 0
    requests = 0
    for seed in range(10, 14):
        for path, body in (("/v1/completions", completion(seed)), ("/v1/chat/completions", chat(seed))):
            prompt_tokens += answer(stack.router, path, body)[1]
            requests += 1
    decode, prefill = moved(decode_before, sources(stack.decode)), moved(prefill_before, sources(stack.prefill))
    # The prefill engine computed every prompt; the decode engine took them over NIXL and
    # computed at most the last partial block of each (here: none at all).
    assert prefill["local_compute"] + prefill["local_cache_hit"] == prompt_tokens, (prefill, prompt_tokens)
    assert decode["local_compute"] <= BLOCK * requests, (decode, prompt_tokens)
    assert decode["external_kv_transfer"] >= prompt_tokens - BLOCK * requests, (decode, prompt_tokens)
    assert decode["nixl_transfers"] >= requests and decode["nixl_bytes"] > 0, decode


# The tier deletes the prefill pod instead (the router then answers 503, or its Service refuses
# while it has no prefill worker); here the process dies under the router (a refused connection,
# 500). Both are the prefill gone: a 5xx at once, not a hang, and service again once it is back.
@pytest.mark.proven_on_pods("tests/llm/test_vllm_pods.py")
@pytest.mark.timeout(1800)
def test_with_the_prefill_killed_the_router_answers_5xx_and_serves_again_once_it_is_back(
    stack: Stack, tiny_llama: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    os.killpg(stack.prefill_process.pid, signal.SIGKILL)
    stack.prefill_process.wait(30)
    # A client's own timeout would count as a hang: the router must answer first, with a
    # server error that names the prefill (vllm-router 0.1.17 answers 500 for a refused
    # prefill connection in P/D mode, not 502/503: a client retries it only if told to).
    for seed in (20, 21):
        response = httpx.post(f"{stack.router}/v1/completions", json=completion(seed), timeout=120)
        assert 500 <= response.status_code < 600, (response.status_code, response.text)
        assert "Prefill request" in response.text, response.text
    with running_vllm(stack.prefill_container, tiny_llama, MOUNT, stack.prefill_port, tmp_path, timeout=900):

        def serves() -> bool:
            return httpx.post(f"{stack.router}/v1/completions", json=completion(22), timeout=120).status_code == 200

        eventually(serves, timeout=300, interval=5, what="the router serving through the new prefill")
        expected, _ = answer(stack.prefill, "/v1/completions", completion(23))
        assert answer(stack.router, "/v1/completions", completion(23))[0] == expected
