"""How close the server keeps an accelerator to busy: its throughput against the device's own
rows/s at maxBatchSize, with the session's compute off the CPU.

On a GPU node the model computes on the device, and the host's cores run only the request
path: HTTP, JSON, batching, the answer. On a CPU-only machine the cores are both, so
peer_bench.py's raw-session bar measures how much CPU the request path leaves to the session.
This benchmark separates the two. It first times the real ONNX Runtime session on this machine
at every batch size up to maxBatchSize, then serves the same model through the real server with
each runtime call replaced by a wait of that length that uses no CPU (bench/emulated_device.py).
The device runs one call at a time. The ceiling is its rows/s at maxBatchSize; the figure is the
server's rows/s as a share of it.

The same run measures the server on the real session too (the CPU is the device), so the two
rows compare side by side. wrk, one thread, closed-loop clients; medians of interleaved rounds.

    .venv/bin/python bench/device_ceiling.py            # ~2 min on 2 cores
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from emulated_device import ENV
from our_server import histogram_totals, our_server_command, wrk_post
from peer_bench import MODELS
from procstat import cpu_seconds
from server_bench import bench_raw

from testsupport.onnx_models import mlp_model
from testsupport.processes import free_port, running

BENCH = Path(__file__).resolve().parent
CONCURRENCY = [1, 16, 64]
# peer_bench.py's bar, which this benchmark reads on a device instead of the CPU.
SHARE_BAR = 0.85


def device_seconds(model: Path, width: int, max_batch: int, threads: int, seconds: float) -> dict[int, float]:
    """The real session's seconds per call at 1..max_batch rows on this machine."""
    table = {}
    for rows in range(1, max_batch + 1):
        raw = bench_raw(model, width, rows, threads, seconds)
        table[rows] = rows / raw["throughput"]
    return table


@contextlib.contextmanager
def server(
    model: Path, args: argparse.Namespace, logs: Path, name: str, device: dict[int, float] | None
) -> Iterator[tuple[str, int]]:
    """Our server on `model`, on the real session (device None) or the emulated device: its base
    URL and pid."""
    port = free_port()
    command = our_server_command(model, port, args, "--model-name", "m")
    env = None
    if device is not None:
        command = [sys.executable, str(BENCH / "emulated_device.py"), *command[command.index("serve") :]]
        env = {**os.environ, ENV: json.dumps(device)}
    with running(
        command,
        env=env,
        log=logs / f"{name}.log",
        ready_url=f"http://127.0.0.1:{port}/v2/models/m/ready",
        timeout=300,
        stop_timeout=30,
    ) as process:
        yield f"http://127.0.0.1:{port}", process.pid


