"""routing.router with scale to zero on a real kube-apiserver: the operator (the chart's RBAC, an
activator configured) and the activator's real process, with the vLLM router's real binary.

At zero the activator's slice NAME-activator leads NAME-router (the Service status.url names),
NAME-router-private selects the router's pods, and the router's replicas are zero with the
workers'. A request for NAME-router's host at the activator wakes the InferenceService NAME (the
owner of NAME-router-private, read by the activator from the API server); the slice stays while
the worker is Ready and no router pod is, and goes once one is. The router's own readiness is
what the last step waits for: its real binary, discovering pods through this API server, answers
/readiness 503 until a worker pod of the service is Ready, and 200 once it is.

No kubelet, kube-proxy or Deployment controller runs here: the test plays them (pods and
Deployment status written through the API), and a held request cannot reach a ClusterIP; the
real-pods tier is where a held request would be answered through the router.

The module runs an API server of its own: its operator has an activator, which the session's
has not (two operators would fight over the slice).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import pathlib
import signal
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import yaml

from tests.llm.test_disaggregation_realapi import play_rollout
from tests.reconcile.test_operator_realapi import apply_cr, deployment, get, isvc, namespace, service_obj
from tests.tiers.realapi import Operator, own_apiserver, running_operator
from testsupport.cluster import condition, wait_for
from testsupport.envtest import ApiServer
from testsupport.processes import free_port, running, stop
from testsupport.router import RouterNotInstalled, router_executable

pytestmark = [pytest.mark.realapi, pytest.mark.slow, pytest.mark.integration]

NAME = "llm"
ACTIVATOR_NAMESPACE = "inference-system"
ACTIVATOR_SERVICE = "rio-activator"
SLICES = "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def routed_at_zero() -> dict[str, Any]:
    return {
        "model": {"uri": "hf://org/llm@main"},
        "runtime": {"engine": "vllm"},
        "resources": {"gpu": {"count": 0}, "cpu": "2", "memory": "4Gi"},
        "replicas": 0,
        "routing": {"router": {"replicas": 1}},
        "autoscaling": {
            "minReplicas": 0,
            "maxReplicas": 2,
            "metric": "ttftP95Ms",
            "target": 500,
            "intervalSeconds": 600,  # no Prometheus here: the loop stays out of the way
            "scaleToZero": {"maxWaitSeconds": 300},  # held until the test ends
        },
    }


@contextlib.contextmanager
def operator_with_activator(
    tmp_path_factory: pytest.TempPathFactory, name: str
) -> Iterator[tuple[ApiServer, Operator]]:
    """An API server, the activator's own slice in its namespace (as the EndpointSlice controller
    writes it for the chart's activator Service), and an operator told where the activator is."""
    with own_apiserver(tmp_path_factory, name) as (server, work):
        server.kubectl("create", "namespace", ACTIVATOR_NAMESPACE)
        activator_slice = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{ACTIVATOR_SERVICE}-abcde",
                "namespace": ACTIVATOR_NAMESPACE,
                "labels": {SERVICE_NAME_LABEL: ACTIVATOR_SERVICE},
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.244.0.7"], "conditions": {"ready": True}}],
            "ports": [{"name": "http", "port": 8012, "protocol": "TCP"}],
        }
        server.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(activator_slice))
        env = {"INFERENCE_OPERATOR_ACTIVATOR_SERVICE": f"{ACTIVATOR_NAMESPACE}/{ACTIVATOR_SERVICE}"}
        with running_operator(server, work / "operator.log", env=env) as operator:
            yield server, operator


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiServer, Operator]]:
    with operator_with_activator(tmp_path_factory, "envtest-router-zero") as running:
        yield running


def the_slice(server: ApiServer, ns: str) -> dict[str, Any] | None:
    return get(server, SLICES.format(ns=ns) + f"/{NAME}-activator")


