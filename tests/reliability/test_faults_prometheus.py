"""Faults of the Prometheus the autoscaler and the canary read: down, slow, answering garbage,
errors or non-finite numbers. Whatever it does, the autoscaler holds the replica count (never
to zero, never to max on missing data) and says why in the status, and the canary stays at its
step. A real HTTP server on loopback plays Prometheus, so the client's own timeouts, retries
and parsing meet each fault as they would in a cluster.
"""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import kubernetes
import pytest

from inference_operator.analysis import measure
from inference_operator.autoscaler.loop import Autoscaler
from inference_operator.k8s import KubeApi
from inference_operator.models import parse_spec
from inference_operator.prometheus.client import PrometheusClient
from inference_operator.rollout import Phase, RolloutState, advance
from inference_operator.settings import ANY_URL, CredentialPolicy
from testsupport.cluster import Cluster
from testsupport.processes import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: What the stand-in Prometheus does with every query.
FAULTS = ["down", "slow", "garbage", "error", "http-500", "nan", "inf", "empty", "wrong-type"]
#: How late the slow Prometheus answers: past every timeout of the client.
SLOW_S = 30.0


class StandInPrometheus:
    """Answers /api/v1/query as a healthy Prometheus would, every series at `value` (fresh, and
    no 5xx), or with `fault`."""

    def __init__(self) -> None:
        self.fault: str | None = None
        self.value = "1"
        self.queries = 0
        self.release = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                owner.queries += 1
                query = parse_qs(urlparse(self.path).query).get("query", [""])[0]
                status, body = owner.answer(query)
                if owner.fault == "slow":
                    owner.release.wait(SLOW_S)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the client gave up on a slow answer
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, query: str) -> tuple[int, bytes]:
        value = self.value
        if query.startswith("time() -"):  # the series' age: fresh
            value = "0.5"
        elif 'code=~"5.."' in query:  # a canary's 5xx share: none
            value = "0"
        value = {"nan": "NaN", "inf": "+Inf"}.get(self.fault or "", value)
        vector = {"resultType": "vector", "result": [{"metric": {}, "value": [time.time(), value]}]}
        bodies: dict[str | None, tuple[int, object]] = {
            "garbage": (200, "<html>a proxy's login page</html>"),
            "error": (200, {"status": "error", "errorType": "execution", "error": "query timed out"}),
            "http-500": (500, {"status": "error", "errorType": "internal", "error": "boom"}),
            "empty": (200, {"status": "success", "data": {"resultType": "vector", "result": []}}),
            "wrong-type": (200, {"status": "success", "data": {"resultType": "matrix", "result": []}}),
        }
        status, payload = bodies.get(self.fault, (200, {"status": "success", "data": vector}))
        return status, (payload if isinstance(payload, str) else json.dumps(payload)).encode()

    def __enter__(self) -> StandInPrometheus:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def prometheus() -> Iterator[StandInPrometheus]:
    with StandInPrometheus() as stand_in:
        yield stand_in


def create(cluster: Cluster, url: str, replicas: int) -> dict[str, Any]:
    """ml/mlp at `replicas`, scaled on queue depth against `url`, scale-down not delayed: with
    a value of 0 it would go to 1 at once, with a huge one to 8."""
    obj = {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "mlp", "namespace": "ml"},
        "spec": {
            "replicas": replicas,
            "model": {"uri": "pvc://models/mlp"},
            "autoscaling": {
                "minReplicas": 1,
                "maxReplicas": 8,
                "target": 10,
                "metric": "queueDepth",
                "prometheusUrl": url,
                "scaleDownStabilizationSeconds": 0,
            },
        },
    }
    assert cluster.apply_cr(obj).status_code in (200, 201)
    return copy.deepcopy(cluster.get_cr("ml", "mlp"))


def autoscaler(cluster: Cluster) -> Autoscaler:
    api = KubeApi(kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig)))
    return Autoscaler(
        api,
        "ml",
        "mlp",
        logging.getLogger("faults"),
        post_event=lambda reason, message: None,
        policy=CredentialPolicy(allowed_urls=(ANY_URL,)),
    )


