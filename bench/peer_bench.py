"""This model server against its peers, in one interleaved run on the same ONNX model:

  ours      - `python -m model_server serve` (adaptive batching);
  kserve    - KServe's Python ModelServer with a `kserve.Model` running the session;
  pytriton  - PyTriton: Triton's HTTP front end and dynamic batcher over the session.

Every server runs the same ONNX Runtime session options on the same model file and is
driven by `wrk` over loopback with the same Open Inference Protocol (v2) JSON request,
at 1, 16 and 64 concurrent clients, on a ~100k- and a ~38M-parameter MLP. A round
measures every server at every concurrency, one after another (the order rotating from
round to round); rounds repeat and the medians are reported, so a busy neighbour on the
machine skews all servers alike. The table has throughput, p50/p99 latency and CPU time
per request (the server's whole process tree: Triton's server and Python stub processes
count too), then our ratios.

gRPC rows (`ours/grpc`, `pytriton/grpc`) send the same row as a ModelInfer request with raw
tensor bytes, from a Python grpc.aio client in a process of its own (bench/grpc_load.py; KServe's
Python server is run without its gRPC port, as its docs show). The `raw` row is the ceiling:
the bare ONNX Runtime session, in this process, called back to back at a batch of
--max-batch-size rows; its req/s are rows/s and its latencies are per call.

The peers live in venvs of their own that `bench/setup-peers.sh` creates (run here
unless --no-setup; it also installs wrk); a peer whose venv is missing is skipped.

    .venv/bin/python bench/peer_bench.py                      # ~8 min on 2 cores
    .venv/bin/python bench/peer_bench.py --models small --rounds 3 --json peers.json
    .venv/bin/python bench/peer_bench.py --peers '' --baseline 0197ee7   # a change, before/after

`--baseline REF` also runs this server as it was at git ref REF (its `server/` directory,
extracted with `git archive`) with the same flags, as `baseline`: a change measured side by
side with what it replaced. For both, the mean rows per runtime call (from the server's own
`model_server_batch_size` histogram) are reported as `batch`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from grpc_load import grpc_load, infer_request
from our_server import histogram_totals, our_server_command, wrk_post
from procstat import cpu_seconds
from server_bench import bench_raw

from testsupport.onnx_models import mlp_model
from testsupport.processes import free_port, running

BENCH = Path(__file__).resolve().parent
MODELS = {"small": [256, 256, 128, 16], "large": [1024, 4096, 4096, 4096, 16]}
CONCURRENCY = [1, 16, 64]
PEERS = ["kserve", "pytriton"]
# Servers measured over gRPC as well (KServe's Python server serves gRPC only beside REST, unbatched).
GRPC = ("ours", "pytriton")
GRPC_SUFFIX = "/grpc"
RAW = "raw"
# The bar: REST at 64 clients on the large model, against the raw session at maxBatchSize.
RAW_SHARE = 0.85
RAW_SHARE_CLIENTS = 64


def cache_dir() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "model-server-bench"
    return Path(os.environ.get("MODEL_SERVER_BENCH_CACHE", default))


def params(sizes: list[int]) -> int:
    return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:], strict=True))


# --------------------------------------------------------------------------- load


def measure(server: Server, body: Path, clients: int, warmup: float, seconds: float) -> dict[str, Any]:
    """REST through wrk, or gRPC through grpc_load when `server` is a gRPC row."""
    if warmup:
        load(server, body, clients, warmup)
    batches_before = batch_totals(server) if server.metrics_url else None
    before = cpu_seconds(server.pid)
    stats = load(server, body, clients, seconds)
    cpu = cpu_seconds(server.pid) - before
    ok = stats["requests"]
    result = {
        "throughput": ok / stats["duration_s"],
        "p50_ms": stats["p50_ms"],
        "p99_ms": stats["p99_ms"],
        "cpu_ms_per_request": 1000 * cpu / max(1, ok),
        "errors": stats["errors"],
    }
    if batches_before is not None:
        rows, calls = (after - was for after, was in zip(batch_totals(server), batches_before, strict=True))
        result["batch"] = rows / calls if calls else float("nan")
    return result


def load(server: Server, body: Path, clients: int, seconds: float) -> dict[str, Any]:
    """One load: requests answered OK, duration_s, errors, p50_ms, p99_ms."""
    if server.grpc_port is not None:
        row = np.asarray(json.loads(body.read_text())["inputs"][0]["data"], dtype=np.float32)
        return grpc_load(server.grpc_port, infer_request("m", row), clients, seconds)
    stats = wrk_post(server.url, body, clients, seconds)
    return {
        "requests": stats["requests"] - stats["status_errors"],
        "duration_s": stats["duration_us"] / 1e6,
        "errors": stats["errors"] + stats["status_errors"],
        "p50_ms": stats["p50_us"] / 1000,
        "p99_ms": stats["p99_us"] / 1000,
    }


def measure_raw(model: Path, width: int, args: argparse.Namespace, seconds: float) -> dict[str, Any]:
    """The bare session at --max-batch-size rows a call: rows/s as throughput, per-call latency."""
    raw = bench_raw(model, width, args.max_batch_size, args.threads, seconds)
    return {
        "throughput": raw["throughput"],
        "p50_ms": raw["p50_ms"],
        "p99_ms": raw["p99_ms"],
        "cpu_ms_per_request": float("nan"),
        "errors": 0,
    }


# --------------------------------------------------------------------------- servers


class Server:
    def __init__(self, name: str, pid: int, port: int, grpc_port: int | None = None) -> None:
        self.name = name
        self.pid = pid
        self.url = f"http://127.0.0.1:{port}/v2/models/m/infer"
        self.grpc_port = grpc_port  # set on a gRPC row (its name ends in GRPC_SUFFIX)
        # Ours (and its baseline) count the rows of each runtime call; the peers do not.
        self.metrics_url = f"http://127.0.0.1:{port}/metrics" if name.removesuffix(GRPC_SUFFIX) in OURS else None


OURS = ("ours", "baseline")


def batch_totals(server: Server) -> tuple[float, float]:
    """(rows, runtime calls) so far, from `model_server_batch_size`'s sum and count."""
    assert server.metrics_url is not None
    return histogram_totals(server.metrics_url, "model_server_batch_size")


