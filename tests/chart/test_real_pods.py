"""End to end on a real node: the chart's operator pods, an InferenceService whose model is fetched
by its init container over https, inference through the Service's ClusterIP, the built-in
autoscaler on real Prometheus, a rolling update and two canaries (one rolled back, one promoted)
under load, scale to zero and back through the chart's activator (held requests, the activator
rolled meanwhile, a model that never loads), a leader killed, and deletion.

The tests run in order on one cluster and one InferenceService (each step starts from where the
last one left it), in namespaces that enforce Pod Security `restricted`."""

from __future__ import annotations

import json
import pathlib
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from tests.autoscaler.conftest import tiny_mlp
from tests.chart import helm as chart
from tests.observability import dashboard
from tests.tiers.pods import (
    FIGURES,
    OPERATOR_NAMESPACE,
    FileServer,
    PodPrometheus,
    activator_slices,
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
    run_client_pod,
    wait_ready_pods,
)
from testsupport import images
from testsupport.cluster import condition, wait_for
from testsupport.load import Load
from testsupport.nodecluster import NodeCluster

pytestmark = [pytest.mark.pods, pytest.mark.slow]

NS = "e2e"
NAME = "mlp"
RELEASE = "rio"
SELECTOR = f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component=predictor"
OPERATOR_SELECTOR = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator"
TARGET_MS = 40.0
GRPC_PORT = 8081
SLOW = "9"
# One step at half the traffic (one canary pod beside the one stable pod), judged every second.
# The latency bound sits between the two candidates under the tier's load: the slow one's rows
# take twenty times the CPU, so under its 300m limit and two of the four clients it queues past
# a second, while the healthy one stays in the hundreds of ms even on a loaded machine.
CANARY = {
    "steps": [50],
    "stepSeconds": 3,
    "analysis": {"maxLatencyMs": 600, "minRequests": 5, "failureLimit": 1, "intervalSeconds": 1, "windowSeconds": 10},
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("files")
    for version in ("1", "2"):
        (root / "mlp" / version).mkdir(parents=True)
        tiny_mlp(root / "mlp" / version / "model.onnx")
    # A candidate twenty times slower (~140 ms of CPU a row): what a bad new version looks like.
    (root / "mlp" / SLOW).mkdir(parents=True)
    tiny_mlp(root / "mlp" / SLOW / "model.onnx", depth=200)
    return root


@pytest.fixture(scope="module")
def files(node: NodeCluster, models: pathlib.Path) -> Iterator[FileServer]:
    with file_server(models, node) as server:
        yield server


@pytest.fixture(scope="module")
def prometheus(node: NodeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodPrometheus]:
    """The tier's Prometheus, scraping the model pods and the chart's activator (as its
    PodMonitor would, draining pods included) and evaluating the chart's alerts."""
    monitoring = {"prometheusRule": {"enabled": True}, "podMonitor": {"enabled": True}}
    rendered = chart.render(chart_values("", monitoring=monitoring), namespace=OPERATOR_NAMESPACE, release=RELEASE)
    rules = chart.one(rendered, "PrometheusRule")["spec"]["groups"]
    (activator_monitor,) = [m for m in chart.by_kind(rendered, "PodMonitor") if chart.is_activator(m)]
    activator = monitor_job(rendered, activator_monitor["metadata"]["name"])
    with pod_prometheus(node, tmp_path_factory.mktemp("prom"), [NS], rules=rules, services=(activator,)) as prom:
        yield prom


@pytest.fixture(scope="module")
def release(node: NodeCluster, files: FileServer, prometheus: PodPrometheus, tmp_path_factory) -> dict:
    apply(node, namespace(OPERATOR_NAMESPACE), namespace(NS))
    # The file server's certificate is from the tier's CA: the platform's own CA, as a chart value.
    values = chart_values(files.ca.read_text(), prometheus={"allowedUrls": [prometheus.url]})
    return helm_install(node, RELEASE, values, tmp_path_factory.mktemp("helm"))


def inference_service(files: FileServer, prometheus: PodPrometheus, version: str = "1") -> dict:
    return {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {
            "model": {"uri": f"{files.url}/mlp/{version}/model.onnx", "name": NAME, "version": version},
            "runtime": {
                "image": images.MODEL_SERVER_IMAGE,
                "imagePullPolicy": "Never",
                "executionProviders": ["CPUExecutionProvider"],
                "batching": {"maxBatchSize": 8, "maxDelayMs": 2},
                "grpcPort": GRPC_PORT,
            },
            "resources": {"gpu": {"count": 0}, "cpu": "300m", "memory": "1Gi"},
            "autoscaling": {
                "minReplicas": 1,
                "maxReplicas": 3,
                "metric": "latencyP95Ms",
                "target": TARGET_MS,
                "prometheusUrl": prometheus.url,
                "intervalSeconds": 1,
                "windowSeconds": 10,
                "scaleDownStabilizationSeconds": 5,
                "scaleUp": {"pods": 1, "percent": 1, "periodSeconds": 3},
                "scaleDown": {"pods": 4, "percent": 100, "periodSeconds": 1},
            },
        },
    }


def ris(node: NodeCluster) -> dict:
    return kubectl_json(node, "get", "ris", NAME, "-n", NS)


def cluster_ip(node: NodeCluster) -> str:
    service = kubectl_json(node, "get", "service", NAME, "-n", NS)
    return f"{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"


def operator_pods(node: NodeCluster) -> list[dict]:
    return [p for p in pods(node, OPERATOR_NAMESPACE, OPERATOR_SELECTOR) if ready(p)]


def leader(node: NodeCluster) -> str:
    """The operator pod kopf lets act: the live peer with the highest priority."""
    peerings = kubectl_json(node, "get", "clusterkopfpeerings")["items"]
    peers = {k: v for p in peerings for k, v in (p.get("status") or {}).items() if isinstance(v, dict)}
    live = {p["metadata"]["name"] for p in operator_pods(node)}
    if not live or not live <= set(peers):
        return ""  # a replica not yet in the peering could still outrank the others
    return max(live, key=lambda name: peers[name]["priority"])


def logs(node: NodeCluster, pod: str) -> str:
    return node.kubectl("logs", "-n", OPERATOR_NAMESPACE, pod, check=False).stdout


def test_the_chart_runs_two_operator_pods_and_one_leads(node: NodeCluster, release: dict) -> None:
    replicas = wait_ready_pods(node, OPERATOR_NAMESPACE, OPERATOR_SELECTOR, 2, timeout=120)
    names = sorted(p["metadata"]["name"] for p in replicas)
    active = wait_for(lambda: leader(node), timeout=60, message="a peering leader")
    (standby,) = [n for n in names if n != active]
    try:
        wait_for(
            lambda: pause_state(logs(node, active)) == "resumed" and pause_state(logs(node, standby)) != "resumed",
            timeout=60,
            message="the leader acting and the standby paused",
        )
    except AssertionError as exc:
        peering = node.kubectl("get", "clusterkopfpeerings", "-o", "yaml").stdout
        raise AssertionError(
            f"{exc}\n{peering}\n{active}:\n{logs(node, active)}\n{standby}:\n{logs(node, standby)}"
        ) from None


def pause_state(log: str) -> str | None:
    """kopf's last word on peering: "resumed", "paused", or None for a replica that started
    behind a higher-priority peer and so never resumed (it starts paused, silently)."""
    state = None
    for line in log.splitlines():
        if "Resuming operations after the pause" in line:
            state = "resumed"
        elif "Pausing operations in favour of" in line:
            state = "paused"
    return state


def test_an_inference_service_fetches_its_model_and_turns_ready(
    node: NodeCluster, release: dict, files: FileServer, prometheus: PodPrometheus
) -> None:
    applied = time.monotonic()
    apply(node, inference_service(files, prometheus))
    wait_ready_pods(node, NS, SELECTOR, 1, timeout=120)
    FIGURES["tier start to first Ready model pod (s)"] = time.monotonic() - node.started
    FIGURES["InferenceService applied to Ready pod (s)"] = time.monotonic() - applied
    wait_for(lambda: (condition(ris(node), "Ready") or {}).get("status") == "True", timeout=60, message="Ready")
    table = node.kubectl("get", "ris", "-n", NS).stdout
    assert NAME in table and "True" in table and f"http://{NAME}.{NS}.svc.cluster.local" in table, table
    (pod,) = pods(node, NS, SELECTOR)
    (fetch,) = pod["status"]["initContainerStatuses"]
    assert fetch["state"]["terminated"]["exitCode"] == 0


def test_inference_over_the_cluster_ip_from_the_host_and_from_a_pod(node: NodeCluster, release: dict) -> None:
    address = cluster_ip(node)
    simple = httpx.post(f"http://{address}/infer", json={"data": [[0.1] * 64]}, timeout=10)
    assert simple.status_code == 200, simple.text
    v2 = httpx.post(
        f"http://{address}/v2/models/{NAME}/infer",
        json={"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.1] * 64}]},
        timeout=10,
    )
    assert v2.status_code == 200, v2.text
    assert v2.json()["outputs"][0]["shape"] == [1, 1]
    script = (
        "import json, urllib.request; "
        f"r = urllib.request.urlopen(urllib.request.Request('http://{address}/v2/models/{NAME}/infer', "
        "data=json.dumps({'inputs': [{'name': 'x', 'shape': [1, 64], 'datatype': 'FP32', 'data': [0.1] * 64}]})"
        ".encode(), headers={'Content-Type': 'application/json'}), timeout=10); "
        "print(r.status, json.loads(r.read())['outputs'][0]['shape'])"
    )
    output = run_client_pod(node, NS, "client", script, timeout=60)
    assert output == "200 [1, 1]", output


def test_model_infer_over_grpc_through_the_cluster_ip_answers_as_rest_does(node: NodeCluster, release: dict) -> None:
    """runtime.grpcPort: Triton's own gRPC client, from the host, through the Service's grpc port."""
    service = kubectl_json(node, "get", "service", NAME, "-n", NS)
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == "grpc"]
    assert (port["port"], port["appProtocol"]) == (GRPC_PORT, "grpc")
    client = triton.InferenceServerClient(f"{service['spec']['clusterIP']}:{GRPC_PORT}")
    assert client.is_server_ready() and client.is_model_ready(NAME)
    rows = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)
    tensor = triton.InferInput("x", [1, 64], "FP32")
    tensor.set_data_from_numpy(rows)
    answer = client.infer(NAME, [tensor], client_timeout=10)
    rest = httpx.post(
        f"http://{cluster_ip(node)}/v2/models/{NAME}/infer",
        json={"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": rows.ravel().tolist()}]},
        timeout=10,
    ).json()["outputs"][0]
    got = answer.as_numpy(rest["name"])
    assert got is not None and got.shape == tuple(rest["shape"]) == (1, 1)
    np.testing.assert_array_equal(got.ravel(), np.asarray(rest["data"], np.float32))
    with pytest.raises(InferenceServerException) as refused:
        client.infer("another", [tensor], client_timeout=10)
    assert refused.value.status() == "StatusCode.NOT_FOUND"


