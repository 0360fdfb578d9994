"""The command line both CPU benchmarks start the model server with, so that
bench/server_bench.py and bench/peer_bench.py measure the same configuration."""

from __future__ import annotations

import argparse
from pathlib import Path

from testsupport.processes import serve_command


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