def measure(target: tuple[str, int], body: Path, clients: int, warmup: float, seconds: float) -> dict[str, float]:
    """wrk at `clients` against one server: req/s, latency, rows per runtime call, and the
    server's CPU per request (its whole process, the request path and the runtime call)."""
    base, pid = target
    wrk_post(f"{base}/v2/models/m/infer", body, clients, warmup)
    cpu_before = cpu_seconds(pid)
    rows_before, calls_before = histogram_totals(f"{base}/metrics", "model_server_batch_size")
    stats = wrk_post(f"{base}/v2/models/m/infer", body, clients, seconds)
    rows_after, calls_after = histogram_totals(f"{base}/metrics", "model_server_batch_size")
    cpu = cpu_seconds(pid) - cpu_before
    ok = stats["requests"] - stats["status_errors"]
    wall = stats["duration_us"] / 1e6
    return {
        "throughput": ok / wall,
        "cpu_us_per_request": 1e6 * cpu / max(1, ok),
        "p50_ms": stats["p50_us"] / 1000,
        "p99_ms": stats["p99_us"] / 1000,
        "batch": (rows_after - rows_before) / max(1.0, calls_after - calls_before),
        "errors": stats["errors"] + stats["status_errors"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="large", choices=sorted(MODELS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=0, help="ORT intra-op threads (0 = the server's default)")
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--max-delay-ms", type=float, default=5.0)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)

    sizes = MODELS[args.model]
    runtimes = ("device", "cpu")
    results: dict[str, dict[int, list[dict[str, float]]]] = {r: {c: [] for c in CONCURRENCY} for r in runtimes}
    with tempfile.TemporaryDirectory() as tmp:
        model = mlp_model(Path(tmp) / "model.onnx", sizes)
        body = Path(tmp) / "body.json"
        row = np.random.default_rng(2).standard_normal(sizes[0]).round(4).tolist()
        body.write_text(
            json.dumps({"inputs": [{"name": "x", "shape": [1, sizes[0]], "datatype": "FP32", "data": row}]})
        )
        device = device_seconds(model, sizes[0], args.max_batch_size, args.threads, 0.5)
        ceiling = args.max_batch_size / device[args.max_batch_size]
        print(
            f"MLP {sizes}, load average {os.getloadavg()[0]:.1f}; device: the real session's call times, "
            f"{1000 * device[1]:.2f} ms at 1 row, {1000 * device[args.max_batch_size]:.2f} ms at "
            f"{args.max_batch_size} rows: ceiling {ceiling:.0f} rows/s",
            flush=True,
        )
        raw_rows = []
        with (
            server(model, args, Path(tmp), "device", device) as on_device,
            server(model, args, Path(tmp), "cpu", None) as on_cpu,
        ):
            bases = {"device": on_device, "cpu": on_cpu}
            for r in range(args.rounds):
                raw = bench_raw(model, sizes[0], args.max_batch_size, args.threads, args.duration)
                raw_rows.append(raw["throughput"])
                print(f"round {r + 1}/{args.rounds}: raw CPU session {raw['throughput']:.0f} rows/s", flush=True)
                for c in CONCURRENCY:
                    for runtime in runtimes[r % 2 :] + runtimes[: r % 2]:
                        m = measure(bases[runtime], body, c, args.warmup, args.duration)
                        results[runtime][c].append(m)
                        print(
                            f"  {runtime:6} c={c:<3} {m['throughput']:7.0f}/s  p50 {m['p50_ms']:6.2f} ms  "
                            f"p99 {m['p99_ms']:6.2f} ms  batch {m['batch']:5.1f}  "
                            f"CPU {m['cpu_us_per_request']:4.0f} us/req",
                            flush=True,
                        )
    cpu_ceiling = float(np.median(raw_rows))
    ceilings = {"device": ceiling, "cpu": cpu_ceiling}
    medians = {
        runtime: {c: {k: float(np.median([m[k] for m in ms])) for k in ms[0]} for c, ms in by_clients.items()}
        for runtime, by_clients in results.items()
    }
    print(f"\nmedians of {args.rounds} rounds; ceilings: device {ceiling:.0f}, CPU session {cpu_ceiling:.0f} rows/s")
    print(
        f"  {'runtime':8} {'clients':>7} {'req/s':>8} {'share':>6} {'p50 ms':>7} {'p99 ms':>7} {'batch':>6} "
        f"{'CPU us/req':>10}"
    )
    for runtime in runtimes:
        for c in CONCURRENCY:
            m = medians[runtime][c]
            share = m["throughput"] / ceilings[runtime]
            print(
                f"  {runtime:8} {c:7d} {m['throughput']:8.0f} {share:6.0%} "
                f"{m['p50_ms']:7.2f} {m['p99_ms']:7.2f} {m['batch']:6.1f} {m['cpu_us_per_request']:10.0f}"
            )
    share = medians["device"][CONCURRENCY[-1]]["throughput"] / ceiling
    print(f"\nthe device at {CONCURRENCY[-1]} clients: {share:.0%} of its ceiling (bar {SHARE_BAR:.0%})")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"device_seconds": device, "ceilings": ceilings, "medians": medians, "rounds": results}, indent=2
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