@contextlib.contextmanager
def real_activator(server: ApiServer, work: pathlib.Path) -> Iterator[str]:
    """The activator's process (`model_server activator`) against this API server, as its admin
    (the chart's narrower rights are test_activator_wake_realapi.py's); its URL."""
    token = work / "token"
    token.write_text(server.admin_token)
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "model_server",
        "activator",
        f"--kube-api={server.url}",
        f"--kube-token-file={token}",
        f"--kube-ca-file={server.work / 'certs' / 'apiserver.crt'}",
        "--host=127.0.0.1",
        f"--port={port}",
        "--grpc-port=0",
        "--metrics-port=0",
        "--drain-listen-seconds=0",
        "--final-scrape-seconds=0",
        "--max-wait-seconds=300",
        f"--memory-limit-bytes={256 << 20}",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with running(command, env=env, log=work / "activator.log", ready_url=f"http://127.0.0.1:{port}/readyz") as process:
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            stop(process, timeout=0, sig=signal.SIGKILL)  # its held request would wait out its wait


def in_background(call: Any) -> Future[httpx.Response]:
    pool = ThreadPoolExecutor(max_workers=1)
    future: Future[httpx.Response] = pool.submit(call)
    pool.shutdown(wait=False)
    return future


def test_a_routed_service_at_zero_is_woken_through_its_routers_host_and_the_slice_waits_for_the_router(
    cluster: tuple[ApiServer, Operator], tmp_path: pathlib.Path
) -> None:
    server, operator = cluster
    ns = namespace(server)
    apply_cr(server, ns, NAME, routed_at_zero())

    # At zero: the router's Service leads to the activator; nothing runs.
    piece = wait_for(lambda: the_slice(server, ns), timeout=120, message="the activator's slice")
    assert piece["metadata"]["labels"][SERVICE_NAME_LABEL] == f"{NAME}-router", piece["metadata"]["labels"]
    assert [e["addresses"] for e in piece["endpoints"]] == [["10.244.0.7"]]
    settings = json.loads(piece["metadata"]["annotations"]["inference.rocm.dev/activator"])
    assert settings["readyPath"] == "/readiness"
    private = service_obj(server, ns, f"{NAME}-router-private")
    router = deployment(server, ns, f"{NAME}-router")
    assert private is not None and router is not None
    assert private["spec"]["selector"] == router["spec"]["selector"]["matchLabels"]
    assert service_obj(server, ns, f"{NAME}-private") is None
    assert router["spec"]["replicas"] == 0 and (deployment(server, ns, NAME) or {})["spec"]["replicas"] == 0
    play_rollout(server, ns, NAME, 0)
    play_rollout(server, ns, f"{NAME}-router", 0)
    ready = wait_for(
        lambda: (c := condition(isvc(server, ns, NAME), "Ready")) and c["reason"] == "ScaledToZero" and c,
        timeout=60,
        message="Ready at zero",
    )
    assert ready["status"] == "True", ready

    # A request for the router's host at the activator: held, and the service NAME woken.
    with real_activator(server, tmp_path) as url:
        host = f"{NAME}-router.{ns}.svc"
        pending = in_background(
            lambda: httpx.post(f"{url}/v1/completions", headers={"host": host}, json={}, timeout=300)
        )
        woken = wait_for(
            lambda: (obj := isvc(server, ns, NAME)) and obj["spec"].get("replicas") == 1 and obj,
            timeout=60,
            message="the service woken by the activator's wake annotation",
        )
        assert "inference.rocm.dev/wake" in woken["metadata"]["annotations"]
        assert not pending.done()  # held: no replica yet
        wait_for(
            lambda: (deployment(server, ns, f"{NAME}-router") or {}).get("spec", {}).get("replicas") == 1,
            timeout=60,
            message="the router's replicas back with the workers'",
        )
        assert (deployment(server, ns, NAME) or {})["spec"]["replicas"] == 1

        # The worker is Ready, no router pod yet: NAME-router has no ready endpoint, the slice stays.
        play_rollout(server, ns, NAME, 1)
        wait_for(
            lambda: (
                {r["role"]: r["readyReplicas"] for r in isvc(server, ns, NAME)["status"].get("roles", [])}
                == {"predictor": 1, "router": 0}
            ),
            timeout=60,
            message="the worker's ready count in status.roles",
        )
        assert the_slice(server, ns) is not None, "the slice went before any router pod was ready"

        # A router pod is Ready: the slice goes, NAME-router's traffic goes to the router again.
        play_rollout(server, ns, f"{NAME}-router", 1)
        wait_for(lambda: the_slice(server, ns) is None, timeout=60, message="the slice removed")
    assert "Traceback" not in operator.text()