def test_a_pod_that_breaks_restricted_is_refused(node: NodeCluster, release: dict) -> None:
    rogue = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "rogue", "namespace": NS},
        "spec": {"containers": [{"name": "c", "image": images.MODEL_SERVER_IMAGE, "imagePullPolicy": "Never"}]},
    }
    done = node.kubectl("apply", "-f", "-", stdin=json.dumps(rogue), check=False)
    assert done.returncode != 0 and "violates PodSecurity" in done.stderr, done.stderr


def test_the_autoscaler_scales_up_under_load_and_back_down(
    node: NodeCluster, release: dict, prometheus: PodPrometheus
) -> None:
    wait_for(lambda: prometheus.value(f'sum(up{{namespace="{NS}"}})') == 1, timeout=30, message="the pod scraped")
    started = time.monotonic()
    load = Load([f"http://{cluster_ip(node)}/infer"], concurrency=12, max_seconds=120).start()
    try:
        wait_for(lambda: ris(node)["spec"].get("replicas", 1) > 1, timeout=60, interval=0.5, message="scale-up")
        up_at = time.monotonic() - started
        # As many Ready pods as the replicas asked for now (a fast path may add two in a row).
        wait_for(
            lambda: len([p for p in pods(node, NS, SELECTOR) if ready(p)]) == ris(node)["spec"]["replicas"],
            timeout=90,
            interval=0.25,
            message="the scaled-up replicas Ready",
        )
        status = ris(node)["status"]["autoscaler"]
        assert status["latencyP95Ms"] > TARGET_MS, status
        assert status["desiredReplicas"] > 1
    finally:
        load.stop()
    FIGURES["load start to first scale-up (s)"] = up_at
    assert load.sent > 50 and load.failed == 0, (load.sent, load.failures)
    wait_for(lambda: ris(node)["spec"].get("replicas") == 1, timeout=90, interval=0.5, message="scale-down")
    wait_ready_pods(node, NS, SELECTOR, 1, timeout=90)


