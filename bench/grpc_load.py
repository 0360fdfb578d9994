"""A gRPC load for the benchmarks: `clients` concurrent Open Inference Protocol ModelInfer calls
in a loop, each request encoded once, from a process of its own (grpc.aio over grpc's C core),
so the client's CPU is not the benchmark's and every server pays the same client. What wrk is
to REST for bench/peer_bench.py; bench/grpc_vs_rest.py uses it too.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
from typing import Any

import grpc
import numpy as np

from model_server import grpc_predict_v2_pb2 as pb

METHOD = "/inference.GRPCInferenceService/ModelInfer"


def infer_request(model: str, row: np.ndarray) -> bytes:
    """One ModelInfer request of a single FP32 row as input `x`, its tensor as raw bytes."""
    request = pb.ModelInferRequest(model_name=model, raw_input_contents=[row.astype(np.float32).tobytes()])
    request.inputs.add(name="x", datatype="FP32", shape=[1, row.size])
    return request.SerializeToString()


async def _calls(port: int, body: bytes, clients: int, seconds: float) -> tuple[list[float], int, float]:
    """(latencies of the calls answered OK, failed calls, seconds the load ran)."""
    latencies: list[float] = []
    errors = 0
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(METHOD)
        started = time.perf_counter()
        deadline = started + seconds

        async def one() -> None:
            nonlocal errors
            while (begin := time.perf_counter()) < deadline:
                try:
                    await call(body, timeout=30)
                except grpc.aio.AioRpcError:
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - begin)

        await asyncio.gather(*(one() for _ in range(clients)))
        return latencies, errors, time.perf_counter() - started


def _run(port: int, body: bytes, clients: int, seconds: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    out.put(asyncio.run(_calls(port, body, clients, seconds)))


def grpc_load(port: int, body: bytes, clients: int, seconds: float) -> dict[str, Any]:
    """`clients` callers for `seconds`: requests answered OK, duration_s, errors, p50_ms, p99_ms."""
    context = mp.get_context("spawn")
    out: mp.Queue = context.Queue()  # type: ignore[type-arg]
    process = context.Process(target=_run, args=(port, body, clients, seconds, out))
    process.start()
    latencies, errors, duration = out.get(timeout=seconds + 120)
    process.join()
    p50, p99 = (np.percentile(latencies, [50, 99]) * 1000).tolist() if latencies else (float("nan"),) * 2
    return {"requests": len(latencies), "duration_s": duration, "errors": errors, "p50_ms": p50, "p99_ms": p99}
