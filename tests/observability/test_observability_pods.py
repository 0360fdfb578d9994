"""The chart's alerts and dashboard on a real cluster: the tier's Prometheus scrapes the model pods
(as the chart's PodMonitor would) and the operator (as its ServiceMonitor would, from the rendered
ServiceMonitor) and evaluates the chart's rendered PrometheusRule every second, with the alerts'
`for` windows set short by chart values. A model server that answers 5xx fires the error-rate
alert, a slow one the latency SLO alert, the operator scaled to zero the operator-down alert; each
is pending for its window, then fires, then resolves. Then every dashboard query returns data.

One model, made here, is slow or failing on demand: its `spin` input sets how long it runs, and a
negative `spin` makes the runtime fail (the server answers 500)."""

from __future__ import annotations

import datetime
import pathlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.chart import helm as chart
from tests.observability import dashboard
from tests.tiers.pods import (
    FIGURES,
    OPERATOR_NAMESPACE,
    FileServer,
    PodPrometheus,
    ServiceJob,
    apply,
    chart_values,
    file_server,
    helm_install,
    kubectl_json,
    monitor_job,
    namespace,
    pod_prometheus,
    pods,
    ready,
    wait_ready_pods,
)
from testsupport import images
from testsupport.cluster import wait_for
from testsupport.load import Load
from testsupport.nodecluster import NodeCluster
from testsupport.onnx_models import save_model

pytestmark = [pytest.mark.pods, pytest.mark.slow]

NS = "obs"
NAME = "spin"
RELEASE = "rio"
SELECTOR = f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component=predictor"
WINDOW = 2  # seconds: every alert's `for` here
LATENCY_P95 = 0.25
ERROR_RATIO = 0.05
RULES = {
    "enabled": True,
    "latencyP95Seconds": LATENCY_P95,
    "latencyFor": f"{WINDOW}s",
    "errorRatio": ERROR_RATIO,
    "errorRateFor": f"{WINDOW}s",
    "operatorDownFor": f"{WINDOW}s",
}
SLOW_SPIN = 400_000  # ~0.4 s of one CPU a batch
WIDTH = 4


def spin_model(path: pathlib.Path) -> pathlib.Path:
    """y = x, after max(spin) trips of a do-nothing Loop; when any spin is negative the last
    Reshape asks for rows of 7 (never a whole number of rows of 4 in a batch of up to 4) and the
    runtime fails."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Abs", ["v_in"], ["abs"])],
        "spin",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, ["N", WIDTH]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("abs", TensorProto.FLOAT, ["N", WIDTH]),
        ],
    )
    nodes = [
        helper.make_node("ReduceMax", ["spin"], ["most"], keepdims=0),
        helper.make_node("Max", ["most", "zero"], ["trips"]),
        helper.make_node("Loop", ["trips", "true", "x"], ["spun"], body=body),
        helper.make_node("Sub", ["spun", "spun"], ["nothing"]),  # depends on the loop: not folded
        helper.make_node("Add", ["x", "nothing"], ["same"]),
        helper.make_node("ReduceMin", ["spin"], ["least"], keepdims=0),
        helper.make_node("Less", ["least", "zero"], ["fail"]),
        helper.make_node("Cast", ["fail"], ["fail_int"], to=TensorProto.INT64),
        helper.make_node("Mul", ["fail_int", "three"], ["extra"]),
        helper.make_node("Add", ["extra", "width"], ["columns"]),
        helper.make_node("Unsqueeze", ["columns", "axis0"], ["columns_1d"]),
        helper.make_node("Concat", ["minus_one", "columns_1d"], ["shape"], axis=0),
        helper.make_node("Reshape", ["same", "shape"], ["rows"]),
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Reshape", ["rows", "x_shape"], ["y"]),
    ]
    constants = {
        "zero": np.array(0, np.int64),
        "true": np.array(True),
        "three": np.array(3, np.int64),
        "width": np.array(WIDTH, np.int64),
        "axis0": np.array([0], np.int64),
        "minus_one": np.array([-1], np.int64),
    }
    graph = helper.make_graph(
        nodes,
        "spin",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", WIDTH]),
            helper.make_tensor_value_info("spin", TensorProto.INT64, ["N", 1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", WIDTH])],
        [numpy_helper.from_array(value, name) for name, value in constants.items()],
    )
    return save_model(graph, path)


def request(spin: int) -> dict:
    return {
        "inputs": [
            {"name": "x", "shape": [1, WIDTH], "datatype": "FP32", "data": [0.5] * WIDTH},
            {"name": "spin", "shape": [1, 1], "datatype": "INT64", "data": [spin]},
        ]
    }


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    """The chart rendered with the rules and the ServiceMonitor on, as the tier installs it."""
    values = chart_values("", replicaCount=1, monitoring={"prometheusRule": RULES, "serviceMonitor": {"enabled": True}})
    return chart.render(values, namespace=OPERATOR_NAMESPACE, release=RELEASE)


def operator_job(rendered: list[dict[str, Any]]) -> ServiceJob:
    """The scrape job the operator's rendered ServiceMonitor makes of its metrics Service."""
    return monitor_job(rendered, operator_deployment(rendered)["metadata"]["name"])


