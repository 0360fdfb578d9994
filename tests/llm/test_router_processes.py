"""The vLLM router for real, as processes on loopback: two vLLM replicas (CPU build, the tiny
random Llama), each started from the Deployment the operator renders for a service with
routing.router, and the router from the router Deployment's own command line (its Kubernetes
service discovery replaced by the two replicas' URLs: testsupport/router.py).

Completions and chat, streamed and not, answer through the router. On a shared-prefix
workload (a few long system prompts, several users each), the cache-aware policy sends every
prompt of one prefix to one replica, as each vLLM's own /metrics shows (its finished requests and
prefix-cache counters); round robin has both replicas prefill every prefix. The rendered vLLM
command line carries --enable-scale-out: without it vLLM refuses the render endpoint the
router tokenizes prompts with, and cache-aware routing sends every request to one replica.

Each vLLM start takes a core for a minute or more on a busy 2-core machine: the two replicas are
started once for the module.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from testsupport.processes import free_port
from testsupport.router import (
    CHAT_TEMPLATE,
    RouterNotInstalled,
    rendered_containers,
    replica_counters,
    router_executable,
    running_router,
    shared_prefix_prompts,
)
from testsupport.vllm import running_vllm

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NAME = "tiny"
MODEL = "tiny"
MOUNT = "/mnt/models"
PREFIXES, USERS, PREFIX_WORDS = 3, 4, 300
SPEC = {
    "model": {"uri": "pvc://models/tiny-llama", "name": MODEL},
    "runtime": {
        "engine": "vllm",
        "maxModelLen": 512,
        "args": ["--max-num-seqs=4", "--seed=0", "--trust-request-chat-template"],
    },
    "resources": {"gpu": {"count": 0}, "cpu": "1", "memory": "4Gi"},
    "replicas": 2,
    "routing": {"router": {"replicas": 1}},
}


def rendered() -> tuple[dict[str, Any], dict[str, Any]]:
    """The vLLM container and the router container the operator renders for SPEC."""
    vllm, router = rendered_containers(SPEC, NAME)
    assert "--enable-scale-out" in vllm["args"]
    return vllm, router


@pytest.fixture(scope="module")
def replicas(tiny_llama: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Two vLLM replicas of the rendered container, ready: their base URLs."""
    try:
        router_executable()
    except RouterNotInstalled as missing:
        pytest.skip(str(missing))
    vllm, _ = rendered()
    urls = []
    with contextlib.ExitStack() as stack:
        for index in range(2):
            port = free_port()
            workdir = tmp_path_factory.mktemp(f"replica{index}")
            stack.enter_context(running_vllm(vllm, tiny_llama, MOUNT, port, workdir, timeout=900))
            urls.append(f"http://127.0.0.1:{port}")
        yield urls


def counters(replicas: list[str]) -> list[dict[str, float]]:
    return [replica_counters(httpx.get(f"{url}/metrics", timeout=10).text) for url in replicas]


def deltas(before: list[dict[str, float]], after: list[dict[str, float]], key: str) -> list[float]:
    return [a[key] - b[key] for a, b in zip(after, before, strict=True)]


def routed(base: str, replicas: list[str], seed: int) -> list[list[float]]:
    """The shared-prefix workload through the router at `base`, one prompt at a time: for each
    prefix, how many of its requests each replica finished."""
    spread = []
    for prompts in shared_prefix_prompts(PREFIXES, USERS, PREFIX_WORDS, seed):
        before = counters(replicas)
        for prompt in prompts:
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0}
            answer = httpx.post(f"{base}/v1/completions", json=body, timeout=120)
            assert answer.status_code == 200, answer.text
        spread.append(deltas(before, counters(replicas), "requests"))
    return spread


@pytest.mark.timeout(1200)
def test_completions_and_chat_answer_through_the_router_streamed_and_not(
    replicas: list[str], tmp_path: pathlib.Path
) -> None:
    _, container = rendered()
    port = free_port()
    with running_router(container, replicas, port, free_port(), tmp_path):
        base = f"http://127.0.0.1:{port}"
        completion = {"model": MODEL, "prompt": "the operator scales the model", "max_tokens": 4}
        chat = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "a replica serves tokens"}],
            "max_tokens": 4,
            "chat_template": CHAT_TEMPLATE,
        }
        answer = httpx.post(f"{base}/v1/completions", json=completion, timeout=120)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["text"] and answer.json()["usage"]["completion_tokens"] == 4
        answer = httpx.post(f"{base}/v1/chat/completions", json=chat, timeout=120)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["role"] == "assistant"
        for path, body in (("/v1/completions", completion), ("/v1/chat/completions", chat)):
            with httpx.stream("POST", f"{base}{path}", json={**body, "stream": True}, timeout=120) as stream:
                assert stream.status_code == 200
                assert stream.headers["content-type"].startswith("text/event-stream")
                events = [line.removeprefix("data: ") for line in stream.iter_lines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]", events
            chunks = [json.loads(event) for event in events[:-1]]
            assert len(chunks) >= 2 and all(chunk["model"] == MODEL for chunk in chunks)
        models = httpx.get(f"{base}/v1/models", timeout=30)
        assert models.status_code == 200 and MODEL in models.text


@pytest.mark.timeout(1200)
def test_cache_aware_sends_each_prefix_to_one_replica_and_round_robin_to_both(
    replicas: list[str], tmp_path: pathlib.Path
) -> None:
    _, container = rendered()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    metrics_port = free_port()
    with running_router(container, replicas, port, metrics_port, tmp_path / "cache-aware"):
        before = counters(replicas)
        aware = routed(base, replicas, seed=1)
        aware_hits = deltas(before, counters(replicas), "hits")
        decisions = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    # Every prompt's tokens were read from a replica (without vLLM's render endpoint the router
    # counts outcome="missing_tokens" and sends everything to its first worker).
    assert 'policy="cache_aware"' in decisions and 'outcome="missing_tokens"' not in decisions, decisions
    with running_router(container, replicas, port, free_port(), tmp_path / "round-robin", policy="round_robin"):
        before = counters(replicas)
        spread = routed(base, replicas, seed=2)  # other prefixes: nothing cached from above
        spread_queries = deltas(before, counters(replicas), "queries")
        spread_hits = deltas(before, counters(replicas), "hits")
    # Cache-aware: every prefix's requests on one replica; the prefixes not all on one.
    assert all(sorted(per_replica) == [0, USERS] for per_replica in aware), aware
    assert sum(aware_hits) > 0, aware_hits
    # Round robin: each prefix on both replicas, so both prefill (and cache) it.
    assert all(min(per_replica) > 0 for per_replica in spread), spread
    assert min(spread_queries) > 0 and min(spread_hits) >= 0
    # One replica holding each prefix hits its cache more often than two taking turns.
    assert sum(aware_hits) > sum(spread_hits), (aware_hits, spread_hits)
