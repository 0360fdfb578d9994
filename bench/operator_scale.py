"""The operator at scale: N InferenceServices against the emulated and a real API server.

python bench/operator_scale.py                      # N = 100, 500, 1000 on each API available
python bench/operator_scale.py --api real --counts 200 --json result.json

The real operator process (`python -m inference_operator run --all-namespaces`) runs against:

- `emulated`: testsupport's emulated API server, served from a thread of this process;
- `real`: a real kube-apiserver and etcd on loopback (the real-apiserver tier's binaries,
  `KUBEBUILDER_ASSETS`; skipped with a line when absent), the shipped CRDs, and the operator
  as its own user bound to the chart's RBAC. An audit log of every request that user makes
  gives the request and write counts.

For each API and N, on a fresh API server:

1. N InferenceServices are created (from 8 client threads); each counts as converged when its status has
   `observedGeneration == generation` and a URL and its Deployment and Service exist (no
   Deployment controller runs, so Ready stays False). Reported: time until all converged,
   per-CR latency from its create (p50/p99; checked every 0.2 s, against the emulator's memory
   or the real server's watches), API requests (by kind) and writes per CR after the operator
   settles, the operator's CPU time and peak RSS (/proc).
2. Restart: SIGTERM (idle exit time), a new process resumes every object; the writes it makes
   are reported (a resync of unchanged objects must write nothing).
3. Shutdown under backlog: every spec is changed (8 threads) and SIGTERM is sent 1 s later, while
   most reconciles are still queued; reported: time until the process exited.

Numbers depend on the machine: the API server (the emulator is one core's worth of Python in
this process; kube-apiserver and etcd are processes of their own) shares it with the operator.
Run on a quiet machine and note its load.
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
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import httpx
import kmock
from procstat import cpu_seconds

from testsupport.cluster import Cluster, running_cluster
from testsupport.envtest import OPERATOR_USER, ApiServer, AuditTail, assets, install_crds, running_apiserver

NAMESPACE = "bench"
DEPLOYMENTS = "apps/v1/deployments"
SERVICES = "v1/services"


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

    def __init__(self, kubeconfig: pathlib.Path, log_path: pathlib.Path, concurrency: int | None = None):
        self.log_path = log_path
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
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
        self.cpu_seconds = cpu_seconds(self.process.pid) or self.cpu_seconds
        with contextlib.suppress(OSError):
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


class Api(Protocol):
    """What the benchmark needs of an API server, emulated or real."""

    label: str
    poll_seconds: float
    kubeconfig: pathlib.Path  # the operator's
    client: httpx.Client  # the benchmark's own (an administrator)

    def requests(self) -> int:
        """Requests the operator has sent so far (and, emulated, the benchmark's writes)."""
        ...

    def writes(self) -> Counter[str]:
        """Writes so far, as `resource[/subresource]:verb`."""
        ...

    def requests_by_kind(self) -> Counter[str]:
        """Requests so far, as `resource[/subresource]:verb` (empty where not recorded)."""
        ...

    def server_cpu_seconds(self) -> float | None:
        """CPU time of the API server's processes so far (None: it runs in this process)."""
        ...

    def watching(self) -> bool:
        """Whether the operator watches InferenceServices yet."""
        ...

    def converged(self, names: set[str]) -> set[str]:
        """Which of `names` have converged (see the module's docstring)."""
        ...


def is_converged(cr: dict, has_deployment: bool, has_service: bool) -> bool:
    status = cr.get("status") or {}
    return (
        status.get("observedGeneration") == cr["metadata"].get("generation")
        and bool(status.get("url"))
        and has_deployment
        and has_service
    )


# Parsed once: the poll below runs in this process, next to the emulator's thread.
CR_KEY = kmock.resource("inference.rocm.dev/v1alpha1/inferenceservices")
DEPLOYMENT_KEY = kmock.resource(DEPLOYMENTS)
SERVICE_KEY = kmock.resource(SERVICES)


@dataclass
class EmulatedApi:
    """testsupport's emulator, read in memory (no requests of the benchmark's own polling)."""

    cluster: Cluster
    client: httpx.Client
    label: str = "emulated"
    poll_seconds: float = 0.2

    @property
    def kubeconfig(self) -> pathlib.Path:
        return self.cluster.kubeconfig

    def server_cpu_seconds(self) -> float | None:
        return None

    def _live(self, resource: kmock.resource, name: str) -> dict | None:
        try:
            obj = self.cluster.emulator.objects[resource, NAMESPACE, name]
        except KeyError:
            return None
        return None if obj.deleted else obj.raw

    def requests(self) -> int:
        return len(self.cluster.emulator._requests)  # noqa: SLF001  (kmock keeps every request)

    def writes(self) -> Counter[str]:
        return Counter(self.cluster.emulator.writes)

    def requests_by_kind(self) -> Counter[str]:
        return Counter()

    def watching(self) -> bool:
        return any(
            request.params.get("watch") == "true"
            and request.resource
            and request.resource.plural == "inferenceservices"
            for request in list(self.cluster.emulator._requests)  # noqa: SLF001
        )

    def converged(self, names: set[str]) -> set[str]:
        return {
            name
            for name in names
            if (cr := self._live(CR_KEY, name))
            and is_converged(
                cr, self._live(DEPLOYMENT_KEY, name) is not None, self._live(SERVICE_KEY, name) is not None
            )
        }


METADATA_ONLY = "application/json;as=PartialObjectMetadata{};g=meta.k8s.io;v=v1"


class Watched:
    """One kind's objects in the benchmark's namespace as a watch keeps them: listed once, then
    watched from that list's resourceVersion (again from the last one seen when the server ends
    a watch). Polling LISTs instead cost the API server, on the machine's same two cores, a
    list of every object twice a second: at 10,000 services, more than the operator's work."""

    def __init__(self, server: ApiServer, path: str, keep: Callable[[dict], Any], metadata_only: bool) -> None:
        self.path, self.keep, self.metadata_only = path, keep, metadata_only
        self.items: dict[str, Any] = {}
        self._client = server.client()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"watch {path}", daemon=True)
        self._thread.start()

    def _headers(self, suffix: str) -> dict[str, str]:
        return {"Accept": METADATA_ONLY.format(suffix)} if self.metadata_only else {}

    def _list(self) -> str:
        answer = self._client.get(self.path, headers=self._headers("List")).raise_for_status().json()
        self.items = {item["metadata"]["name"]: self.keep(item) for item in answer.get("items") or []}
        return str(answer["metadata"]["resourceVersion"])

    def _run(self) -> None:
        version: str | None = None
        while not self._stop.is_set():
            try:
                version = version or self._list()
                params = {"watch": "1", "resourceVersion": version, "allowWatchBookmarks": "true"}
                headers = self._headers("")
                with self._client.stream("GET", self.path, params=params, headers=headers, timeout=None) as answer:
                    for line in answer.iter_lines():
                        event = json.loads(line)
                        if event["type"] == "ERROR":  # 410: the version is too old to resume from
                            version = None
                            break
                        obj = event["object"]
                        version = obj["metadata"]["resourceVersion"]
                        if event["type"] == "DELETED":
                            self.items.pop(obj["metadata"]["name"], None)
                        elif event["type"] != "BOOKMARK":
                            self.items[obj["metadata"]["name"]] = self.keep(obj)
            except Exception as exc:  # noqa: BLE001  (whatever ends a watch, list and watch again)
                if self._stop.is_set():
                    return
                print(f"watch of {self.path} ended ({exc!r}): listing again", file=sys.stderr)
                version = None
                self._stop.wait(0.5)

    def close(self) -> None:
        self._stop.set()
        self._client.close()  # ends the watch's read
        self._thread.join(5)