def commands(name: str, model: Path, port: int, grpc_port: int, args: argparse.Namespace) -> list[str]:
    if name in OURS:  # the baseline differs only in PYTHONPATH (see `environment`)
        grpc = ["--grpc-port", str(grpc_port)] if name in GRPC else []
        return our_server_command(
            model, port, args, "--model-name", "m", "--inter-op-threads", "1" if args.threads else "0", *grpc
        )
    python = cache_dir() / "peers" / name / "bin" / "python"
    return [
        str(python),
        str(BENCH / "peer_servers.py"),
        name,
        "--model",
        str(model),
        "--port",
        str(port),
        "--grpc-port",
        str(grpc_port),
        "--metrics-port",
        str(free_port()),
        "--threads",
        str(args.threads),
        "--max-batch-size",
        str(args.max_batch_size),
        "--max-delay-ms",
        str(args.triton_delay_ms),
    ]


def environment(name: str, baseline: Path | None) -> dict[str, str] | None:
    """The baseline imports `model_server` from its extracted tree, ahead of this checkout's."""
    if name != "baseline":
        return None
    assert baseline is not None
    path = os.pathsep.join([str(baseline / "server"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


def extract_baseline(ref: str, into: Path) -> Path:
    """This repository's `server/` as of `ref`, extracted under `into`."""
    root = BENCH.parent
    archive = subprocess.run(["git", "-C", str(root), "archive", ref, "server"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


@contextlib.contextmanager
def started(
    names: list[str], model: Path, args: argparse.Namespace, logs: Path, baseline: Path | None = None
) -> Iterator[list[Server]]:
    with contextlib.ExitStack() as stack:
        servers = []
        for name in names:
            port, grpc_port = free_port(), free_port()
            process = stack.enter_context(
                running(
                    commands(name, model, port, grpc_port, args),
                    env=environment(name, baseline),
                    log=logs / f"{name}.log",
                    ready_url=f"http://127.0.0.1:{port}/v2/models/m/ready",
                    timeout=300,
                    stop_timeout=30,
                )
            )
            servers.append(Server(name, process.pid, port))
            if name in GRPC:
                servers.append(Server(name + GRPC_SUFFIX, process.pid, port, grpc_port))
        yield servers


def available_peers(wanted: list[str]) -> list[str]:
    found = []
    for name in wanted:
        if (cache_dir() / "peers" / name / ".complete").exists():
            found.append(name)
        else:
            print(f"{name}: no venv in {cache_dir() / 'peers' / name} (bench/setup-peers.sh): skipped", flush=True)
    return found


# --------------------------------------------------------------------------- report


def medians(rows: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("throughput", "p50_ms", "p99_ms", "cpu_ms_per_request") + (("batch",) if "batch" in rows[0] else ())
    return {
        **{k: float(np.median([r[k] for r in rows])) for k in keys},
        "errors": sum(r["errors"] for r in rows),
        "throughput_range": [min(r["throughput"] for r in rows), max(r["throughput"] for r in rows)],
    }


def report(
    label: str,
    names: list[str],
    results: dict[str, dict[int, dict[str, Any]]],
    raw: dict[str, Any],
    max_batch: int,
    large: bool,
    clients: list[int],
) -> list[str]:
    """Print the table; the list of "Done when" misses."""
    misses = []
    print(f"\n{label}: medians")
    header = (
        f"  {'server':13} {'clients':>7} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'CPU ms/req':>10}  {'errors':>6}"
    )
    print(f"{header} {'batch':>6}")
    latency = f"{raw['p50_ms']:8.2f} {raw['p99_ms']:8.2f}"
    print(f"  {RAW:13} {'':>7} {raw['throughput']:9.0f} {latency} {'':>10}  {'':>6} {max_batch:6d}")
    for c in clients:
        for name in names:
            m = results[name][c]
            batch = f"{m['batch']:6.1f}" if "batch" in m else f"{'':6}"
            print(
                f"  {name:13} {c:7d} {m['throughput']:9.0f} {m['p50_ms']:8.2f} {m['p99_ms']:8.2f} "
                f"{m['cpu_ms_per_request']:10.3f}  {m['errors']:6d} {batch}"
            )
    share = results["ours"][clients[-1]]["throughput"] / raw["throughput"]
    print(f"  ours at {clients[-1]} clients (REST) = {share:.0%} of the raw session's rows/s at {max_batch} rows")
    if large and clients[-1] == RAW_SHARE_CLIENTS and share < RAW_SHARE:
        misses.append(f"{label} c={clients[-1]}: {share:.0%} of the raw session, under {RAW_SHARE:.0%}")
    if "baseline" in names:
        print("  ours / baseline: throughput, p50, p99, batch")
        for c in clients:
            ours, was = results["ours"][c], results["baseline"][c]
            print(
                f"    c={c:<3} {ours['throughput'] / was['throughput']:5.2f}x, "
                f"p50 {ours['p50_ms'] / was['p50_ms']:5.2f}x, p99 {ours['p99_ms'] / was['p99_ms']:5.2f}x, "
                f"batch {was['batch']:.1f} -> {ours['batch']:.1f}"
            )
    for suffix in ("", GRPC_SUFFIX):
        ours_name = "ours" + suffix
        peers = [n for n in names if n.endswith(GRPC_SUFFIX) == bool(suffix) and n.removesuffix(suffix) not in OURS]
        if not peers or ours_name not in names:
            continue
        print(f"  ratios ({ours_name} / peer): throughput, p99 (lower is better for ours)")
        for c in clients:
            ours = results[ours_name][c]
            parts = []
            for peer in peers:
                p = results[peer][c]
                parts.append(
                    f"{peer} {ours['throughput'] / p['throughput']:5.2f}x, p99 {ours['p99_ms'] / p['p99_ms']:5.2f}x"
                )
                # gRPC is held to PyTriton's on the large model only (the bar).
                if suffix and not large:
                    continue
                if ours["throughput"] < p["throughput"]:
                    misses.append(f"{label} {ours_name} c={c}: throughput below {peer}")
                if ours["p99_ms"] > p["p99_ms"]:
                    misses.append(
                        f"{label} {ours_name} c={c}: p99 {ours['p99_ms']:.1f} ms > {peer}'s {p['p99_ms']:.1f} ms"
                    )
            print(f"    c={c:<3} " + "   ".join(parts))
    return misses


def client_counts(text: str) -> list[int]:
    """`--clients 1,16,64` -> [1, 16, 64]: distinct positive counts, in order."""
    counts = sorted({int(c) for c in text.split(",") if c.strip()})
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError(f"client counts must be positive integers, not {text!r}")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="small,large", help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument(
        "--clients",
        type=client_counts,
        default=CONCURRENCY,
        help="comma-separated closed-loop client counts (the raw-session bar is judged at 64)",
    )
    parser.add_argument("--peers", default=",".join(PEERS), help="comma-separated; missing venvs are skipped")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    parser.add_argument("--duration", type=float, default=3.0, help="measured seconds per point and round")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument(
        "--threads", type=int, default=0, help="ORT intra-op threads for every server (0 = ORT default)"
    )
    parser.add_argument("--max-batch-size", type=int, default=16, help="ours and PyTriton")
    parser.add_argument(
        "--max-delay-ms", type=float, default=5.0, help="ours: the longest a request waits for company (maxDelayMs)"
    )
    parser.add_argument(
        "--triton-delay-ms",
        type=float,
        default=0.0,
        help="PyTriton's max_queue_delay (Triton's default, 0, is its best here: any other value is waited "
        "out even by a lone request)",
    )
    parser.add_argument("--baseline", metavar="REF", help="also run this server as of git ref REF, as `baseline`")
    parser.add_argument("--no-setup", action="store_true", help="do not run bench/setup-peers.sh first")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)

    if not args.no_setup:
        subprocess.run(["bash", str(BENCH / "setup-peers.sh")], check=False)
    if shutil.which("wrk") is None:
        print("wrk is not installed (bench/setup-peers.sh installs it): the figures need it", file=sys.stderr)
        return 2
    peers = available_peers([p for p in args.peers.split(",") if p])
    names = ["ours", *(["baseline"] if args.baseline else []), *peers]
    load = os.getloadavg()
    print(
        f"{os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; servers: {', '.join(names)}; "
        f"ORT threads={args.threads or 'default'}; batching: max {args.max_batch_size} rows, ours "
        f"maxDelayMs {args.max_delay_ms}, pytriton max_queue_delay {args.triton_delay_ms} ms; "
        f"wrk, 1 thread; {args.rounds} interleaved rounds of {args.duration:.0f} s per point"
        + (f"; baseline: server/ at {args.baseline}" if args.baseline else ""),
        flush=True,
    )
    everything: dict[str, Any] = {"names": names, "args": vars(args), "models": {}}
    misses: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        baseline = extract_baseline(args.baseline, Path(tmp)) if args.baseline else None
        for key in [m for m in args.models.split(",") if m]:
            sizes = MODELS[key]
            model = mlp_model(Path(tmp) / key / "model.onnx", sizes)
            body = Path(tmp) / f"{key}.json"
            row = np.random.default_rng(2).standard_normal(sizes[0]).round(4).tolist()
            body.write_text(
                json.dumps({"inputs": [{"name": "x", "shape": [1, sizes[0]], "datatype": "FP32", "data": row}]})
            )
            label = f"MLP {sizes} ({params(sizes) / 1e6:.2g}M parameters)"
            print(f"\n{label}", flush=True)
            with started(names, model, args, Path(tmp), baseline) as servers:
                rows = [server.name for server in servers]
                rounds: dict[str, dict[int, list[dict[str, Any]]]] = {n: {c: [] for c in args.clients} for n in rows}
                raw: list[dict[str, Any]] = []
                for r in range(args.rounds):
                    print(f"round {r + 1}/{args.rounds}, load average {os.getloadavg()[0]:.1f}", flush=True)
                    raw.append(measure_raw(model, sizes[0], args, args.duration))
                    print(f"  {RAW:13} {raw[-1]['throughput']:8.0f} rows/s at {args.max_batch_size} rows a call")
                    for c in args.clients:
                        # The order rotates each round, so no server is always measured first.
                        for server in servers[r % len(servers) :] + servers[: r % len(servers)]:
                            m = measure(server, body, c, args.warmup, args.duration)
                            rounds[server.name][c].append(m)
                            line = f"  {server.name:13} c={c:<3} {m['throughput']:8.0f}/s  p50 {m['p50_ms']:7.2f} ms  "
                            line += f"p99 {m['p99_ms']:7.2f} ms  CPU {m['cpu_ms_per_request']:.3f} ms/req"
                            print(f"{line}  errors {m['errors']}", flush=True)
            results = {n: {c: medians(rounds[n][c]) for c in args.clients} for n in rows}
            raw_median = medians(raw)
            misses += report(
                label, rows, results, raw_median, args.max_batch_size, large=key == "large", clients=args.clients
            )
            everything["models"][key] = {"sizes": sizes, "medians": results, "rounds": rounds, RAW: raw_median}
    if any(n not in OURS for n in names):
        print(
            f"\nours >= every peer in throughput, p99 <= every peer's, and >= {RAW_SHARE:.0%} of the raw session:",
            "met" if not misses else "MISSED",
        )
        for miss in misses:
            print(f"  {miss}")
    if args.json:
        Path(args.json).write_text(json.dumps(everything, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
