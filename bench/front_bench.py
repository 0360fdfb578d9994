"""What a hop in front of vLLM costs a stream: the pod's front (`model_server front`), as of this
checkout and as of a git ref, and the vLLM router, each against vLLM straight, in one run.

One vLLM (CPU build, the tiny random Llama) from the container the operator renders for a service
with routing.router; in front of it, on loopback: this checkout's front (`front`), the front as of
`--baseline REF` (its `server/` directory extracted with `git archive`: `baseline`), and with
`--router` the vLLM router from its rendered command line with that one worker (`router`). Each
level of concurrency runs every path in turn, the order rotating from round to round, over
`--rounds`. A stream is a closed loop of streamed completions of `--tokens` tokens each
(`ignore_eos`); per path and level: time to first token (p50, ms), tokens a second (all streams'
tokens over the level's wall time), and inter-token latency (the mean gap between a stream's
events, ms), and each against vLLM straight: the median of the rounds' ratios, each taken
between runs a few seconds apart, so the machine's drift cancels; and the CPU time the hop's own process spent per
token it relayed (from /proc: a figure the machine's other load does not skew as much).

    .venv/bin/python bench/front_bench.py                          # starts vLLM (a minute or two)
    .venv/bin/python bench/front_bench.py --router --streams 1,8,32
    .venv/bin/python bench/front_bench.py --vllm http://127.0.0.1:PORT   # vLLM already running

Needs scripts/setup-vllm.sh (and scripts/setup-router.sh for --router).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from procstat import cpu_seconds

from inference_operator.builders import Owner, build_all
from inference_operator.models import parse_spec
from testsupport.processes import free_port, running
from testsupport.router import running_router
from testsupport.vllm import build_tiny_llama, running_vllm

MODEL = "tiny"
ROOT = pathlib.Path(__file__).resolve().parent.parent
SPEC = {
    "model": {"uri": "pvc://models/tiny-llama", "name": MODEL},
    "runtime": {"engine": "vllm", "maxModelLen": 512, "args": ["--max-num-seqs=32", "--seed=0"]},
    "resources": {"gpu": {"count": 0}, "cpu": "1", "memory": "4Gi"},
    "routing": {"router": {"replicas": 1}},
}
PROMPT = "the operator scales model server on latency a replica serves tokens to many users"


def rendered() -> tuple[dict[str, Any], dict[str, Any]]:
    """vLLM's container and the router's, as the operator renders them."""
    objects = build_all(Owner("tiny", "bench", "u-1", parse_spec(SPEC)))
    containers = {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]["containers"][0]
        for o in objects
        if o["kind"] == "Deployment"
    }
    return containers["tiny"], containers["tiny-router"]


@dataclass
class Level:
    """What the streams of one path at one concurrency saw."""

    ttfts: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0
    hop_cpu: float = 0.0  # seconds of the hop's process

    def add(self, other: Level) -> None:
        self.ttfts += other.ttfts
        self.gaps += other.gaps
        self.tokens += other.tokens
        self.seconds += other.seconds
        self.hop_cpu += other.hop_cpu

    def row(self) -> tuple[float, float, float]:
        """(TTFT p50 ms, tokens/s, mean inter-token latency ms)."""
        return (
            statistics.median(self.ttfts) * 1000,
            self.tokens / self.seconds,
            statistics.fmean(self.gaps) * 1000 if self.gaps else 0.0,
        )


async def one_stream(session: aiohttp.ClientSession, base: str, tokens: int, level: Level) -> None:
    """One streamed completion; its first event's delay and the gaps between its events."""
    body = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    started = time.perf_counter()
    last: float | None = None
    async with session.post(f"{base}/v1/completions", json=body) as answer:
        answer.raise_for_status()
        async for line in answer.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            now = time.perf_counter()
            if last is None:
                level.ttfts.append(now - started)
            else:
                level.gaps.append(now - last)
            last = now
            level.tokens += 1


async def load(base: str, streams: int, requests: int, tokens: int) -> Level:
    """`streams` closed loops of `requests` completions each."""
    level = Level()
    connector = aiohttp.TCPConnector(limit=streams)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        await one_stream(session, base, tokens, Level())  # the connections' first request is not counted

        async def loop() -> None:
            for _ in range(requests):
                await one_stream(session, base, tokens, level)

        started = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(streams)))
        level.seconds = time.perf_counter() - started
    return level


