"""The operator at scale: N InferenceServices against the emulated API server.

python bench/operator_scale.py                      # N = 100, 500, 1000
python bench/operator_scale.py --counts 200 --json result.json

The real operator process (`python -m inference_operator run --all-namespaces`) runs against
testsupport's emulated API server (served from a thread of this process, on loopback). For each
N, on a fresh cluster:

1. N InferenceServices are created back to back; each counts as converged when its status has
   `observedGeneration == generation` and a URL and its Deployment and Service exist (the
   emulator runs no Deployment controller, so Ready stays False). Reported: time until all
   converged, per-CR latency from its create (p50/p99), API requests and writes per CR after
   the operator settles, the operator's CPU time and peak RSS (/proc).
2. Restart: SIGTERM (idle exit time), a new process resumes every object; the writes it makes
   are reported (a resync of unchanged objects must write nothing).
3. Shutdown under backlog: every spec is changed at once and SIGTERM is sent 1 s later, while
   most reconciles are still queued; reported: time until the process exited.

Numbers depend on the machine: the emulator (one core's worth of Python in this process) and
the operator share it. Run on a quiet machine and note its load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import httpx
import kmock

from testsupport.cluster import Cluster, running_cluster

NAMESPACE = "bench"
DEPLOYMENTS = "apps/v1/deployments"
SERVICES = "v1/services"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def inference_service(i: int, replicas: int = 1) -> dict:
    return {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": f"svc-{i:05d}", "namespace": NAMESPACE},
        "spec": {
            "model": {"uri": f"pvc://models/m{i % 7}", "format": "onnx"},
            "replicas": replicas,
            "resources": {"gpu": {"count": 1 + i % 2}},
        },
    }


class Operator:
    """One operator process, with its CPU time and peak RSS read from /proc."""

    def __init__(self, cluster: Cluster, log_path: pathlib.Path, concurrency: int | None = None):
        self.log_path = log_path
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        self._log = open(log_path, "w")  # noqa: SIM115  (closed in stop())
        args = [sys.executable, "-m", "inference_operator", "run", "--all-namespaces", "--metrics-port", "0"]
        if concurrency is not None:
            args += ["--concurrency", str(concurrency)]
        self.process = subprocess.Popen(
            args,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.cpu_seconds = 0.0
        self.peak_rss_mb = 0.0

    def sample(self) -> None:
        """CPU time (user+system) and peak RSS so far; kept after the process is gone."""
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = pathlib.Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
            self.cpu_seconds = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
            for line in pathlib.Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_rss_mb = int(line.split()[1]) / 1024

    def log_count(self, fragment: str) -> int:
        return self.log_path.read_text(errors="replace").count(fragment)

    def stop(self, timeout: float = 60) -> float:
        """SIGTERM; seconds until the process exited (killed after `timeout`)."""
        self.sample()
        start = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        elapsed = time.monotonic() - start
        self._log.close()
        return elapsed


# Parsed once: the poll below runs in this process, next to the emulator's thread.
CR_KEY = kmock.resource("inference.rocm.dev/v1alpha1/inferenceservices")
DEPLOYMENT_KEY = kmock.resource(DEPLOYMENTS)
SERVICE_KEY = kmock.resource(SERVICES)


def live(cluster: Cluster, resource: kmock.resource, name: str) -> dict | None:
    try:
        obj = cluster.emulator.objects[resource, NAMESPACE, name]
    except KeyError:
        return None
    return None if obj.deleted else obj.raw


def converged(cluster: Cluster, name: str) -> bool:
    cr = live(cluster, CR_KEY, name)
    if not cr:
        return False
    status = cr.get("status") or {}
    return (
        status.get("observedGeneration") == cr["metadata"].get("generation")
        and bool(status.get("url"))
        and live(cluster, DEPLOYMENT_KEY, name) is not None
        and live(cluster, SERVICE_KEY, name) is not None
    )


def wait_all(cluster: Cluster, started: dict[str, float], timeout: float) -> dict[str, float]:
    """name → seconds from its start until converged, for every name that converged in time."""
    pending = dict(started)
    done: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        now = time.monotonic()
        for name in [n for n in pending if converged(cluster, n)]:
            done[name] = now - pending.pop(name)
        time.sleep(0.2)
    return done


def requests_so_far(cluster: Cluster) -> int:
    return len(cluster.emulator._requests)  # noqa: SLF001  (kmock keeps every request)


def settle(cluster: Cluster, quiet: float = 2.0, timeout: float = 60) -> None:
    """Wait until the operator has sent no request for `quiet` seconds."""
    deadline = time.monotonic() + timeout
    last, since = requests_so_far(cluster), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = requests_so_far(cluster)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return


def wait_watching(cluster: Cluster, timeout: float = 60) -> None:
    """Until the operator watches InferenceServices (its start-up is not part of the figures)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for request in list(cluster.emulator._requests):  # noqa: SLF001
            if (
                request.params.get("watch") == "true"
                and request.resource
                and request.resource.plural == "inferenceservices"
            ):
                return
        time.sleep(0.1)
    raise RuntimeError("the operator never started watching InferenceServices")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


@dataclass
class Result:
    n: int
    converged: int
    all_converged_s: float
    latency_p50_s: float
    latency_p99_s: float
    requests_per_cr: float
    writes_per_cr: float
    operator_cpu_s: float
    operator_cpu_ms_per_cr: float
    operator_peak_rss_mb: float
    idle_shutdown_s: float
    resync_writes: int
    resync_s: float
    backlog_at_sigterm: int
    backlog_shutdown_s: float
    writes_by_kind: dict