def operator_deployment(rendered: list[dict[str, Any]]) -> dict[str, Any]:
    """The rendered Deployment of the operator (the one its metrics Service selects)."""
    (service,) = [s for s in chart.by_kind(rendered, "Service") if s["metadata"]["name"].endswith("-metrics")]
    selector = service["spec"]["selector"].items()
    (deployment,) = [
        d
        for d in chart.by_kind(rendered, "Deployment")
        if selector <= d["spec"]["template"]["metadata"]["labels"].items()
    ]
    return deployment


@pytest.fixture(scope="module")
def files(node: NodeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FileServer]:
    root = tmp_path_factory.mktemp("files")
    for version in ("1", "2"):
        spin_model(root / NAME / version / "model.onnx")
    with file_server(root, node) as server:
        yield server


@pytest.fixture(scope="module")
def prometheus(
    node: NodeCluster, rendered: list[dict], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PodPrometheus]:
    rules = chart.one(rendered, "PrometheusRule")["spec"]["groups"]
    job = operator_job(rendered)
    with pod_prometheus(node, tmp_path_factory.mktemp("prom"), [NS], rules=rules, services=(job,)) as prom:
        yield prom


@pytest.fixture(scope="module")
def release(node: NodeCluster, files: FileServer, prometheus: PodPrometheus, tmp_path_factory) -> dict:
    apply(node, namespace(OPERATOR_NAMESPACE), namespace(NS))
    # No Prometheus Operator here: its kinds stay off, the tier's Prometheus stands in for them.
    values = chart_values(files.ca.read_text(), replicaCount=1, prometheus={"allowedUrls": [prometheus.url]})
    return helm_install(node, RELEASE, values, tmp_path_factory.mktemp("helm"))


def spin_service(files: FileServer, prometheus: PodPrometheus, version: str = "1") -> dict:
    return {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {
            "model": {"uri": f"{files.url}/{NAME}/{version}/model.onnx", "name": NAME, "version": version},
            "runtime": {
                "image": images.MODEL_SERVER_IMAGE,
                "imagePullPolicy": "Never",
                "executionProviders": ["CPUExecutionProvider"],
                "batching": {"maxBatchSize": 4, "maxDelayMs": 2},
            },
            "resources": {
                "gpu": {"count": 0},
                "cpu": "700m",
                "memory": "1Gi",
            },  # with its canary and the operator, within 2 CPUs
            # Exported by the operator for the dashboard; a target no load here reaches.
            "autoscaling": {
                "minReplicas": 1,
                "maxReplicas": 2,
                "metric": "rps",
                "target": 100_000,
                "prometheusUrl": prometheus.url,
                "intervalSeconds": 1,
                "windowSeconds": 10,
            },
            "rollout": {
                "strategy": "canary",
                "canary": {"steps": [50], "stepSeconds": 60, "analysis": {"maxLatencyMs": 1000, "minRequests": 5}},
            },
        },
    }


