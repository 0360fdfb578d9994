"""Cache-aware against round-robin routing by the vLLM router, over two vLLM replicas (CPU build,
the tiny random Llama), on a shared-prefix workload: a few long system prompts, many users each.

Both replicas run the vLLM container the operator renders for a service with routing.router, and
the router runs its rendered command line with static worker URLs (testsupport/router.py). Each
policy gets prefixes of its own (nothing cached from the other), and the two alternate over
`--rounds`. Per policy: time to first token (streamed completions, p50/p90, ms), and each
replica's requests and prefix-cache hit rate (vLLM's own counters: hits/queries, in tokens).

    .venv/bin/python bench/router_bench.py                       # starts two replicas (minutes)
    .venv/bin/python bench/router_bench.py --replicas URL URL    # replicas already running

Needs scripts/setup-vllm.sh and scripts/setup-router.sh.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import pathlib
import statistics
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import httpx

from testsupport.processes import free_port
from testsupport.router import rendered_containers, replica_counters, running_router, shared_prefix_prompts
from testsupport.vllm import build_tiny_llama, running_vllm

MODEL = "tiny"
POLICIES = ("cache_aware", "round_robin")
SPEC = {
    "model": {"uri": "pvc://models/tiny-llama", "name": MODEL},
    "runtime": {"engine": "vllm", "maxModelLen": 512, "args": ["--max-num-seqs=8", "--seed=0"]},
    "resources": {"gpu": {"count": 0}, "cpu": "1", "memory": "4Gi"},
    "replicas": 2,
    "routing": {"router": {"replicas": 1}},
}


def rendered() -> tuple[dict[str, Any], dict[str, Any]]:
    return rendered_containers(SPEC, "tiny", "bench")


@contextlib.contextmanager
def replicas(given: list[str] | None, work: pathlib.Path) -> Iterator[list[str]]:
    if given:
        yield given
        return
    vllm, _ = rendered()
    model = build_tiny_llama()
    with contextlib.ExitStack() as stack:
        urls = []
        for index in range(2):
            port = free_port()
            workdir = work / f"replica{index}"
            workdir.mkdir()
            stack.enter_context(running_vllm(vllm, model, "/mnt/models", port, workdir, timeout=900))
            urls.append(f"http://127.0.0.1:{port}")
        yield urls


async def ttft(client: httpx.AsyncClient, base: str, prompt: str, max_tokens: int) -> float:
    """Seconds to the first streamed token of one completion (the stream is read to its end)."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    started = time.perf_counter()
    first = None
    async with client.stream("POST", f"{base}/v1/completions", json=body) as answer:
        answer.raise_for_status()
        async for line in answer.aiter_lines():
            if first is None and line.startswith("data: ") and line != "data: [DONE]":
                first = time.perf_counter() - started
    assert first is not None
    return first


async def workload(base: str, prompts: list[str], concurrency: int, max_tokens: int) -> list[float]:
    """Every prompt once, `concurrency` at a time (closed loop), in an order that interleaves
    the prefixes' users; their TTFTs."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for prompt in prompts:
        queue.put_nowait(prompt)
    results: list[float] = []
    async with httpx.AsyncClient(timeout=300) as client:

        async def worker() -> None:
            while not queue.empty():
                results.append(await ttft(client, base, queue.get_nowait(), max_tokens))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


def counters(urls: list[str]) -> list[dict[str, float]]:
    return [replica_counters(httpx.get(f"{url}/metrics", timeout=10).text) for url in urls]


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", nargs=2, metavar="URL", help="two running vLLM replicas (else started here)")
    parser.add_argument("--prefixes", type=int, default=4)
    parser.add_argument("--users", type=int, default=8, help="users per prefix")
    parser.add_argument("--prefix-words", type=int, default=384, help="tokens of each system prompt")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    _, router = rendered()
    ttfts: dict[str, list[float]] = {p: [] for p in POLICIES}
    per_replica: dict[str, list[dict[str, float]]] = {p: [] for p in POLICIES}
    with tempfile.TemporaryDirectory(prefix="router-bench-") as tmp, replicas(args.replicas, pathlib.Path(tmp)) as urls:
        seed = 100
        for _ in range(args.rounds):
            for policy in POLICIES:
                seed += 1
                groups = shared_prefix_prompts(args.prefixes, args.users, args.prefix_words, seed)
                # User by user: each prefix's users arrive spread over the run, as they would.
                prompts = [group[user] for user in range(args.users) for group in groups]
                port = free_port()
                work = pathlib.Path(tmp) / f"router-{seed}"
                with running_router(router, urls, port, free_port(), work, policy=policy):
                    before = counters(urls)
                    ttfts[policy] += asyncio.run(
                        workload(f"http://127.0.0.1:{port}", prompts, args.concurrency, args.max_tokens)
                    )
                    after = counters(urls)
                delta = [
                    {k: a[k] - b[k] for k in ("requests", "queries", "hits")}
                    for a, b in zip(after, before, strict=True)
                ]
                if per_replica[policy]:
                    for total, step in zip(per_replica[policy], delta, strict=True):
                        for key in total:
                            total[key] += step[key]
                else:
                    per_replica[policy] = delta
    print(
        f"vllm-router over 2 vLLM CPU replicas (tiny Llama): {args.prefixes} prefixes x {args.users} users, "
        f"{args.prefix_words}-token system prompts, {args.concurrency} concurrent streams, "
        f"{args.max_tokens} tokens each, {args.rounds} rounds per policy"
    )
    summary = {}
    for policy in POLICIES:
        p50, p90 = quantile(ttfts[policy], 0.5) * 1000, quantile(ttfts[policy], 0.9) * 1000
        replicas_text = "  ".join(
            f"r{i}: {r['requests']:.0f} req, hit rate {r['hits'] / r['queries']:.2f}"
            if r["queries"]
            else f"r{i}: 0 req"
            for i, r in enumerate(per_replica[policy])
        )
        hits = sum(r["hits"] for r in per_replica[policy]) / max(1.0, sum(r["queries"] for r in per_replica[policy]))
        summary[policy] = (p50, p90, hits)
        print(f"  {policy:12s} TTFT p50 {p50:7.1f} ms  p90 {p90:7.1f} ms  hit rate {hits:.2f}   {replicas_text}")
    (a50, a90, ah), (r50, r90, rh) = summary["cache_aware"], summary["round_robin"]
    print(f"  cache_aware / round_robin: TTFT p50 {a50 / r50:.2f}x  p90 {a90 / r90:.2f}x  hit rate {ah / rh:.2f}x")


if __name__ == "__main__":
    main()