def test_a_rolling_update_under_load_fails_no_request(
    node: NodeCluster, release: dict, files: FileServer, prometheus: PodPrometheus
) -> None:
    before = {p["metadata"]["name"] for p in pods(node, NS, SELECTOR)}
    spec = inference_service(files, prometheus, version="2")
    spec["spec"]["autoscaling"]["target"] = 10_000  # steady: no scaling during the rollout
    load = Load([f"http://{cluster_ip(node)}/infer"], concurrency=2, max_seconds=150).start()
    try:
        time.sleep(2)
        apply(node, spec)
        wait_for(
            lambda: (
                (after := [p for p in pods(node, NS, SELECTOR) if ready(p)])
                and not {p["metadata"]["name"] for p in after} & before
                and len(pods(node, NS, SELECTOR)) == 1
            ),
            timeout=120,
            interval=0.5,
            message="the new version rolled out and the old pod gone",
        )
        time.sleep(2)
    finally:
        load.stop()
    assert load.sent > 20 and load.failed == 0, (load.sent, load.failures)
    (pod,) = pods(node, NS, SELECTOR)
    assert "/mlp/2/model.onnx" in json.dumps(pod["spec"]["initContainers"])


def canary_service(files: FileServer, prometheus: PodPrometheus, version: str, strategy: str = "canary") -> dict:
    spec = inference_service(files, prometheus, version)
    spec["spec"]["autoscaling"]["target"] = 10_000  # steady: no scaling during the rollout
    if strategy == "canary":
        spec["spec"]["rollout"] = {"strategy": "canary", "canary": CANARY}
    return spec


