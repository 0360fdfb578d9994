"""The real-pods tier's fixtures (a plugin, loaded by tests/conftest.py; tests/tiers/pods.md):
the project's images built with podman, a real single-node cluster (testsupport.nodecluster),
the chart installed with the real Helm engine, and pods that run. Its tests are the modules
`*_pods.py` marked `pods`, skipped with one line where the binaries or root are missing."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import pathlib
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import yaml

from inference_operator.builders.activator import MANAGED_BY, MANAGED_BY_LABEL, SERVICE_NAME_LABEL
from tests.autoscaler.conftest import prometheus_binary
from tests.conftest import FIGURES  # noqa: F401  (the tier's modules write their figures there)
from testsupport import images, nodecluster
from testsupport.cluster import wait_for
from testsupport.nodecluster import NODE_IP, NodeCluster
from testsupport.processes import free_port, running

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "rocm-inference-operator"
OPERATOR_NAMESPACE = "inference-system"
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test marked `pods` is skipped with one reason where the tier cannot run."""
    tier = [item for item in items if item.get_closest_marker("pods")]
    reason = nodecluster.missing() if tier else None
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"{nodecluster.SKIP_REASON} ({reason})")
    for item in tier:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def project_images() -> list[str]:
    """The model-server and operator images, built by podman (cached layers reused)."""
    return images.build_all()


@pytest.fixture(scope="session")
def vllm_image() -> str:
    """The CPU vLLM image (built once per machine)."""
    return images.build_vllm()


@pytest.fixture(scope="session")
def router_image() -> str:
    """The vLLM router's image from router/Dockerfile (built once per machine)."""
    return images.build_router()


@contextlib.contextmanager
def tier(names: list[str], label: str) -> Iterator[NodeCluster]:
    """A cluster of the tier with these images in its containerd, removed after; `label` names it
    in the figures."""
    # Short: containerd's socket paths must fit in a sockaddr_un.
    work = pathlib.Path(tempfile.mkdtemp(prefix="rio-tier-"))
    stopping = 0.0
    phases: dict[str, float] = {}
    try:
        with nodecluster.running_cluster(work, names) as cluster:
            imported = "images the machine's image store lacked (imported)"
            FIGURES[imported] = FIGURES.get(imported, 0) + len(cluster.imported)
            phases = cluster.phases  # the teardown's steps are added to it
            yield cluster
            stopping = time.monotonic()
    finally:  # etcd's data and containerd's copy of the store (hard links, but a tree of them)
        shutil.rmtree(work, ignore_errors=True)
        for phase, seconds in phases.items():
            FIGURES[f"{label} cluster {phase} (s)"] = seconds
        if stopping:
            FIGURES[f"{label} cluster stopped and removed (s)"] = time.monotonic() - stopping


@pytest.fixture(scope="module")
def node(project_images: list[str], request: pytest.FixtureRequest) -> Iterator[NodeCluster]:
    with tier(project_images, request.module.__name__.rsplit(".", 1)[-1]) as cluster:
        yield cluster


def kubectl_json(node: NodeCluster, *args: str) -> Any:
    return json.loads(node.kubectl(*args, "-o", "json").stdout)


def activator_slices(node: NodeCluster, namespace: str, service: str) -> list[dict]:
    """The EndpointSlices the activator keeps for `service` (it is in the path while there is one)."""
    selector = f"{SERVICE_NAME_LABEL}={service},{MANAGED_BY_LABEL}={MANAGED_BY}"
    return list(kubectl_json(node, "get", "endpointslices", "-n", namespace, "-l", selector)["items"])


def apply(node: NodeCluster, *objects: dict) -> None:
    node.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=yaml.safe_dump_all(objects))