def extract(ref: str, into: pathlib.Path) -> pathlib.Path:
    """The `server/` tree as of git ref `ref`."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "server"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "server"


@contextlib.contextmanager
def running_front(upstream: str, server_dir: pathlib.Path, log: pathlib.Path) -> Iterator[tuple[str, int]]:
    """`model_server front` from `server_dir` in front of `upstream`, with the pod's defaults."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "model_server",
        "front",
        f"--upstream={upstream}",
        "--host=127.0.0.1",
        f"--port={port}",
        f"--memory-limit-bytes={1024 * 1024 * 1024}",
        "--log-level=warning",
    ]
    paths = [str(server_dir), str(ROOT / "operator"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    with running(command, env=env, log=log, ready_url=f"http://127.0.0.1:{port}/health/ready", timeout=60) as process:
        yield f"http://127.0.0.1:{port}", process.pid


@contextlib.contextmanager
def vllm(given: str | None, container: dict[str, Any], work: pathlib.Path) -> Iterator[str]:
    if given:
        yield given
        return
    port = free_port()
    with running_vllm(container, build_tiny_llama(), "/mnt/models", port, work, timeout=900):
        yield f"http://127.0.0.1:{port}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm", metavar="URL", help="a running vLLM of the tiny model (else started here)")
    parser.add_argument("--baseline", metavar="REF", default="main", help="the front as of git REF ('' for none)")
    parser.add_argument("--router", action="store_true", help="also through the vLLM router, one worker")
    parser.add_argument("--router-policy", default=None, help="the router's policy (default: as rendered)")
    parser.add_argument("--streams", default="1,8", help="levels of concurrency, comma-separated")
    parser.add_argument("--requests", type=int, default=4, help="completions per stream per round")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args()
    levels = [int(s) for s in args.streams.split(",")]
    vllm_container, router_container = rendered()
    with contextlib.ExitStack() as stack:
        tmp = pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="front-bench-")))
        upstream = stack.enter_context(vllm(args.vllm, vllm_container, tmp))
        paths = {"vllm": upstream}
        pids: dict[str, int] = {}
        paths["front"], pids["front"] = stack.enter_context(running_front(upstream, ROOT / "server", tmp / "front.log"))
        if args.baseline:
            tree = extract(args.baseline, tmp)
            paths["baseline"], pids["baseline"] = stack.enter_context(
                running_front(upstream, tree, tmp / "baseline.log")
            )
        if args.router:
            port = free_port()
            router = stack.enter_context(
                running_router(router_container, [upstream], port, free_port(), tmp / "router", args.router_policy)
            )
            paths["router"], pids["router"] = f"http://127.0.0.1:{port}", router.pid
        names = list(paths)
        results = {(n, s): Level() for n in names for s in levels}
        ratios: dict[tuple[str, int], list[tuple[float, float, float]]] = {(n, s): [] for n in names for s in levels}
        for round_ in range(args.rounds):
            for streams in levels:
                order = names[round_ % len(names) :] + names[: round_ % len(names)]
                rows = {}
                for name in order:
                    cpu = cpu_seconds(pids[name]) if name in pids else 0.0
                    level = asyncio.run(load(paths[name], streams, args.requests, args.tokens))
                    level.hop_cpu = cpu_seconds(pids[name]) - cpu if name in pids else 0.0
                    results[name, streams].add(level)
                    rows[name] = level.row()
                for name in names:
                    row, base = rows[name], rows["vllm"]
                    ratios[name, streams].append((row[0] / base[0], row[1] / base[1], row[2] / base[2]))
    print(
        f"vLLM (CPU build, tiny Llama), {args.tokens}-token streamed completions, {args.requests} per stream "
        f"per round, {args.rounds} rounds interleaved; each path against vLLM straight (median of the rounds' ratios):"
    )
    table: dict[str, dict[str, list[float]]] = {}
    for streams in levels:
        for name in names:
            ttft, rate, itl = results[name, streams].row()
            r_ttft, r_rate, r_itl = (statistics.median(r[i] for r in ratios[name, streams]) for i in range(3))
            hop = results[name, streams].hop_cpu / results[name, streams].tokens * 1e6
            table.setdefault(name, {})[str(streams)] = [ttft, rate, itl, hop, r_ttft, r_rate, r_itl]
            ratio = "" if name == "vllm" else f"   x{r_ttft:.2f} x{r_rate:.2f} x{r_itl:.2f}"
            cost = f"   hop CPU {hop:5.0f} us/token" if name in pids else ""
            print(
                f"  {streams:3d} streams  {name:9s} TTFT p50 {ttft:7.1f} ms  {rate:7.0f} tokens/s  "
                f"ITL {itl:6.2f} ms{ratio}{cost}"
            )
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
