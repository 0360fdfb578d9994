"""Three-way model server benchmark, all in one run on the same ONNX model:

  (a) raw in-process ONNX Runtime session (the ceiling), by batch size;
  (b) this server (`python -m model_server serve`) with dynamic batching;
  (c) a naive per-request FastAPI server like the seed's (one session.run per request).

(b) and (c) run as separate processes and are loaded over HTTP by an httpx
async client in yet another process, at 1/16/64 concurrent clients, with the
same JSON request body. Prints throughput and p50/p99 latency, then ratios.

    .venv/bin/python bench/server_bench.py            # ~2 min on 2 cores
    .venv/bin/python bench/server_bench.py --threads 1 --json bench.json

Measurements are interleaved over rounds and medians reported, so a busy
neighbour on the machine skews all three alike rather than one of them.
wrk is used as the load generator when installed (`apt-get install wrk`),
else an httpx async client in a separate process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from our_server import our_server_command, wrk_post
from pydantic import BaseModel

from testsupport.onnx_models import mlp_model
from testsupport.processes import free_port, running

DEFAULT_SIZES = [1024, 4096, 4096, 4096, 16]
CONCURRENCY = [1, 16, 64]


# --------------------------------------------------------------------------- model


def session(path: Path, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


# --------------------------------------------------------------------------- (a) raw


def bench_raw(path: Path, width: int, batch: int, threads: int, duration: float) -> dict:
    sess = session(path, threads)
    x = np.random.default_rng(1).standard_normal((batch, width)).astype(np.float32)
    for _ in range(5):
        sess.run(None, {"x": x})
    latencies = []
    end = time.perf_counter() + duration
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        sess.run(None, {"x": x})
        latencies.append(time.perf_counter() - t0)
    lat = np.array(latencies)
    p50, p99 = (np.percentile(lat, [50, 99]) * 1000).tolist()
    return _summary(f"(a) raw ORT batch={batch}", len(lat) * batch / lat.sum(), p50, p99, len(lat), 0)


# --------------------------------------------------------------------------- (c) naive


class SeedRequest(BaseModel):
    data: list[float]
    model_version: str = "latest"


def naive_app(model: str, threads: int):
    """The seed's shape: one session, one `session.run` per request, no batching.
    A sync route, so FastAPI runs requests concurrently in its threadpool."""
    from fastapi import FastAPI

    sess = session(Path(model), threads)
    input_name = sess.get_inputs()[0].name
    app = FastAPI()

    @app.get("/health/ready")
    def ready() -> dict:
        return {"ready": True}

    @app.post("/infer")
    def infer(req: SeedRequest) -> dict:
        start = time.perf_counter()
        x = np.asarray(req.data, dtype=np.float32)[None, :]
        result = sess.run(None, {input_name: x})[0][0]
        return {
            "result": result.tolist(),
            "latency_ms": (time.perf_counter() - start) * 1000,
            "model_version": "1",
        }

    return app


def run_naive(model: str, port: int, threads: int) -> None:
    import uvicorn

    uvicorn.run(naive_app(model, threads), host="127.0.0.1", port=port, log_level="warning")


# --------------------------------------------------------------------------- load


def _httpx_load(url: str, body: bytes, concurrency: int, warmup: float, duration: float, out) -> None:
    """Closed-loop clients: each sends its next request when the last returns.
    One client per worker: a shared httpx pool degrades badly at high concurrency."""
    import httpx

    async def main() -> None:
        headers = {"content-type": "application/json"}
        latencies: list[float] = []
        errors = 0
        start = time.perf_counter()
        measure_from, stop_at = start + warmup, start + warmup + duration

        async def worker() -> None:
            nonlocal errors
            async with httpx.AsyncClient(timeout=60) as client:
                while (now := time.perf_counter()) < stop_at:
                    try:
                        r = await client.post(url, content=body, headers=headers)
                        ok = r.status_code == 200
                    except httpx.HTTPError:
                        ok = False
                    done = time.perf_counter()
                    if now >= measure_from:
                        if ok:
                            latencies.append(done - now)
                        else:
                            errors += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        out.put((latencies, errors, duration))

    asyncio.run(main())


def bench_http(
    label: str, url: str, body: bytes, concurrency: int, warmup: float, duration: float, loadgen: str
) -> dict:
    if loadgen == "wrk":
        return _bench_wrk(label, url, body, concurrency, warmup, duration)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_httpx_load, args=(url, body, concurrency, warmup, duration, queue))
    proc.start()
    latencies, errors, elapsed = queue.get(timeout=warmup + duration + 120)
    proc.join(timeout=30)
    lat = np.array(latencies)
    p50, p99 = (np.percentile(lat, [50, 99]) * 1000).tolist() if len(lat) else (float("nan"),) * 2
    return _summary(f"{label} c={concurrency}", len(lat) / elapsed, p50, p99, len(lat), errors)


def _bench_wrk(label: str, url: str, body: bytes, concurrency: int, warmup: float, duration: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        body_file = Path(tmp) / "body.json"
        body_file.write_bytes(body)
        wrk_post(url, body_file, concurrency, warmup)
        stats = wrk_post(url, body_file, concurrency, duration)
    stats["errors"] += stats["status_errors"]
    ok = stats["requests"] - stats["errors"]
    return _summary(
        f"{label} c={concurrency}",
        ok / (stats["duration_us"] / 1e6),
        stats["p50_us"] / 1000,
        stats["p99_us"] / 1000,
        ok,
        stats["errors"],
    )


def _summary(label: str, throughput: float, p50: float, p99: float, n: int, errors: int) -> dict:
    row = {"label": label, "throughput": throughput, "p50_ms": p50, "p99_ms": p99, "n": n, "errors": errors}
    print(
        f"  {label:<28} {throughput:9.1f}/s   p50 {p50:8.2f} ms   p99 {p99:8.2f} ms   n={n} errors={errors}",
        flush=True,
    )
    return row


def _median(rows: list[dict], label: str) -> dict:
    """Median of each figure over the rounds (robust to a noisy neighbour)."""
    pick = {k: float(np.median([r[k] for r in rows])) for k in ("throughput", "p50_ms", "p99_ms")}
    spread = f"{min(r['throughput'] for r in rows):.0f}-{max(r['throughput'] for r in rows):.0f}"
    errors = sum(r["errors"] for r in rows)
    print(
        f"  {label:<28} {pick['throughput']:9.1f}/s   p50 {pick['p50_ms']:8.2f} ms   "
        f"p99 {pick['p99_ms']:8.2f} ms   (range {spread}/s, errors {errors})"
    )
    return {"label": label, **pick, "errors": errors, "rounds": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="MLP layer widths")
    parser.add_argument("--duration", type=float, default=2.0, help="measured seconds per point and round")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians are reported")
    parser.add_argument("--threads", type=int, default=0, help="ORT intra-op threads for all three (0 = ORT default)")
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--max-delay-ms", type=float, default=5.0)
    parser.add_argument("--batch-workers", type=int, default=1, help="(b)'s concurrent batches")
    parser.add_argument(
        "--loadgen",
        choices=["auto", "wrk", "httpx"],
        default="auto",
        help="HTTP load generator process (auto: wrk when installed)",
    )
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--naive-server", nargs=2, metavar=("MODEL", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.naive_server:
        run_naive(args.naive_server[0], int(args.naive_server[1]), args.threads)
        return 0

    loadgen = args.loadgen if args.loadgen != "auto" else ("wrk" if shutil.which("wrk") else "httpx")
    sizes = [int(s) for s in args.sizes.split(",")]
    params = sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:], strict=True))
    batches = sorted({1, 8, args.max_batch_size, 64})
    rounds: dict[str, dict[str, list[dict]]] = {"a": {}, "b": {}, "c": {}}
    body = json.dumps({"data": np.random.default_rng(2).standard_normal(sizes[0]).round(4).tolist()}).encode()
    with tempfile.TemporaryDirectory() as tmp:
        model = mlp_model(Path(tmp) / "mlp.onnx", sizes)
        print(
            f"MLP {sizes}: {params / 1e6:.1f}M parameters, {model.stat().st_size / 1e6:.0f} MB; "
            f"{os.cpu_count()} CPUs; ORT threads={args.threads or 'default'}; "
            f"server max-batch-size={args.max_batch_size} max-delay-ms={args.max_delay_ms} "
            f"batch-workers={args.batch_workers}; "
            f"load generator: {loadgen}; {args.rounds} interleaved rounds",
            flush=True,
        )
        ports = {"b": free_port(), "c": free_port()}
        commands = {
            "b": our_server_command(
                model, ports["b"], args, "--max-queue", "256", "--batch-workers", str(args.batch_workers)
            ),
            "c": [
                sys.executable,
                __file__,
                "--threads",
                str(args.threads),
                "--naive-server",
                str(model),
                str(ports["c"]),
            ],
        }
        labels = {"b": "(b) model_server", "c": "(c) naive FastAPI"}
        with contextlib.ExitStack() as servers:
            for key, cmd in commands.items():
                ready = f"http://127.0.0.1:{ports[key]}/health/ready"
                servers.enter_context(running(cmd, ready_url=ready, timeout=120, stop_timeout=30))
            for r in range(args.rounds):
                load = os.getloadavg()[0]
                busy = "  (the machine is busy: expect noise)" if load > (os.cpu_count() or 1) else ""
                print(f"round {r + 1}/{args.rounds}, load average {load:.2f}{busy}", flush=True)
                for batch in batches:
                    row = bench_raw(model, sizes[0], batch, args.threads, args.duration)
                    rounds["a"].setdefault(f"batch={batch}", []).append(row)
                for c in CONCURRENCY:
                    for key in ("b", "c"):
                        row = bench_http(
                            labels[key],
                            f"http://127.0.0.1:{ports[key]}/infer",
                            body,
                            c,
                            args.warmup,
                            args.duration,
                            loadgen,
                        )
                        rounds[key].setdefault(f"c={c}", []).append(row)

    print(f"\nmedians over {args.rounds} rounds:")
    by = {
        "a": {k: _median(v, f"(a) raw ORT {k}") for k, v in rounds["a"].items()},
        "b": {k: _median(v, f"(b) model_server {k}") for k, v in rounds["b"].items()},
        "c": {k: _median(v, f"(c) naive FastAPI {k}") for k, v in rounds["c"].items()},
    }
    print("\nratios (same run, same model, medians):")
    for c in CONCURRENCY:
        b, cc = by["b"][f"c={c}"], by["c"][f"c={c}"]
        print(
            f"  c={c:<3} (b)/(c) throughput {b['throughput'] / cc['throughput']:6.2f}x   "
            f"p99 (c)/(b) {cc['p99_ms'] / b['p99_ms']:6.2f}x"
        )
    b64 = by["b"]["c=64"]["throughput"]
    for batch in batches[1:]:
        a = by["a"][f"batch={batch}"]["throughput"]
        print(f"  (a) batch={batch:<3} / (b) c=64 throughput {a / b64:5.2f}x")
    ratio_bc = b64 / by["c"]["c=64"]["throughput"]
    ratio_ab = by["a"][f"batch={args.max_batch_size}"]["throughput"] / b64
    print(
        f"\ntargets: (b) >= 5x (c) at 64 clients: {ratio_bc:.2f}x [{'met' if ratio_bc >= 5 else 'MISSED'}]; "
        f"(a) at batch {args.max_batch_size} (the server's batch) / (b) at 64 clients: {ratio_ab:.2f}x "
        f"(target <= 1.3) [{'met' if ratio_ab <= 1.3 else 'MISSED'}]"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "sizes": sizes,
                    "threads": args.threads,
                    "loadgen": loadgen,
                    "medians": by,
                    "ratio_b_over_c_c64": ratio_bc,
                    "ratio_a_over_b": ratio_ab,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