def namespace(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": RESTRICTED}}


def helm_install(node: NodeCluster, release: str, values: dict, work: pathlib.Path) -> dict:
    """`helm install` of the chart as shipped, by the real Helm engine (tests/chart/helm_cli.py)."""
    values_file = work / "values.json"
    values_file.write_text(json.dumps(values))
    done = subprocess.run(
        [sys.executable, "-m", "tests.chart.helm_cli", "install", release, str(CHART),
         "--namespace", OPERATOR_NAMESPACE, "--kubeconfig", str(node.kubeconfig("admin")), "-f", str(values_file)],
        cwd=ROOT, capture_output=True, text=True, timeout=180, check=False,
        env={**os.environ, "HELM_CACHE_HOME": str(work / "helm"), "HELM_CONFIG_HOME": str(work / "helm"),
             "HELM_DATA_HOME": str(work / "helm")},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@dataclass
class FileServer:
    url: str
    ca: pathlib.Path


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


@contextlib.contextmanager
def file_server(directory: pathlib.Path, node: NodeCluster, tls: bool = True) -> Iterator[FileServer]:
    """Serves `directory` on the node's bridge address (pods reach it; nothing else can), over
    https with a certificate from the tier's CA unless `tls` is false."""
    handler = lambda *a: _Quiet(*a, directory=str(directory))  # noqa: E731
    with bridge_server(handler, node, tls) as server:
        yield server


@contextlib.contextmanager
def bridge_server(handler: Any, node: NodeCluster, tls: bool = True) -> Iterator[FileServer]:
    """An HTTP server of `handler` (a BaseHTTPRequestHandler factory) on the node's bridge
    address, over https with a certificate from the tier's CA unless `tls` is false."""
    pki = node.work / "pki"
    (pki / "files.cnf").write_text(f"subjectAltName=IP:{NODE_IP}\n")
    for args in (
        ["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=files", "-keyout", "files.key", "-out", "files.csr"],
        ["x509", "-req", "-in", "files.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1",
         "-extfile", "files.cnf", "-out", "files.crt"],
    ):  # fmt: skip
        subprocess.run(["openssl", *args], cwd=pki, check=True, capture_output=True, timeout=60)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki / "files.crt", pki / "files.key")
    server = http.server.ThreadingHTTPServer((NODE_IP, 0), handler)
    if tls:
        # The handshake on the connection's first read, in its own handler thread: done on
        # accept, a client that connects and says nothing would hold the accept loop (and then
        # `shutdown`) for good.
        server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        scheme = "https" if tls else "http"
        yield FileServer(url=f"{scheme}://{NODE_IP}:{server.server_address[1]}", ca=pki / "ca.crt")
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class PodPrometheus:
    url: str

    def value(self, promql: str) -> float | None:
        payload = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=5).json()
        result = payload["data"]["result"]
        return float(result[0]["value"][1]) if result else None


def scrape_targets(node: NodeCluster, namespaces: list[str]) -> list[dict]:
    """The pods the chart's PodMonitor selects (annotation prometheus.io/scrape, running, with an
    IP), as Prometheus HTTP service-discovery target groups labelled namespace and pod."""
    groups = []
    with node.client() as client:
        for ns in namespaces:
            for pod in client.get(f"/api/v1/namespaces/{ns}/pods").json()["items"]:
                notes = pod["metadata"].get("annotations") or {}
                ip = (pod.get("status") or {}).get("podIP")
                if notes.get("prometheus.io/scrape") != "true" or not ip or pod["status"].get("phase") != "Running":
                    continue
                labels = {"namespace": ns, "pod": pod["metadata"]["name"]}
                labels["__metrics_path__"] = notes.get("prometheus.io/path", "/metrics")
                groups.append({"targets": [f"{ip}:{notes.get('prometheus.io/port', '9090')}"], "labels": labels})
    return groups


@dataclass(frozen=True)
class ServiceJob:
    """A ServiceMonitor's or PodMonitor's scrape job as the Prometheus Operator writes it: named
    after the Service (a PodMonitor's: "namespace/name"), each target labelled with its namespace
    and pod; `honor_labels` as the monitor's endpoint says. A Service's endpoints are its ready
    pods, and a terminating pod leaves them at once; a PodMonitor's targets are its running pods,
    ready or not, terminating ones included (`running_pods`)."""

    job: str
    namespace: str
    selector: dict[str, str]
    port: int
    path: str = "/metrics"
    honor_labels: bool = False
    running_pods: bool = False


