"""Prefill/decode disaggregation (1 prefill + 1 decode vLLM, NixlConnector over UCX in host
memory, the vLLM router in P/D mode) against one aggregated vLLM replica behind the same router
in its regular mode, on vLLM's CPU build with the tiny random Llama, in the same run.

All three vLLM run the container the operator renders (testsupport/pd.py adds each role's KV
connector config). Both sides go through a router, so the comparison is of the serving layout,
not of the router. Rounds interleave: in each round, every concurrency runs on one side then the
other. Per side and concurrency: time to first token (p50/p90), inter-token latency (mean gap
between streamed tokens after the first, p50 over requests), and generated tokens per second.

    .venv/bin/python bench/pd_bench.py                 # starts three vLLM and two routers (minutes)

Needs scripts/setup-vllm.sh (with NIXL) and scripts/setup-router.sh.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import pathlib
import statistics
import tempfile
import time
from typing import Any

import httpx

from testsupport.pd import ROUTER_KV_CONNECTOR, enter_together, role_container
from testsupport.processes import free_port
from testsupport.router import VOCABULARY, PdWorkers, rendered_containers, running_router
from testsupport.vllm import build_tiny_llama, running_vllm

MODEL = "tiny"
MOUNT = "/mnt/models"
SIDES = ("1P1D", "aggregated")
SPEC = {
    "model": {"uri": "pvc://models/tiny-llama", "name": MODEL},
    "runtime": {"engine": "vllm", "maxModelLen": 512, "args": ["--max-num-seqs=8", "--seed=0"]},
    "resources": {"gpu": {"count": 0}, "cpu": "1", "memory": "4Gi"},
    "replicas": 1,
    "routing": {"router": {"replicas": 1}},
}


def rendered() -> tuple[dict[str, Any], dict[str, Any]]:
    return rendered_containers(SPEC, "tiny", "bench")


async def one_stream(client: httpx.AsyncClient, base: str, prompt: str, max_tokens: int) -> tuple[float, float, int]:
    """One streamed completion: seconds to its first token, the mean gap between the later
    ones, and how many it streamed (`ignore_eos`: always `max_tokens`)."""
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    started = time.perf_counter()
    stamps: list[float] = []
    async with client.stream("POST", f"{base}/v1/completions", json=body) as answer:
        answer.raise_for_status()
        async for line in answer.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                stamps.append(time.perf_counter() - started)
    assert stamps, "no token streamed"
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    return stamps[0], statistics.fmean(gaps) if gaps else 0.0, len(stamps)


async def load(base: str, prompts: list[str], concurrency: int, max_tokens: int) -> dict[str, Any]:
    """Every prompt once, `concurrency` streams at a time (closed loop)."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for prompt in prompts:
        queue.put_nowait(prompt)
    results: list[tuple[float, float, int]] = []
    async with httpx.AsyncClient(timeout=600) as client:

        async def worker() -> None:
            while not queue.empty():
                results.append(await one_stream(client, base, queue.get_nowait(), max_tokens))

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return {
        "ttft": [r[0] for r in results],
        "itl": [r[1] for r in results],
        "tokens": sum(r[2] for r in results),
        "seconds": elapsed,
    }


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def prompts(count: int, words: int, seed: int) -> list[str]:
    """`count` prompts of `words` tokens each, none sharing a prefix with another run's."""
    return [
        " ".join(VOCABULARY[(seed * 31 + n * 17 + i * (n % 5 + 2)) % len(VOCABULARY)] for i in range(words))
        for n in range(count)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument(
        "--requests", type=int, default=8, help="requests per side, concurrency and round (at least the concurrency)"
    )
    parser.add_argument("--prompt-words", type=int, default=128, help="tokens of each prompt")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    vllm, router = rendered()
    model = build_tiny_llama()
    samples: dict[tuple[str, int], list[dict[str, Any]]] = {(s, c): [] for s in SIDES for c in args.concurrency}
    with tempfile.TemporaryDirectory(prefix="pd-bench-") as tmp, contextlib.ExitStack() as stack:
        work = pathlib.Path(tmp)
        ports = {role: free_port() for role in ("prefill", "decode", "aggregated")}
        containers = {
            "prefill": role_container(vllm, "prefill", free_port()),
            "decode": role_container(vllm, "decode", free_port()),
            "aggregated": vllm,
        }
        for role in ports:
            (work / role).mkdir()
        enter_together(
            stack,
            [
                running_vllm(containers[role], model, MOUNT, port, work / role, timeout=900)
                for role, port in ports.items()
            ],
        )
        url = {role: f"http://127.0.0.1:{port}" for role, port in ports.items()}
        base = {side: free_port() for side in SIDES}
        pd = PdWorkers(prefill=[url["prefill"]], decode=[url["decode"]], kv_connector=ROUTER_KV_CONNECTOR)
        stack.enter_context(running_router(router, [], base["1P1D"], free_port(), work / "router-pd", pd=pd))
        stack.enter_context(
            running_router(router, [url["aggregated"]], base["aggregated"], free_port(), work / "router-agg")
        )
        # One request each first: vLLM compiles a graph for a new batch shape on first use.
        for side in SIDES:
            asyncio.run(load(f"http://127.0.0.1:{base[side]}", prompts(2, args.prompt_words, 0), 2, 4))
        seed = 1
        for _ in range(args.rounds):
            for concurrency in args.concurrency:
                for side in SIDES:
                    seed += 1  # fresh prompts: no prefix cached from an earlier run
                    batch = prompts(max(args.requests, concurrency), args.prompt_words, seed)
                    samples[side, concurrency].append(
                        asyncio.run(load(f"http://127.0.0.1:{base[side]}", batch, concurrency, args.max_tokens))
                    )
    print(
        f"1P1D (NixlConnector, host memory) vs 1 aggregated vLLM, both behind vllm-router; CPU build, tiny "
        f"Llama, {args.prompt_words}-token prompts, {args.max_tokens} tokens each, {args.requests} requests (at "
        f"least one per stream) per side and concurrency in each of {args.rounds} interleaved rounds"
    )
    figures: dict[tuple[str, int], tuple[float, float, float, float]] = {}
    for concurrency in args.concurrency:
        for side in SIDES:
            runs = samples[side, concurrency]
            ttft = [t for run in runs for t in run["ttft"]]
            itl = [t for run in runs for t in run["itl"]]
            rate = sum(run["tokens"] for run in runs) / sum(run["seconds"] for run in runs)
            p50, p90, gap = quantile(ttft, 0.5) * 1000, quantile(ttft, 0.9) * 1000, statistics.median(itl) * 1000
            figures[side, concurrency] = (p50, p90, gap, rate)
            print(
                f"  {concurrency:2d} streams  {side:10s} TTFT p50 {p50:8.1f} ms  p90 {p90:8.1f} ms  "
                f"ITL {gap:6.1f} ms  {rate:7.1f} tokens/s"
            )
        (a50, a90, agap, arate), (b50, b90, bgap, brate) = (
            figures["1P1D", concurrency],
            figures["aggregated", concurrency],
        )
        print(
            f"  {concurrency:2d} streams  1P1D/aggregated: TTFT p50 {a50 / b50:.2f}x  p90 {a90 / b90:.2f}x  "
            f"ITL {agap / bgap:.2f}x  tokens/s {arate / brate:.2f}x"
        )


if __name__ == "__main__":
    main()