@contextlib.contextmanager
def cluster_for_run() -> Iterator[tuple[Cluster, pathlib.Path]]:
    """A fresh emulated cluster; the operators' logs go to $OPERATOR_SCALE_LOGS if set."""
    with tempfile.TemporaryDirectory(prefix="operator-scale-") as tmp, running_cluster(pathlib.Path(tmp)) as cluster:
        logs = pathlib.Path(os.environ.get("OPERATOR_SCALE_LOGS") or tmp)
        logs.mkdir(parents=True, exist_ok=True)
        yield cluster, logs


def run(n: int, timeout: float, concurrency: int | None = None) -> Result:
    with cluster_for_run() as (cluster, tmp), httpx.Client(base_url=cluster.url, timeout=30) as client:
        path = f"/apis/inference.rocm.dev/v1alpha1/namespaces/{NAMESPACE}/inferenceservices"
        operator = Operator(cluster, tmp / "operator-1.log", concurrency)
        wait_watching(cluster)
        requests_before = requests_so_far(cluster)
        writes_before = Counter(cluster.emulator.writes)
        started: dict[str, float] = {}
        begin = time.monotonic()
        for i in range(n):
            obj = inference_service(i)
            response = client.post(path, json=obj)
            response.raise_for_status()
            started[obj["metadata"]["name"]] = time.monotonic()
        latencies = wait_all(cluster, started, timeout)
        all_converged = time.monotonic() - begin
        settle(cluster)
        operator.sample()
        writes = Counter(cluster.emulator.writes) - writes_before
        writes["inferenceservices:create"] -= n  # the benchmark's own
        operator_requests = requests_so_far(cluster) - requests_before - n
        cpu, rss = operator.cpu_seconds, operator.peak_rss_mb
        idle_shutdown = operator.stop()

        # A restart resumes every object: nothing changed, so nothing may be written.
        before_resync = Counter(cluster.emulator.writes)
        second = Operator(cluster, tmp / "operator-2.log", concurrency)
        resync_begin = time.monotonic()
        deadline = resync_begin + timeout
        while second.log_count("reconciled generation") < n and time.monotonic() < deadline:
            time.sleep(0.2)
        resync_s = time.monotonic() - resync_begin
        settle(cluster)
        resync_writes = sum((Counter(cluster.emulator.writes) - before_resync).values())

        # Shutdown under backlog: every spec changes, SIGTERM 1 s later.
        for i in range(n):
            name = inference_service(i)["metadata"]["name"]
            client.patch(
                f"{path}/{name}",
                json={"spec": {"replicas": 2}},
                headers={"Content-Type": "application/merge-patch+json"},
            ).raise_for_status()
        time.sleep(1.0)
        backlog = sum(not converged(cluster, inference_service(i)["metadata"]["name"]) for i in range(n))
        backlog_shutdown = second.stop()

    return Result(
        n=n,
        converged=len(latencies),
        all_converged_s=round(all_converged, 2),
        latency_p50_s=round(percentile(list(latencies.values()), 0.50), 2),
        latency_p99_s=round(percentile(list(latencies.values()), 0.99), 2),
        requests_per_cr=round(operator_requests / n, 1),
        writes_per_cr=round(sum(writes.values()) / n, 2),
        operator_cpu_s=round(cpu, 2),
        operator_cpu_ms_per_cr=round(cpu * 1000 / n, 1),
        operator_peak_rss_mb=round(rss, 1),
        idle_shutdown_s=round(idle_shutdown, 2),
        resync_writes=resync_writes,
        resync_s=round(resync_s, 2),
        backlog_at_sigterm=backlog,
        backlog_shutdown_s=round(backlog_shutdown, 2),
        writes_by_kind={k: v for k, v in sorted(writes.items()) if v},
    )


def table(results: list[Result]) -> str:
    columns = [
        ("N", "n"),
        ("converged", "converged"),
        ("all converged s", "all_converged_s"),
        ("p50 s", "latency_p50_s"),
        ("p99 s", "latency_p99_s"),
        ("requests/CR", "requests_per_cr"),
        ("writes/CR", "writes_per_cr"),
        ("operator CPU s", "operator_cpu_s"),
        ("CPU ms/CR", "operator_cpu_ms_per_cr"),
        ("peak RSS MB", "operator_peak_rss_mb"),
        ("resync writes", "resync_writes"),
        ("SIGTERM idle s", "idle_shutdown_s"),
        ("backlog", "backlog_at_sigterm"),
        ("SIGTERM backlog s", "backlog_shutdown_s"),
    ]
    lines = ["| " + " | ".join(title for title, _ in columns) + " |", "|" + "---|" * len(columns)]
    for result in results:
        values = asdict(result)
        lines.append("| " + " | ".join(str(values[key]) for _, key in columns) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--counts", default="100,500,1000", help="comma-separated N values")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for convergence per phase")
    parser.add_argument("--json", type=pathlib.Path, help="also write the results here")
    parser.add_argument("--concurrency", type=int, help="the operator's --concurrency (default: its own)")
    args = parser.parse_args(argv)
    results = []
    for n in (int(c) for c in args.counts.split(",")):
        load = os.getloadavg()[0]
        result = run(n, args.timeout, args.concurrency)
        results.append(result)
        print(f"N={n} (load average before: {load:.2f}): {json.dumps(asdict(result))}", flush=True)
    print(f"\nmachine: {os.cpu_count()} cores\n")
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 0 if all(r.converged == r.n and r.resync_writes == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
