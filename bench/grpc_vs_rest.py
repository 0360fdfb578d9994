"""REST (Open Inference Protocol v2, JSON) against gRPC (the same protocol, raw tensor bytes) on
one model server, the small MLP of bench/peer_bench.py, one row per request.

Both loads come from Python asyncio clients in a process of their own (httpx for REST, grpc.aio
for gRPC, each request body made once), so the two transports pay the same kind of client; the
rounds interleave them, so a busy neighbour skews both alike. Prints req/s per transport, the
server's CPU per request (from /proc: what the transport costs the server, whatever the client's
own speed; Python's HTTP clients are slower than grpc's C core, so req/s flatters gRPC) and the
ratios.

    .venv/bin/python bench/grpc_vs_rest.py --clients 16 --seconds 5 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import orjson
from grpc_load import grpc_load, infer_request
from our_server import our_server_command
from procstat import cpu_seconds

from testsupport.onnx_models import mlp_model
from testsupport.processes import free_port, running

SMALL = [256, 256, 128, 16]


def bodies(inputs: int) -> tuple[bytes, bytes]:
    row = np.random.default_rng(0).standard_normal((1, inputs)).astype(np.float32)
    rest = orjson.dumps(
        {"inputs": [{"name": "x", "shape": [1, inputs], "datatype": "FP32", "data": row.ravel().tolist()}]}
    )
    return rest, infer_request("small", row.ravel())


async def rest_load(port: int, body: bytes, clients: int, seconds: float) -> int:
    url = f"http://127.0.0.1:{port}/v2/models/small/infer"
    headers = {"content-type": "application/json"}
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=clients)) as client:

        async def one() -> int:
            done = 0
            while time.monotonic() < deadline:
                answer = await client.post(url, content=body, headers=headers)
                done += answer.status_code == 200
            return done

        return sum(await asyncio.gather(*(one() for _ in range(clients))))


def load(port: int, body: bytes, clients: int, seconds: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    out.put(asyncio.run(rest_load(port, body, clients, seconds)) / seconds)


def rest_rate(port: int, body: bytes, clients: int, seconds: float) -> float:
    out: mp.Queue = mp.get_context("spawn").Queue()  # type: ignore[type-arg]
    process = mp.get_context("spawn").Process(target=load, args=(port, body, clients, seconds, out))
    process.start()
    rate: float = out.get(timeout=seconds + 120)
    process.join()
    return rate


def measure(kind: str, port: int, body: bytes, clients: int, seconds: float, server: int) -> tuple[float, float]:
    """req/s, and the server's CPU milliseconds per request."""
    before = cpu_seconds(server)
    if kind == "rest":
        rate = rest_rate(port, body, clients, seconds)
    else:
        stats = grpc_load(port, body, clients, seconds)
        rate = stats["requests"] / stats["duration_s"]
    used = cpu_seconds(server) - before
    return rate, 1000 * used / max(1.0, rate * seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--max-delay-ms", type=float, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = mlp_model(Path(tmp) / "small" / "model.onnx", SMALL)
        port, grpc_port = free_port(), free_port()
        command = our_server_command(model, port, args, "--model-name", "small", "--grpc-port", str(grpc_port))
        rest_body, grpc_body = bodies(SMALL[0])
        rounds: dict[str, list[tuple[float, float]]] = {"rest": [], "grpc": []}
        ports = {"rest": (port, rest_body), "grpc": (grpc_port, grpc_body)}
        with running(command, ready_url=f"http://127.0.0.1:{port}/health/ready") as server:
            for kind, (at, body) in ports.items():  # warm up both paths
                measure(kind, at, body, args.clients, 1, server.pid)
            for _ in range(args.rounds):
                for kind, (at, body) in ports.items():
                    rounds[kind].append(measure(kind, at, body, args.clients, args.seconds, server.pid))
    rate = {kind: statistics.median(r for r, _ in results) for kind, results in rounds.items()}
    cost = {kind: statistics.median(c for _, c in results) for kind, results in rounds.items()}
    print(f"small MLP, {args.clients} clients, {args.rounds} rounds of {args.seconds:g} s (medians):")
    for kind, label in (("rest", "REST (JSON)       "), ("grpc", "gRPC (raw tensors)")):
        print(f"  {label} {rate[kind]:7.0f} req/s  server CPU {cost[kind]:.3f} ms/request")
    print(
        f"  gRPC / REST        {rate['grpc'] / rate['rest']:7.2f}x req/s, {cost['grpc'] / cost['rest']:.2f}x server CPU"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