def monitor_job(rendered: list[dict[str, Any]], monitor: str, namespace: str = OPERATOR_NAMESPACE) -> ServiceJob:
    """The scrape job the rendered ServiceMonitor or PodMonitor `monitor` makes: of the Service it
    selects (the Service's port that the endpoint names, as the container port of the pods behind
    it), or of the pods it selects (their container port that the endpoint names)."""
    monitors = [m for m in rendered if m["kind"] in ("ServiceMonitor", "PodMonitor")]
    (found,) = [m for m in monitors if m["metadata"]["name"] == monitor]
    wanted = found["spec"]["selector"]["matchLabels"].items()
    if found["kind"] == "PodMonitor":
        (endpoint,) = found["spec"]["podMetricsEndpoints"]
        job, selector, port_name = f"{namespace}/{monitor}", dict(wanted), endpoint["port"]
    else:
        (endpoint,) = found["spec"]["endpoints"]
        (service,) = [s for s in rendered if s["kind"] == "Service" and wanted <= s["metadata"]["labels"].items()]
        (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
        job, selector, port_name = service["metadata"]["name"], service["spec"]["selector"], port["targetPort"]
    (deployment,) = [
        d
        for d in rendered
        if d["kind"] == "Deployment" and selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
    ]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    (container_port,) = [p["containerPort"] for p in container["ports"] if p["name"] == port_name]
    return ServiceJob(
        job=job,
        namespace=namespace,
        selector=selector,
        port=container_port,
        path=endpoint["path"],
        honor_labels=endpoint.get("honorLabels", False),
        running_pods=found["kind"] == "PodMonitor",
    )


def service_targets(node: NodeCluster, service: ServiceJob) -> list[dict]:
    """The pods `service` scrapes, as HTTP service-discovery target groups."""
    selector = ",".join(f"{k}={v}" for k, v in service.selector.items())
    return [
        {"targets": [f"{p['status']['podIP']}:{service.port}"], "labels": {"namespace": service.namespace,
                                                                           "pod": p["metadata"]["name"]}}
        for p in pods(node, service.namespace, selector)
        if p["status"].get("podIP")
        # A ServiceMonitor's targets are its Service's ready endpoints (never a terminating pod);
        # a PodMonitor's, the running pods, terminating ones included.
        and (p["status"].get("phase") == "Running" if service.running_pods else ready(p))
    ]  # fmt: skip


@contextlib.contextmanager
def pod_prometheus(
    node: NodeCluster,
    work: pathlib.Path,
    namespaces: list[str],
    rules: list[dict] | None = None,
    services: tuple[ServiceJob, ...] = (),
) -> Iterator[PodPrometheus]:
    """The real Prometheus on the node's address, scraping every second the pods the chart's
    PodMonitor would select (and the `services` a ServiceMonitor would), evaluating the rule
    groups `rules` every second. Debian's Prometheus has no Kubernetes discovery built in, so the
    pods come from the API server through HTTP service discovery served by the test (refreshed
    every second)."""
    home = work / "prometheus"
    home.mkdir(exist_ok=True)
    jobs = {service.job: service for service in services}

    class Discovery(_Quiet):
        def do_GET(self) -> None:  # noqa: N802
            job = jobs.get(self.path.removeprefix("/jobs/"))
            body = json.dumps(service_targets(node, job) if job else scrape_targets(node, namespaces)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    discovery = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Discovery)
    threading.Thread(target=discovery.serve_forever, daemon=True).start()
    discovered = f"http://127.0.0.1:{discovery.server_address[1]}"
    config: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
        "scrape_configs": [
            {"job_name": "pods", "http_sd_configs": [{"url": f"{discovered}/targets", "refresh_interval": "1s"}]},
            *(
                {"job_name": s.job, "metrics_path": s.path, "honor_labels": s.honor_labels,
                 "http_sd_configs": [{"url": f"{discovered}/jobs/{s.job}", "refresh_interval": "1s"}]}
                for s in services
            ),
        ],
    }  # fmt: skip
    if rules is not None:
        (home / "rules.yaml").write_text(yaml.safe_dump({"groups": rules}))
        config["rule_files"] = [str(home / "rules.yaml")]
    (home / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port(NODE_IP)
    url = f"http://{NODE_IP}:{port}"
    command = [
        prometheus_binary(),
        f"--config.file={home / 'prometheus.yml'}",
        f"--storage.tsdb.path={home / 'data'}",
        f"--web.listen-address={NODE_IP}:{port}",
        "--log.level=warn",
    ]
    try:
        with running(command, log=home / "prometheus.log", cwd=home, ready_url=f"{url}/-/ready", timeout=30):
            yield PodPrometheus(url=url)
    finally:
        discovery.shutdown()
        discovery.server_close()


def pods(node: NodeCluster, ns: str, selector: str) -> list[dict]:
    """The pods `selector` matches in `ns`, from the API server (the tests poll this: a kubectl
    process costs ~60 ms of CPU a call, 15 times what a request does, on a machine whose two cores
    the pods being waited for need)."""
    with node.client() as client:
        answer = client.get(f"/api/v1/namespaces/{ns}/pods", params={"labelSelector": selector})
    answer.raise_for_status()
    return list(answer.json()["items"])


def ready(pod: dict) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return not pod["metadata"].get("deletionTimestamp") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in conditions
    )