def rollout_of(node: NodeCluster) -> dict:
    return ris(node).get("status", {}).get("rollout") or {}


def canary_rollout(node: NodeCluster, files: FileServer, prometheus: PodPrometheus, version: str) -> tuple[dict, Load]:
    """Roll `version` out as a canary under a steady load; the final status and the load.

    The load opens a connection per request: kube-proxy picks a pod per connection, so kept-alive
    connections would stay on the pods they first reached and the canary might get none."""
    apply(node, canary_service(files, prometheus, "2"))  # the running revision becomes the stable one
    wait_for(lambda: rollout_of(node).get("phase") == "Stable", timeout=60, message="canary strategy recorded")
    load = Load([f"http://{cluster_ip(node)}/infer"], concurrency=4, max_seconds=300, keep_alive=False).start()
    try:
        time.sleep(2)
        started = time.monotonic()
        apply(node, canary_service(files, prometheus, version))
        wait_for(lambda: rollout_of(node).get("stage") == "canary 50%", timeout=60, message="canary started")
        done = wait_for(
            lambda: (r := rollout_of(node)).get("phase") in ("Promoted", "RolledBack") and r,
            timeout=180,
            interval=0.5,
            message="a verdict on the canary",
        )
        FIGURES[f"canary of version {version}: applied to {done['stage']} (s)"] = time.monotonic() - started
        wait_for(
            lambda: not kubectl_json(node, "get", "deployment", "-n", NS, "-l", f"{SELECTOR}")["items"][1:],
            timeout=120,
            interval=0.5,
            message="the canary Deployment removed",
        )
        wait_for(lambda: len(pods(node, NS, SELECTOR)) == 1, timeout=120, interval=0.5, message="one pod left")
        time.sleep(2)
    finally:
        load.stop()
    return done, load


def test_a_slow_canary_is_rolled_back_under_load_and_fails_no_request(
    node: NodeCluster, release: dict, files: FileServer, prometheus: PodPrometheus
) -> None:
    done, load = canary_rollout(node, files, prometheus, SLOW)
    assert done["phase"] == "RolledBack" and "latency" in done["message"], done
    assert done["stage"] == "rolled back" and done["weight"] == 0 and "rolled back at step 1" in done["message"]
    check = done["lastCheck"]
    assert check["verdict"] == "fail" and check["latencyMs"] > CANARY["analysis"]["maxLatencyMs"], check
    answered = prometheus.value(
        f'sum(max_over_time(model_server_requests_total{{namespace="{NS}",pod=~"{NAME}-canary-.*"}}[5m]))'
    )
    FIGURES["slow canary: requests it answered before the rollback"] = answered or 0
    assert condition(ris(node), "Degraded")["reason"] == "RolledBack"
    assert load.sent > 20 and load.failed == 0, (load.sent, load.failures)
    (pod,) = pods(node, NS, SELECTOR)  # the stable revision, untouched
    assert "/mlp/2/model.onnx" in json.dumps(pod["spec"]["initContainers"])