@pytest.fixture(scope="module")
def service(node: NodeCluster, release: dict, files: FileServer, prometheus: PodPrometheus) -> str:
    # Beside it, one whose Hub token Secret does not exist: the operator refuses to roll it out,
    # a handler error (retried) for the dashboard.
    refused = spin_service(files, prometheus)
    refused["metadata"]["name"] = "no-token"
    refused["spec"]["model"] = {"uri": "hf://org/model", "huggingFace": {"tokenSecret": "missing"}}
    del refused["spec"]["autoscaling"], refused["spec"]["rollout"]
    apply(node, spin_service(files, prometheus), refused)
    wait_ready_pods(node, NS, SELECTOR, 1, timeout=180)
    wait_for(lambda: prometheus.value(f'sum(up{{namespace="{NS}"}})') == 1, timeout=30, message="the pod scraped")
    FIGURES["observability: tier start to the model pod scraped (s)"] = time.monotonic() - node.started
    service = kubectl_json(node, "get", "service", NAME, "-n", NS)
    return f"http://{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}/v2/models/{NAME}/infer"


def alerts(prometheus: PodPrometheus, name: str) -> list[dict]:
    answer = httpx.get(f"{prometheus.url}/api/v1/alerts", timeout=5).json()
    return [a for a in answer["data"]["alerts"] if a["labels"]["alertname"] == name]


def fires(prometheus: PodPrometheus, name: str, since: float, timeout: float = 120) -> dict:
    """Wait for alert `name` to fire; it must have been pending for its whole `for` window first.
    Records the time from `since` (the cause) to firing."""
    firing = wait_for(
        lambda: next((a for a in alerts(prometheus, name) if a["state"] == "firing"), None),
        timeout=timeout,
        interval=0.25,
        message=f"{name} firing",
    )
    FIGURES[f"{name}: cause to firing (s)"] = time.monotonic() - since
    active = datetime.datetime.fromisoformat(firing["activeAt"].replace("Z", "+00:00")).timestamp()
    assert time.time() - active >= WINDOW, firing  # pending first, for the whole window
    return dict(firing)


def resolves(prometheus: PodPrometheus, name: str, since: float, timeout: float = 120) -> None:
    wait_for(lambda: not alerts(prometheus, name), timeout=timeout, interval=0.25, message=f"{name} resolved")
    FIGURES[f"{name}: cure to resolved (s)"] = time.monotonic() - since


class Paced:
    """A sender of one body to `url` at most `per_second` times a second, in a thread."""

    def __init__(self, url: str, body: dict, per_second: float) -> None:
        self.codes: list[int] = []
        self._stop = threading.Event()

        def send() -> None:
            with httpx.Client(timeout=10) as client:
                while not self._stop.wait(1 / per_second):
                    self.codes.append(client.post(url, json=body).status_code)

        self._thread = threading.Thread(target=send, daemon=True)
        self._thread.start()

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join(15)
        return self.codes


def healthy_until(condition: Any, url: str, timeout: float) -> Load:
    """Healthy traffic (fast, answered 200) until `condition()` holds: what brings a 5-minute
    ratio back under its threshold."""
    load = Load([url], concurrency=4, max_seconds=timeout + 10, body=request(0)).start()
    try:
        wait_for(condition, timeout=timeout, interval=0.25, message="the alert resolved under healthy traffic")
    finally:
        load.stop()
    assert load.sent > 0 and load.failed == 0, load.failures
    return load


def test_a_slow_model_server_fires_the_latency_alert_then_it_resolves(
    node: NodeCluster, prometheus: PodPrometheus, service: str
) -> None:
    assert not alerts(prometheus, "InferenceLatencySLOBreach")
    started = time.monotonic()
    slow = Load([service], concurrency=2, max_seconds=120, body=request(SLOW_SPIN), timeout=30).start()
    try:
        firing = fires(prometheus, "InferenceLatencySLOBreach", started)
    finally:
        slow.stop()
    assert slow.failed == 0, slow.failures
    assert (firing["labels"]["namespace"], firing["labels"]["model"]) == (NS, NAME), firing
    assert float(firing["value"]) > LATENCY_P95
    cured = time.monotonic()
    load = healthy_until(lambda: not alerts(prometheus, "InferenceLatencySLOBreach"), service, timeout=120)
    FIGURES["InferenceLatencySLOBreach: cure to resolved (s)"] = time.monotonic() - cured
    FIGURES["InferenceLatencySLOBreach: slow requests sent"] = slow.sent
    FIGURES["InferenceLatencySLOBreach: fast requests to resolve"] = load.sent