@pytest.mark.parametrize("fault", FAULTS)
async def test_the_autoscaler_holds_its_replicas_and_says_why(
    cluster: Cluster, prometheus: StandInPrometheus, fault: str
) -> None:
    body = create(cluster, prometheus.url, replicas=4)
    loop = autoscaler(cluster)
    try:
        prometheus.value = "0"  # healthy, it would scale down: the fault must not let it
        prometheus.fault = None if fault == "down" else fault
        if fault == "down":
            prometheus.server.shutdown()
            prometheus.server.server_close()
        await loop.tick(body, parse_spec(body["spec"]))
        prometheus.fault, prometheus.value = fault, "1000000"  # nor scale up to max
        await loop.tick(body, parse_spec(body["spec"]))
    finally:
        await loop.aclose()
    cr = cluster.get_cr("ml", "mlp")
    assert cr["spec"]["replicas"] == 4, cr["status"].get("autoscaler")
    status = cr["status"]["autoscaler"]
    assert status["reason"].startswith("no data"), status
    assert "currentValue" not in status
    (active,) = [c for c in cr["status"]["conditions"] if c["type"] == "ScalingActive"]
    assert (active["status"], active["reason"]) == ("False", "MetricUnavailable"), active
    assert active["message"]


async def test_the_autoscaler_acts_again_once_prometheus_answers(
    cluster: Cluster, prometheus: StandInPrometheus
) -> None:
    """The holds above are the faults, not a loop that never acts: the same loop with the same
    Prometheus healthy again scales down."""
    body = create(cluster, prometheus.url, replicas=4)
    loop = autoscaler(cluster)
    try:
        prometheus.fault = "garbage"
        await loop.tick(body, parse_spec(body["spec"]))
        assert cluster.get_cr("ml", "mlp")["spec"]["replicas"] == 4
        prometheus.fault, prometheus.value = None, "0"
        await loop.tick(body, parse_spec(body["spec"]))
    finally:
        await loop.aclose()
    cr = cluster.get_cr("ml", "mlp")
    assert cr["spec"]["replicas"] == 1
    (active,) = [c for c in cr["status"]["conditions"] if c["type"] == "ScalingActive"]
    assert active["status"] == "True"


CANARY_SPEC = {
    "model": {"uri": "pvc://models/mlp"},
    "rollout": {
        "canary": {
            "steps": [10, 50],
            "stepSeconds": 60,
            "analysis": {"prometheusUrl": "http://prometheus:9090", "maxLatencyMs": 100, "minRequests": 1},
        }
    },
}


async def canary_tick(prometheus: StandInPrometheus, fault: str | None) -> tuple[str, RolloutState]:
    """One analysis of a canary at its first step, whose step time is long over (a passing check
    moves it on), with Prometheus healthy (5 ms, 5 requests, no 5xx) but for `fault`."""
    spec = parse_spec(CANARY_SPEC)
    canary = spec.rollout.canary if spec.rollout else None
    assert canary is not None
    state = RolloutState(phase=Phase.PROGRESSING, step=0, weight=10, step_started=0.0)
    prometheus.value = "5"
    if fault == "down":
        prometheus.server.shutdown()
        prometheus.server.server_close()
    else:
        prometheus.fault = fault
    async with PrometheusClient(prometheus.url) as client:
        check = await measure(client, spec, canary, "ml", "mlp", "mlp")
    progress = advance(state, canary, check, now=time.time(), command=None)
    assert (progress.event is None) == (progress.verdict != "pass"), progress
    return progress.verdict, progress.state


@pytest.mark.parametrize("fault", FAULTS)
async def test_the_canary_stays_at_its_step_on_missing_data(prometheus: StandInPrometheus, fault: str) -> None:
    verdict, state = await canary_tick(prometheus, fault)
    assert verdict == "inconclusive", (verdict, state.message)
    assert (state.phase, state.step, state.weight) == (Phase.PROGRESSING, 0, 10)


async def test_the_canary_moves_on_when_prometheus_answers(prometheus: StandInPrometheus) -> None:
    verdict, state = await canary_tick(prometheus, None)
    assert verdict == "pass", state.message
    assert (state.phase, state.step, state.weight) == (Phase.PROGRESSING, 1, 50)