class StandInWorker(http.server.BaseHTTPRequestHandler):
    """A vLLM pod's front as the router's health check sees it: 200 on GET."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


def test_the_real_router_is_ready_only_once_it_has_found_a_ready_worker(
    cluster: tuple[ApiServer, Operator], tmp_path: pathlib.Path
) -> None:
    """What the slice waits for: the router's readiness probe. Its real binary, run with the
    command line the operator rendered for the woken service (pods discovered by label in the
    service's namespace, through this API server), answers /readiness 503 with no worker pod
    and with one Pending, and 200 once it is Running and Ready: a Ready router pod has a worker
    to send a held request to."""
    try:
        executable = router_executable()
    except RouterNotInstalled as exc:
        pytest.skip(str(exc))
    server, _ = cluster
    ns = namespace(server)
    apply_cr(server, ns, NAME, {**routed_at_zero(), "replicas": 1})
    router = wait_for(lambda: deployment(server, ns, f"{NAME}-router"), timeout=120, message="the router")
    predictor = wait_for(lambda: deployment(server, ns, NAME), timeout=60, message="the workers' Deployment")
    (container,) = router["spec"]["template"]["spec"]["containers"]

    worker = socketserver.ThreadingTCPServer(("127.0.0.1", 0), StandInWorker)
    threading.Thread(target=worker.serve_forever, daemon=True).start()
    port, metrics = free_port(), free_port()
    replaced = {
        "--host": "127.0.0.1",
        "--port": str(port),
        "--prometheus-host": "127.0.0.1",
        "--prometheus-port": str(metrics),
        "--service-discovery-port": str(worker.server_address[1]),  # the pod's front, here
    }
    args = []
    for arg in container["args"]:
        flag, equals, _ = str(arg).partition("=")
        args.append(f"{flag}={replaced[flag]}" if equals and flag in replaced else str(arg))
    assert f"--service-discovery-namespace={ns}" in args
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KUBECONFIG": str(server.kubeconfig("admin"))}
    log = tmp_path / "router.log"
    try:
        with log.open("wb") as out:
            process = subprocess.Popen([str(executable), *args], env=env, stdout=out, stderr=subprocess.STDOUT)

        def readiness() -> int | None:
            assert process.poll() is None, log.read_text()[-3000:]
            try:
                return httpx.get(f"http://127.0.0.1:{port}/readiness", timeout=5).status_code
            except httpx.HTTPError:
                return None

        assert wait_for(readiness, timeout=300, interval=0.2, message="the router listening") == 503  # no worker

        labels = predictor["spec"]["template"]["metadata"]["labels"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{NAME}-worker", "labels": labels},
            "spec": {"containers": [{"name": "vllm", "image": "stand-in"}]},
        }
        with server.client() as client:
            assert client.post(f"/api/v1/namespaces/{ns}/pods", json=pod).status_code == 201
            merge = {"content-type": "application/merge-patch+json"}
            # Pending (vLLM not started): still no worker for the router.
            assert readiness() == 503
            status: dict[str, Any] = {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}
            path = f"/api/v1/namespaces/{ns}/pods/{NAME}-worker/status"
            status["conditions"] = [{"type": "Ready", "status": "True"}]
            assert client.patch(path, json={"status": status}, headers=merge).status_code == 200
            wait_for(lambda: readiness() == 200, timeout=60, interval=0.1, message="the router ready with a worker")
    finally:
        if "process" in locals():
            stop(process)
        worker.shutdown()