def test_a_model_server_answering_5xx_fires_the_error_rate_alert_then_it_resolves(
    node: NodeCluster, prometheus: PodPrometheus, service: str
) -> None:
    assert not alerts(prometheus, "InferenceErrorRateHigh")
    started = time.monotonic()
    failing = Paced(service, request(-1), per_second=25)
    try:
        firing = fires(prometheus, "InferenceErrorRateHigh", started)
    finally:
        codes = failing.stop()
    assert codes and set(codes) == {500}, codes
    assert (firing["labels"]["namespace"], firing["labels"]["model"]) == (NS, NAME), firing
    assert float(firing["value"]) > ERROR_RATIO
    cured = time.monotonic()
    load = healthy_until(lambda: not alerts(prometheus, "InferenceErrorRateHigh"), service, timeout=120)
    FIGURES["InferenceErrorRateHigh: cure to resolved (s)"] = time.monotonic() - cured
    FIGURES["InferenceErrorRateHigh: failed requests"] = len(codes)
    FIGURES["InferenceErrorRateHigh: answered requests to resolve"] = load.sent


def test_every_dashboard_query_returns_data(
    node: NodeCluster, files: FileServer, prometheus: PodPrometheus, service: str
) -> None:
    """Each panel's query as Grafana sends it for this namespace and model, after traffic of every
    kind (fast, slow, failing), a handler error and a canary started; the vLLM panels are run
    against the real vLLM pod in test_vllm_pods.py, the GPU ones nowhere (listed with why)."""
    apply(node, spin_service(files, prometheus, version="2"))  # a canary of version 2
    load = Load([service], concurrency=2, max_seconds=60, body=request(0)).start()
    try:
        for spin in (SLOW_SPIN, -1):
            httpx.post(service, json=request(spin), timeout=30)
        checked = {q.panel for q in dashboard.queries() if "model-server" in q.engines}
        dashboard.wait_for_data(prometheus.url, "model-server", NS, NAME, timeout=60)
        dashboard.save_snapshot("model-server", prometheus.url, "model-server", NS, NAME)  # for the docs' picture
    finally:
        load.stop()
    assert set(dashboard.NO_SERIES_ON_THE_TIER) <= checked
    FIGURES["dashboard queries run (model server and operator)"] = len(
        [
            q
            for q in dashboard.queries()
            if "model-server" in q.engines and q.panel not in dashboard.NO_SERIES_ON_THE_TIER
        ]
    )


def ready_pods(node: NodeCluster, deployment: dict[str, Any]) -> list[dict[str, Any]]:
    selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())
    return [p for p in pods(node, deployment["metadata"]["namespace"], selector) if ready(p)]


def test_the_operator_scaled_to_zero_fires_operator_down_then_it_resolves(
    node: NodeCluster, rendered: list[dict], prometheus: PodPrometheus, service: str
) -> None:
    """Last: the operator is away for a while (restored after, whatever happens)."""
    deployment = operator_deployment(rendered)
    name, replicas = deployment["metadata"]["name"], deployment["spec"]["replicas"]
    job = operator_job(rendered).job
    wait_for(
        lambda: prometheus.value(f'sum(up{{job="{job}", namespace="{OPERATOR_NAMESPACE}"}})') == replicas,
        timeout=60,
        message="every operator replica scraped",
    )
    assert not alerts(prometheus, "InferenceOperatorDown")
    started = time.monotonic()
    node.kubectl("scale", "deployment", name, "-n", OPERATOR_NAMESPACE, "--replicas=0")
    try:
        firing = fires(prometheus, "InferenceOperatorDown", started)
        assert firing["labels"]["severity"] == "critical"
    finally:
        node.kubectl("scale", "deployment", name, "-n", OPERATOR_NAMESPACE, f"--replicas={replicas}")
    restored = time.monotonic()
    wait_for(
        lambda: len(ready_pods(node, deployment)) == replicas, timeout=120, interval=0.5, message="the operator back"
    )
    resolves(prometheus, "InferenceOperatorDown", restored)