def test_a_healthy_canary_is_promoted_under_load_and_fails_no_request(
    node: NodeCluster, release: dict, files: FileServer, prometheus: PodPrometheus
) -> None:
    done, load = canary_rollout(node, files, prometheus, "1")
    assert done["phase"] == "Promoted", done
    assert done["stage"] == "promoted" and done["weight"] == 100 and "promoted after 1 steps" in done["message"], done
    assert done["lastCheck"]["verdict"] == "pass", done
    assert load.sent > 20 and load.failed == 0, (load.sent, load.failures)
    (pod,) = wait_ready_pods(node, NS, SELECTOR, 1, timeout=60)  # the stable Deployment, rolled to it
    assert "/mlp/1/model.onnx" in json.dumps(pod["spec"]["initContainers"])
    apply(node, canary_service(files, prometheus, "1", strategy="rolling"))  # as the next tests expect


# --- Scale to zero: a second service that idles to zero, and one whose model never loads -------

IDLE = "idle"
IDLE_SELECTOR = f"app.kubernetes.io/instance={IDLE},app.kubernetes.io/component=predictor"
HELD = 20


def idle_service(
    files: FileServer, prometheus: PodPrometheus, name: str = IDLE, uri: str = "mlp/1/model.onnx", **stz: int
) -> dict:
    """A service that goes to zero after 10 s without a request (the module's `mlp` stays)."""
    service = inference_service(files, prometheus)
    service["metadata"]["name"] = name
    spec = service["spec"]
    spec["model"] = {"uri": f"{files.url}/{uri}", "name": name, "version": "1"}
    spec["runtime"].pop("grpcPort")
    spec["resources"]["cpu"] = "200m"
    spec["autoscaling"] |= {
        "minReplicas": 0,
        "maxReplicas": 2,
        "scaleToZero": {"idleSeconds": 10, "maxWaitSeconds": 120, **stz},
    }
    return service


def isvc(node: NodeCluster, name: str) -> dict:
    return kubectl_json(node, "get", "ris", name, "-n", NS)


def service_address(node: NodeCluster, name: str) -> str:
    service = kubectl_json(node, "get", "service", name, "-n", NS)
    return f"{service['spec']['clusterIP']}:{service['spec']['ports'][0]['port']}"