@dataclass
class RealApi:
    """A real kube-apiserver: the operator's requests and writes from its audit log, state from
    watches (metadata only where that is enough)."""

    server: ApiServer
    client: httpx.Client
    label: str = "real kube-apiserver"
    poll_seconds: float = 0.2

    def __post_init__(self) -> None:
        self.audit = AuditTail(self.server.audit_log)
        status = lambda cr: (cr["metadata"].get("generation"), cr.get("status") or {})  # noqa: E731
        present = lambda _: True  # noqa: E731
        self.watches = [
            Watched(self.server, CR_PATH, status, metadata_only=False),
            Watched(self.server, f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments", present, metadata_only=True),
            Watched(self.server, f"/api/v1/namespaces/{NAMESPACE}/services", present, metadata_only=True),
        ]

    def close(self) -> None:
        for watch in self.watches:
            watch.close()

    @property
    def kubeconfig(self) -> pathlib.Path:
        return self.server.kubeconfig(OPERATOR_USER)

    def requests(self) -> int:
        self.audit.read()
        return self.audit.requests

    def writes(self) -> Counter[str]:
        self.audit.read()
        return Counter(self.audit.writes)

    def requests_by_kind(self) -> Counter[str]:
        self.audit.read()
        return Counter(self.audit.by_kind)

    def server_cpu_seconds(self) -> float | None:
        return sum(cpu_seconds(pid) for pid in self.server.pids.values())

    def watching(self) -> bool:
        self.audit.read()
        return "inferenceservices" in self.audit.watched

    def converged(self, names: set[str]) -> set[str]:
        crs, deployments, services = (dict(watch.items) for watch in self.watches)
        known = names & crs.keys()
        as_crs = {name: {"metadata": {"generation": crs[name][0]}, "status": crs[name][1]} for name in known}
        return {name for name, cr in as_crs.items() if is_converged(cr, name in deployments, name in services)}


CR_PATH = f"/apis/inference.rocm.dev/v1alpha1/namespaces/{NAMESPACE}/inferenceservices"


@contextlib.contextmanager
def emulated_api() -> Iterator[tuple[Api, pathlib.Path]]:
    """A fresh emulated cluster; the operators' logs go to $OPERATOR_SCALE_LOGS if set."""
    with tempfile.TemporaryDirectory(prefix="operator-scale-") as tmp, running_cluster(pathlib.Path(tmp)) as cluster:
        with httpx.Client(base_url=cluster.url, timeout=30) as client:
            yield EmulatedApi(cluster, client), logs_dir(tmp)


@contextlib.contextmanager
def real_api() -> Iterator[tuple[Api, pathlib.Path]]:
    """A fresh kube-apiserver and etcd with the shipped CRDs and the benchmark's namespace."""
    directory = assets()
    assert directory is not None
    with tempfile.TemporaryDirectory(prefix="operator-scale-") as tmp:
        with running_apiserver(pathlib.Path(tmp), directory, audit_reads=True) as server:
            install_crds(server)
            server.kubectl("create", "namespace", NAMESPACE)
            with server.client() as client:
                api = RealApi(server, client)
                try:
                    yield api, logs_dir(tmp)
                finally:
                    api.close()


def logs_dir(tmp: str) -> pathlib.Path:
    logs = pathlib.Path(os.environ.get("OPERATOR_SCALE_LOGS") or tmp)
    logs.mkdir(parents=True, exist_ok=True)
    return logs


APIS: dict[str, Callable[[], contextlib.AbstractContextManager[tuple[Api, pathlib.Path]]]] = {
    "emulated": emulated_api,
    "real": real_api,
}


def wait_all(api: Api, started: dict[str, float], timeout: float) -> dict[str, float]:
    """name → seconds from its start until converged, for every name that converged in time."""
    pending = dict(started)
    done: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        now = time.monotonic()
        for name in api.converged(set(pending)):
            done[name] = now - pending.pop(name)
        time.sleep(api.poll_seconds)
    return done


def settle(api: Api, quiet: float = 2.0, timeout: float = 60) -> None:
    """Wait until the operator has sent no request for `quiet` seconds."""
    deadline = time.monotonic() + timeout
    last, since = api.requests(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = api.requests()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return


def wait_watching(api: Api, timeout: float = 60) -> None:
    """Until the operator watches InferenceServices (its start-up is not part of the figures)."""
    deadline = time.monotonic() + timeout
    while not api.watching():
        if time.monotonic() > deadline:
            raise RuntimeError("the operator never started watching InferenceServices")
        time.sleep(0.1)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


@dataclass
class Result:
    api: str
    n: int
    converged: int
    all_created_s: float
    all_converged_s: float
    latency_p50_s: float
    latency_p99_s: float
    requests_per_cr: float
    writes_per_cr: float
    operator_cpu_s: float
    operator_cpu_ms_per_cr: float
    apiserver_cpu_ms_per_cr: float | None  # kube-apiserver and etcd, from the first create to converged
    operator_peak_rss_mb: float
    idle_shutdown_s: float
    resync_writes: int
    resync_s: float
    backlog_at_sigterm: int
    backlog_shutdown_s: float
    writes_by_kind: dict
    requests_per_cr_by_kind: dict


CLIENTS = 8  # the benchmark's own concurrent requests: a real API server validates (CEL) at a few ms each


def in_parallel(call: Callable[[Any], None], items: Iterable[Any]) -> None:
    """`call` on every item from CLIENTS threads (httpx clients are thread-safe)."""
    with ThreadPoolExecutor(CLIENTS) as pool:
        for future in [pool.submit(call, item) for item in items]:
            future.result()


def run(api_name: str, n: int, timeout: float, concurrency: int | None = None) -> Result:
    with APIS[api_name]() as (api, logs):
        names = [inference_service(i)["metadata"]["name"] for i in range(n)]
        operator = Operator(api.kubeconfig, logs / "operator-1.log", concurrency)
        wait_watching(api)
        requests_before = api.requests()
        writes_before, by_kind_before = api.writes(), api.requests_by_kind()
        started: dict[str, float] = {}
        server_cpu_before = api.server_cpu_seconds()
        begin = time.monotonic()

        def create(i: int) -> None:
            obj = inference_service(i)
            api.client.post(CR_PATH, json=obj).raise_for_status()
            started[obj["metadata"]["name"]] = time.monotonic()

        in_parallel(create, range(n))
        all_created = time.monotonic() - begin
        latencies = wait_all(api, started, timeout)
        all_converged = time.monotonic() - begin
        server_cpu_after = api.server_cpu_seconds()
        server_cpu = None if server_cpu_after is None else server_cpu_after - (server_cpu_before or 0.0)
        settle(api)
        operator.sample()
        writes = api.writes() - writes_before
        operator_requests = api.requests() - requests_before
        by_kind = api.requests_by_kind() - by_kind_before
        if api_name == "emulated":  # the emulator also counts the benchmark's own creates
            writes["inferenceservices:create"] -= n
            operator_requests -= n
        cpu, rss = operator.cpu_seconds, operator.peak_rss_mb
        idle_shutdown = operator.stop()

        # A restart resumes every object: nothing changed, so nothing may be written.
        before_resync = api.writes()
        second = Operator(api.kubeconfig, logs / "operator-2.log", concurrency)
        resync_begin = time.monotonic()
        deadline = resync_begin + timeout
        while second.log_count("reconciled generation") < n and time.monotonic() < deadline:
            time.sleep(0.2)
        resync_s = time.monotonic() - resync_begin
        settle(api)
        resync_writes = sum((api.writes() - before_resync).values())

        # Shutdown under backlog: every spec changes, SIGTERM 1 s later.
        def change(name: str) -> None:
            api.client.patch(
                f"{CR_PATH}/{name}",
                json={"spec": {"replicas": 2}},
                headers={"Content-Type": "application/merge-patch+json"},
            ).raise_for_status()

        in_parallel(change, names)
        time.sleep(1.0)
        backlog = n - len(api.converged(set(names)))
        backlog_shutdown = second.stop()

    return Result(
        api=api.label,
        n=n,
        converged=len(latencies),
        all_created_s=round(all_created, 2),
        all_converged_s=round(all_converged, 2),
        latency_p50_s=round(percentile(list(latencies.values()), 0.50), 2),
        latency_p99_s=round(percentile(list(latencies.values()), 0.99), 2),
        requests_per_cr=round(operator_requests / n, 1),
        writes_per_cr=round(sum(writes.values()) / n, 2),
        operator_cpu_s=round(cpu, 2),
        operator_cpu_ms_per_cr=round(cpu * 1000 / n, 1),
        apiserver_cpu_ms_per_cr=None if server_cpu is None else round(server_cpu * 1000 / n, 1),
        operator_peak_rss_mb=round(rss, 1),
        idle_shutdown_s=round(idle_shutdown, 2),
        resync_writes=resync_writes,
        resync_s=round(resync_s, 2),
        backlog_at_sigterm=backlog,
        backlog_shutdown_s=round(backlog_shutdown, 2),
        writes_by_kind={k: v for k, v in sorted(writes.items()) if v},
        requests_per_cr_by_kind={k: round(v / n, 2) for k, v in by_kind.most_common() if v},
    )


def table(results: list[Result]) -> str:
    columns = [
        ("API", "api"),
        ("N", "n"),
        ("converged", "converged"),
        ("all created s", "all_created_s"),
        ("all converged s", "all_converged_s"),
        ("p50 s", "latency_p50_s"),
        ("p99 s", "latency_p99_s"),
        ("requests/CR", "requests_per_cr"),
        ("writes/CR", "writes_per_cr"),
        ("operator CPU s", "operator_cpu_s"),
        ("CPU ms/CR", "operator_cpu_ms_per_cr"),
        ("API server CPU ms/CR", "apiserver_cpu_ms_per_cr"),
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
    parser.add_argument(
        "--api",
        choices=["auto", *APIS],
        default="auto",
        help="auto: the emulator, then a real kube-apiserver when KUBEBUILDER_ASSETS has one",
    )
    args = parser.parse_args(argv)
    if args.api == "auto":
        apis = ["emulated"] + (["real"] if assets() else [])
        if not assets():
            print("real kube-apiserver: skipped, no kube-apiserver and etcd in $KUBEBUILDER_ASSETS", flush=True)
    else:
        apis = [args.api]
        if args.api == "real" and not assets():
            parser.error("--api real: no kube-apiserver and etcd in $KUBEBUILDER_ASSETS (or kubectl/openssl missing)")
    results = []
    for api_name in apis:
        for n in (int(c) for c in args.counts.split(",")):
            load = os.getloadavg()[0]
            result = run(api_name, n, args.timeout, args.concurrency)
            results.append(result)
            print(f"{api_name} N={n} (load average before: {load:.2f}): {json.dumps(asdict(result))}", flush=True)
    print(f"\nmachine: {os.cpu_count()} cores\n")
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 0 if all(r.converged == r.n and r.resync_writes == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
