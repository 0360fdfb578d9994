"""What both CPU benchmarks share, so that bench/server_bench.py and bench/peer_bench.py measure
the same configuration the same way: the model server's command line and the wrk load."""

from __future__ import annotations

import argparse
import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

from testsupport.processes import serve_command

WRK_SCRIPT = Path(__file__).resolve().parent / "post.lua"


def wrk_post(url: str, body: Path, clients: int, seconds: float) -> dict[str, Any]:
    """wrk POSTing the JSON in `body` from `clients` connections for `seconds`: its summary
    (requests, duration_us, errors, status_errors, p50_us, p99_us)."""
    duration = f"{max(1, round(seconds))}s"
    command = ["wrk", "-t", "1", "-c", str(clients), "-d", duration, "--timeout", "30s", "-s", str(WRK_SCRIPT)]
    out = subprocess.run([*command, url, "--", str(body)], capture_output=True, text=True, check=True).stdout
    summary: dict[str, Any] = json.loads(next(line for line in out.splitlines() if line.startswith("WRK "))[4:])
    return summary


def our_server_command(model: Path, port: int, args: argparse.Namespace, *flags: str) -> list[str]:
    """`model_server serve` for an ONNX `model` on the CPU with the benchmark's batching
    and thread settings (`args.max_batch_size`, `args.max_delay_ms`, `args.threads`),
    quiet logs, and further `flags`."""
    return serve_command(
        model,
        port,
        "--format",
        "onnx",
        "--providers",
        "CPUExecutionProvider",
        "--no-watch",
        "--max-batch-size",
        str(args.max_batch_size),
        "--max-delay-ms",
        str(args.max_delay_ms),
        "--intra-op-threads",
        str(args.threads),
        "--log-level",
        "warning",
        *flags,
    )


def histogram_totals(metrics_url: str, name: str) -> tuple[float, float]:
    """(sum, count) of the histogram `name` over all its label sets, from the server's /metrics
    (`model_server_batch_size`: rows and runtime calls so far)."""
    totals = {"_sum": 0.0, "_count": 0.0}
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        for line in response.read().decode().splitlines():
            for suffix in totals:
                if line.startswith(f"{name}{suffix}"):
                    totals[suffix] += float(line.rsplit(" ", 1)[1])
    return totals["_sum"], totals["_count"]