def reachable(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def activator_deployment(node: NodeCluster) -> str:
    (found,) = kubectl_json(
        node, "get", "deployments", "-n", OPERATOR_NAMESPACE, "-l", "app.kubernetes.io/component=activator"
    )["items"]
    return str(found["metadata"]["name"])


def test_an_idle_service_goes_to_zero_and_says_so(
    node: NodeCluster, release: dict, files: FileServer, prometheus: PodPrometheus
) -> None:
    apply(node, idle_service(files, prometheus))
    wait_ready_pods(node, NS, IDLE_SELECTOR, 1, timeout=120)
    ready_at = time.monotonic()
    wait_for(lambda: isvc(node, IDLE)["spec"]["replicas"] == 0, timeout=90, interval=0.5, message="scale to zero")
    FIGURES["scale to zero: Ready to zero replicas, idleSeconds 10 (s)"] = time.monotonic() - ready_at
    # While the last pod drains and goes, the address takes connections all along: the activator
    # is in the path from the decision on, not from when the pod stopped listening. (A connection
    # alone, no request: a request would wake the service.)
    address, refused = service_address(node, IDLE), []

    def gone() -> bool:
        if not reachable(address):
            refused.append(time.monotonic() - ready_at)
        return not pods(node, NS, IDLE_SELECTOR)

    wait_for(gone, timeout=60, interval=0.2, message="the idle pod gone")
    assert not refused, f"connections refused at {refused} s while the service went to zero"
    ready_condition = condition(isvc(node, IDLE), "Ready") or {}
    assert (ready_condition.get("status"), ready_condition.get("reason")) == ("True", "ScaledToZero"), ready_condition
    table = node.kubectl("get", "ris", IDLE, "-n", NS).stdout
    assert "True" in table, table
    # The activator is in the service's path: its slice names the Service and the activator's pods.
    piece = kubectl_json(node, "get", "endpointslice", f"{IDLE}-activator", "-n", NS)
    assert piece["metadata"]["labels"]["kubernetes.io/service-name"] == IDLE
    assert piece["endpoints"] and piece["ports"][0]["name"] == "http"


def test_requests_at_zero_are_held_answered_and_survive_an_activator_rollout(
    node: NodeCluster, release: dict, files: FileServer, prometheus: PodPrometheus
) -> None:
    address = service_address(node, IDLE)
    url = f"http://{address}/infer"
    body = {"data": [[0.1] * 64]}
    answers: list[tuple[int, float]] = []
    sent = time.monotonic()

    def one() -> None:
        started = time.monotonic()
        response = httpx.post(url, json=body, timeout=180)
        answers.append((response.status_code, time.monotonic() - started))

    threads = [threading.Thread(target=one) for _ in range(HELD // 2)]
    for thread in threads:
        thread.start()
    # Half from a pod: the same Service address from inside the cluster, held the same way.
    script = (
        "import json, threading, urllib.request\n"
        "codes = []\n"
        "def one():\n"
        f"    r = urllib.request.urlopen(urllib.request.Request('{url}', data=json.dumps({body!r}).encode(), "
        "headers={'Content-Type': 'application/json'}), timeout=180)\n"
        "    codes.append(r.status)\n"
        f"ts = [threading.Thread(target=one) for _ in range({HELD // 2})]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n"
        "print(sorted(codes))\n"
    )
    in_pod: list[str] = []
    client = threading.Thread(target=lambda: in_pod.append(run_client_pod(node, NS, "held", script, timeout=240)))
    client.start()
    # Roll the activator while it holds them: the old pods answer what they hold before they go.
    wait_for(lambda: isvc(node, IDLE)["spec"]["replicas"] >= 1, timeout=30, interval=0.25, message="the wake")
    FIGURES["scale to zero: first request to replicas 1 (s)"] = time.monotonic() - sent
    node.kubectl("rollout", "restart", f"deployment/{activator_deployment(node)}", "-n", OPERATOR_NAMESPACE)
    for thread in threads:
        thread.join(timeout=240)
    client.join(timeout=260)
    assert sorted(code for code, _ in answers) == [200] * (HELD // 2), answers
    assert in_pod == [str([200] * (HELD // 2))], in_pod
    FIGURES["scale to zero: first request to its answer (s)"] = min(seconds for _, seconds in answers)
    # Every scale-to-zero panel of the dashboard shows it: requests held, their wait, the wake.
    dashboard.wait_for_data(prometheus.url, "activator", NS, IDLE, timeout=20)
    # A replica is Ready: the activator is out of the path (until the next idle period).
    wait_for(lambda: not activator_slices(node, NS, IDLE), timeout=10, message="the activator's slice gone")
    node.kubectl(
        "rollout", "status", f"deployment/{activator_deployment(node)}", "-n", OPERATOR_NAMESPACE, "--timeout=180s"
    )


def test_load_after_a_wake_scales_beyond_one(node: NodeCluster, release: dict) -> None:
    concurrency = 12
    load = Load([f"http://{service_address(node, IDLE)}/infer"], concurrency, max_seconds=90).start()
    try:
        # The held requests' latency may scale it up before any of these is answered (it did,
        # 2 s in): the load goes on until it has had as many answers as it has workers, too.
        wait_for(
            lambda: isvc(node, IDLE)["spec"]["replicas"] > 1 and load.sent >= concurrency,
            timeout=60,
            interval=0.5,
            message="scale-up, and as many answers as workers",
        )
    finally:
        load.stop()
    # However soon the scale-up comes (20 requests in one run), none of them failed.
    assert load.failed == 0, (load.sent, load.failures)
    node.kubectl("delete", "ris", IDLE, "-n", NS, "--wait=false")


IDLE_GRPC = "idle-grpc"
#: ModelInfer over grpcio and the server's own messages, as a client pod in the cluster runs it.
GRPC_POD_CLIENT = """
import grpc
from model_server import grpc_predict_v2_pb2 as pb
channel = grpc.insecure_channel({address!r})
infer = channel.unary_unary(
    "/inference.GRPCInferenceService/ModelInfer",
    request_serializer=pb.ModelInferRequest.SerializeToString,
    response_deserializer=pb.ModelInferResponse.FromString,
)
tensor = pb.ModelInferRequest.InferInputTensor(
    name="x", datatype="FP32", shape=[1, 64], contents=pb.InferTensorContents(fp32_contents=[0.1] * 64)
)
answer = infer(pb.ModelInferRequest(model_name={model!r}, inputs=[tensor]), timeout=200)
print(answer.model_name, len(answer.outputs))
"""


def test_grpc_calls_at_zero_are_held_and_answered(
    node: NodeCluster, release: dict, files: FileServer, prometheus: PodPrometheus
) -> None:
    """runtime.grpcPort with scale to zero: a gRPC-only client wakes the service. Triton's gRPC
    client from the host and grpcio from a pod call ModelInfer on the Service's grpc port while
    it is at zero; the calls are held by the activator, and answered once a replica is Ready."""
    service = idle_service(files, prometheus, name=IDLE_GRPC)
    service["spec"]["runtime"]["grpcPort"] = GRPC_PORT
    apply(node, service)
    selector = f"app.kubernetes.io/instance={IDLE_GRPC},app.kubernetes.io/component=predictor"
    wait_ready_pods(node, NS, selector, 1, timeout=120)
    wait_for(lambda: isvc(node, IDLE_GRPC)["spec"]["replicas"] == 0, timeout=120, interval=0.5, message="zero")
    wait_for(lambda: not pods(node, NS, selector), timeout=120, interval=0.5, message="the idle pod gone")
    piece = kubectl_json(node, "get", "endpointslice", f"{IDLE_GRPC}-activator", "-n", NS)
    assert {port["name"] for port in piece["ports"]} == {"http", "grpc"}, piece["ports"]
    cluster_address = kubectl_json(node, "get", "service", IDLE_GRPC, "-n", NS)["spec"]["clusterIP"]
    address = f"{cluster_address}:{GRPC_PORT}"

    answers: list[tuple[str, tuple[int, ...]]] = []

    def from_the_host() -> None:
        client = triton.InferenceServerClient(address)
        tensor = triton.InferInput("x", [1, 64], "FP32")
        tensor.set_data_from_numpy(np.full((1, 64), 0.1, np.float32))
        answer = client.infer(IDLE_GRPC, [tensor], client_timeout=200)
        (output,) = answer.get_response().outputs
        got = answer.as_numpy(output.name)
        answers.append((answer.get_response().model_name, () if got is None else got.shape))

    host = threading.Thread(target=from_the_host)
    host.start()
    script = GRPC_POD_CLIENT.format(address=address, model=IDLE_GRPC)
    in_pod = run_client_pod(node, NS, "held-grpc", script, timeout=260)
    host.join(timeout=260)
    assert in_pod.split() == [IDLE_GRPC, "1"], in_pod
    assert answers == [(IDLE_GRPC, (1, 1))], answers
    assert isvc(node, IDLE_GRPC)["spec"]["replicas"] >= 1  # the calls woke it
    # Gone before the next case, which judges latencies on the same node's CPU.
    node.kubectl("delete", "ris", IDLE_GRPC, "-n", NS)
    wait_for(lambda: not pods(node, NS, selector), timeout=120, interval=0.5, message="the idle-grpc pod gone")


def test_a_service_whose_model_never_loads_answers_503_after_its_wait(
    node: NodeCluster, release: dict, files: FileServer, prometheus: PodPrometheus
) -> None:
    never = idle_service(files, prometheus, name="never", uri="mlp/missing/model.onnx", maxWaitSeconds=6)
    never["spec"]["replicas"] = 0  # created at zero: the activator has it at once
    apply(node, never)
    wait_for(lambda: activator_slices(node, NS, "never"), timeout=30, message="the activator in the path")
    address = service_address(node, "never")
    wait_for(lambda: reachable(address), timeout=30, message="kube-proxy to send the new Service somewhere")
    started = time.monotonic()
    response = httpx.post(f"http://{address}/infer", json={"data": [[0.1] * 64]}, timeout=60)
    waited = time.monotonic() - started
    if response.status_code != 503:
        activator = node.kubectl("logs", f"deployment/{activator_deployment(node)}", "-n", OPERATOR_NAMESPACE).stdout
        slices = node.kubectl("get", "endpointslices", "-n", NS, "-o", "yaml").stdout
        services = node.kubectl("get", "services", "-n", NS, "-o", "wide").stdout
        raise AssertionError(
            f"{response.status_code} {response.headers} {response.text!r}\n{activator}\n{slices}\n{services}"
        )
    assert response.headers.get("retry-after"), response.headers
    assert waited >= 6, waited
    assert isvc(node, "never")["spec"]["replicas"] == 1  # it was woken; its pod just never turned Ready
    # The chart's alert on it, from the activator's series as the chart's ServiceMonitor scrapes them.
    firing = wait_for(
        lambda: next((a for a in alerts(prometheus, "InferenceColdStartTimedOut") if a["state"] == "firing"), None),
        timeout=30,
        interval=0.25,
        message="InferenceColdStartTimedOut firing",
    )
    FIGURES["InferenceColdStartTimedOut: the 503 to firing (s)"] = time.monotonic() - started - waited
    assert (firing["labels"]["namespace"], firing["labels"]["service"]) == (NS, "never"), firing
    assert [a["labels"]["service"] for a in alerts(prometheus, "InferenceColdStartTimedOut")] == ["never"]  # not idle
    dashboard.save_snapshot("activator", prometheus.url, "activator", NS, IDLE)  # for the docs' picture
    node.kubectl("delete", "ris", "never", "-n", NS, "--wait=false")


def alerts(prometheus: PodPrometheus, name: str) -> list[dict]:
    answer = httpx.get(f"{prometheus.url}/api/v1/alerts", timeout=5).json()
    return [a for a in answer["data"]["alerts"] if a["labels"]["alertname"] == name]


def _change_batch_and_wait(node: NodeCluster, size: int) -> float:
    """Patch the InferenceService; seconds until its Deployment shows the change."""
    patch = json.dumps({"spec": {"runtime": {"batching": {"maxBatchSize": size}}}})
    changed = time.monotonic()
    node.kubectl("patch", "ris", NAME, "-n", NS, "--type=merge", "-p", patch)
    wait_for(lambda: _max_batch(node) == str(size), timeout=60, interval=0.25, message=f"maxBatchSize {size} applied")
    return time.monotonic() - changed


def test_killing_the_leader_hands_over_and_a_change_made_meanwhile_is_applied(node: NodeCluster, release: dict) -> None:
    # A crash: the leader's process is killed (SIGKILL, no hand-over); its keep-alive goes stale
    # within the peering lifetime (10 s here), and whichever replica leads next applies the change.
    active = leader(node)
    (pod,) = [p for p in operator_pods(node) if p["metadata"]["name"] == active]
    container = pod["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    node.ctr("tasks", "kill", "--signal", "SIGKILL", container)
    FIGURES["leader process killed to a change applied (s)"] = crashed = _change_batch_and_wait(node, 4)
    assert crashed < 10 + 20, crashed
    # A deleted pod (SIGTERM): it withdraws from the peering and the standby takes over at once.
    wait_ready_pods(node, OPERATOR_NAMESPACE, OPERATOR_SELECTOR, 2, timeout=90)
    active = wait_for(lambda: leader(node), timeout=30, message="a leader again")
    node.kubectl("delete", "pod", active, "-n", OPERATOR_NAMESPACE, "--wait=false")
    FIGURES["leader pod deleted to a change applied (s)"] = _change_batch_and_wait(node, 6)
    assert leader(node) not in ("", active)


def _max_batch(node: NodeCluster) -> str | None:
    container = kubectl_json(node, "get", "deployment", NAME, "-n", NS)["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    return args[args.index("--max-batch-size") + 1] if "--max-batch-size" in args else None


def test_deleting_the_inference_service_removes_every_owned_object_and_pod(node: NodeCluster, release: dict) -> None:
    started = time.monotonic()
    node.kubectl("delete", "ris", NAME, "-n", NS, "--wait=true", "--timeout=60s")
    owned = f"inference.rocm.dev/inference-service={NAME}"
    wait_for(
        lambda: not kubectl_json(node, "get", "deployments,services,pods,poddisruptionbudgets,replicasets", "-n", NS,
                                 "-l", owned)["items"],
        timeout=90, interval=0.5, message="every owned object and pod gone",
    )  # fmt: skip
    gone = time.monotonic() - started
    # A figure, not a bound: on a loaded node the garbage collector's and the kubelet's own pace
    # add to it (34 s in one run at load 15). That a server exits on its SIGTERM, even one sent
    # before its first line ran, is proven on the processes themselves (test_ms_pid1.py,
    # test_stop_signals.py); here the preStop hook must not have failed.
    FIGURES["InferenceService deleted to every pod gone (s)"] = gone
    hooks = kubectl_json(node, "get", "events", "-n", NS, "--field-selector", "reason=FailedPreStopHook")
    assert not hooks["items"], [e["message"] for e in hooks["items"]]