def wait_ready_pods(node: NodeCluster, ns: str, selector: str, count: int, timeout: float) -> list[dict]:
    def found() -> list[dict] | None:
        ready_pods = [p for p in pods(node, ns, selector) if ready(p)]
        return ready_pods if len(ready_pods) == count else None

    return wait_for(found, timeout=timeout, interval=0.25, message=f"{count} Ready pods {selector} in {ns}")


def chart_values(ca_bundle: str, **overrides: Any) -> dict:
    """The chart's values on the tier: the local images (never pulled), the tier's CA as the
    platform's own for model fetches, a small operator; `overrides` replace whole top-level keys."""
    repository, tag = images.OPERATOR_IMAGE.rsplit(":", 1)
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "images": {"modelServer": images.MODEL_SERVER_IMAGE},
        "ha": {"peeringLifetimeSeconds": 10},
        "modelFetch": {"caBundle": ca_bundle},
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}},
        # One activator (scale to zero): its rollout still hands over, with room on two CPUs.
        "activator": {
            "replicas": 1,
            "drainListenSeconds": 3,  # one node: its endpoints move within a second
            "finalScrapeSeconds": 2,  # the tier's Prometheus scrapes every second
            "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}},
        },
        **overrides,
    }


def run_client_pod(node: NodeCluster, ns: str, name: str, script: str, timeout: float = 120) -> str:
    """Run `python -c script` in a restricted pod of the model-server image (a client inside the
    cluster) and return what it printed; it must succeed."""
    client = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "client",
                    "image": images.MODEL_SERVER_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", script],
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }
    apply(node, client)

    def finished() -> str | None:
        with node.client() as api:
            pod = api.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        pod.raise_for_status()
        phase = pod.json()["status"].get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    phase = wait_for(finished, timeout=timeout, interval=0.25, message=f"the {name} pod to finish")
    output = node.kubectl("logs", name, "-n", ns).stdout.strip()
    assert phase == "Succeeded", output
    return str(output)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture(autouse=True)
def cluster_state_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    """When a test of the tier fails, print what a person would look at: pods, events, the
    InferenceServices and the logs of every container that is not ready."""
    yield
    report = getattr(request.node, "report_call", None)
    if report is None or not report.failed or "node" not in request.fixturenames:
        return
    node: NodeCluster = request.getfixturevalue("node")
    sections = [
        node.kubectl("get", "pods,ris,deployments", "-A", "-o", "wide", check=False).stdout,
        node.kubectl("get", "events", "-A", "--sort-by=.lastTimestamp", check=False).stdout[-6000:],
        node.kubectl("get", "ris", "-A", "-o", "yaml", check=False).stdout[-4000:],
    ]
    for pod in kubectl_json(node, "get", "pods", "-A")["items"]:
        statuses = pod["status"].get("initContainerStatuses", []) + pod["status"].get("containerStatuses", [])
        for status in statuses:
            if not status.get("ready"):
                ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
                out = node.kubectl("logs", "-n", ns, name, "-c", status["name"], "--tail=40", check=False)
                sections.append(f"--- logs {ns}/{name}/{status['name']}\n{out.stdout}{out.stderr}")
    # The operator's decisions (slices written, wakes, status) explain most failures here.
    # Its own lines, not its HTTP client's (the autoscaler's queries, one a second).
    operator = ("-l", "app.kubernetes.io/component=operator", "--prefix", "--tail=3000")
    out = node.kubectl("logs", "-n", OPERATOR_NAMESPACE, *operator, check=False)
    own = [line for line in out.stdout.splitlines() if "] httpx " not in line][-200:]
    sections.append("--- logs of the operator\n" + "\n".join(own) + out.stderr)
    print("\n\n".join(sections))
