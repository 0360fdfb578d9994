"""One autoscaler tick against the emulated API server, with Prometheus answers scripted.

No operator here: the tick is driven directly, so what it writes (scale subresource, status,
events) and what it reads (the body it is given, its own last write) can be checked exactly.
"""

from __future__ import annotations

import copy
import logging

import httpx
import kubernetes

from inference_operator import metrics
from inference_operator.autoscaler.loop import (
    Autoscaler,
    observation_from,
)
from inference_operator.k8s import KubeApi
from inference_operator.models import parse_spec
from inference_operator.prometheus.client import PrometheusClient, Sample
from inference_operator.settings import ANY_URL, CredentialPolicy
from inference_operator.status import status_changes
from testsupport.cluster import Cluster


def make_api(cluster: Cluster) -> KubeApi:
    return KubeApi(kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig)))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def scripted(values: dict[str, float | None]):
    """A PrometheusClient factory whose server answers by which query it is asked."""

    def answer(request: httpx.Request) -> httpx.Response:
        query = request.url.params["query"]
        kind = "age" if query.startswith("time() -") else "p95" if "histogram_quantile(0.95" in query else "value"
        result = [] if values.get(kind) is None else [{"metric": {}, "value": [1.0, str(values[kind])]}]
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})

    def factory(url: str, **kw) -> PrometheusClient:
        return PrometheusClient(url, transport=httpx.MockTransport(answer), **kw)

    return factory


def make_loop(
    cluster: Cluster, values: dict[str, float | None], clock: Clock | None = None, events: list | None = None
) -> Autoscaler:
    """The loop for ml/mlp against the emulated cluster, with Prometheus answering `values`
    and events appended to `events` (dropped when None)."""
    return Autoscaler(
        make_api(cluster),
        "ml",
        "mlp",
        logging.getLogger("test"),
        post_event=lambda r, m: None if events is None else events.append((r, m)),
        policy=CredentialPolicy(allowed_urls=(ANY_URL,)),
        clock=clock or Clock(),
        prometheus_factory=scripted(values),
    )


# A service whose clients go through the vLLM router (routing.router): status.roles counts its
# workers (predictor) and its router apart, status.readyReplicas both.
ROUTED = {"model": {"uri": "hf://org/llm@main"}, "runtime": {"engine": "vllm"}, "routing": {"router": {"replicas": 1}}}


def routed_status(workers: int, router: int) -> dict:
    roles = [{"role": "predictor", "readyReplicas": workers}, {"role": "router", "readyReplicas": router}]
    return {"readyReplicas": workers + router, "roles": roles}


def create(cluster: Cluster, replicas: int, spec: dict | None = None, **autoscaling) -> dict:
    """ml/mlp with these autoscaling settings; `spec`'s parts replace the default model's."""
    obj = {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "mlp", "namespace": "ml"},
        "spec": {
            "replicas": replicas,
            "model": {"uri": "pvc://models/mlp"},
            "autoscaling": {
                "maxReplicas": 8,
                "target": 10,
                "metric": "queueDepth",
                "prometheusUrl": "http://prometheus:9090",
                **autoscaling,
            },
            **(spec or {}),
        },
    }
    assert cluster.apply_cr(obj).status_code in (200, 201)
    return copy.deepcopy(cluster.get_cr("ml", "mlp"))


async def test_autoscaler_tick_writes_scale_status_and_one_event(cluster: Cluster) -> None:
    body = create(cluster, replicas=2, scaleUp={"pods": 1, "percent": 10, "periodSeconds": 60})
    events: list[tuple[str, str]] = []
    loop = make_loop(cluster, {"value": 15.0, "age": 0.4, "p95": 42.0}, events=events)
    try:
        delay = await loop.tick(body, parse_spec(body["spec"]))
    finally:
        await loop.aclose()

    cr = cluster.get_cr("ml", "mlp")
    assert cr["spec"]["replicas"] == 3  # ceil(2 * 1.5)
    assert cluster.emulator.writes["inferenceservices/scale:update"] == 1
    status = cr["status"]["autoscaler"]
    assert status["metric"] == "queueDepth"
    assert status["currentValue"] == 15.0
    assert status["latencyP95Ms"] == 42.0  # recorded for the LATENCY column whatever the metric
    assert status["desiredReplicas"] == 3
    assert status["lastScaleTime"].endswith("Z")
    assert "scale up 2 -> 3" in status["reason"]
    assert [r for r, _ in events] == ["ScaledUp"]
    assert events[0][1].startswith("replicas 2 -> 3: queueDepth=15 target=10")
    assert 0 < delay <= 15
    # …and the operator's own metrics carry the decision for dashboards and alerts.
    labels = {"namespace": "ml", "name": "mlp"}
    assert (
        metrics.REGISTRY.get_sample_value(
            "inference_operator_autoscaler_decisions_total", {**labels, "direction": "up"}
        )
        >= 1
    )
    assert metrics.REGISTRY.get_sample_value("inference_operator_autoscaler_desired_replicas", labels) == 3


async def test_autoscaler_tick_trusts_its_own_write_over_a_stale_body(cluster: Cluster) -> None:
    body = create(cluster, replicas=4, scaleDownStabilizationSeconds=0)
    events: list[tuple[str, str]] = []
    clock = Clock()
    loop = make_loop(cluster, {"value": 0.0, "age": 0.4, "p95": 0.0}, clock=clock, events=events)
    spec = parse_spec(body["spec"])
    try:
        await loop.tick(body, spec)
        assert cluster.get_cr("ml", "mlp")["spec"]["replicas"] == 1
        # The watch has not delivered the new object yet: same body, same generation.
        clock.now += 15
        await loop.tick(body, spec)
        # A newer generation (someone ran kubectl scale 5) is believed again.
        clock.now += 15
        newer = copy.deepcopy(body)
        newer["metadata"]["generation"] += 2
        newer["spec"]["replicas"] = 5
        await loop.tick(newer, parse_spec(newer["spec"]))
    finally:
        await loop.aclose()
    assert [r for r, _ in events] == ["ScaledDown", "ScaledDown"]
    assert events[0][1].startswith("replicas 4 -> 1")
    assert events[1][1].startswith("replicas 5 -> 1")


async def test_autoscaler_tick_holds_on_stale_series(cluster: Cluster) -> None:
    body = create(cluster, replicas=4, scaleDownStabilizationSeconds=0)
    loop = make_loop(cluster, {"value": 0.0, "age": None, "p95": 0.0})
    try:
        await loop.tick(body, parse_spec(body["spec"]))
    finally:
        await loop.aclose()
    cr = cluster.get_cr("ml", "mlp")
    assert cr["spec"]["replicas"] == 4
    assert cr["status"]["autoscaler"]["reason"].startswith("no data (no live series")
    assert "currentValue" not in cr["status"]["autoscaler"]


def test_autoscaler_observation_from_answers() -> None:
    fresh = Sample(0.5, 1.0)
    assert observation_from(5.0, Sample(12.0, 1.0), fresh, 3).value == 12.0
    assert observation_from(5.0, Sample(12.0, 1.0), fresh, 3).age_seconds == 0.5
    assert observation_from(5.0, None, fresh, 3).note == "query returned no series"
    assert observation_from(5.0, Sample(12.0, 1.0), None, 3).value is None
    assert observation_from(5.0, None, None, 3, error="boom").note == "boom"


def test_autoscaler_status_patch_sends_only_changes() -> None:
    current = {"metric": "rps", "currentValue": 3.0, "reason": "x"}
    assert status_changes(current, {"metric": "rps", "currentValue": 4.0, "reason": "x", "lastScaleTime": None}) == {
        "currentValue": 4.0
    }
    assert status_changes(current, {"currentValue": None}) == {"currentValue": None}


async def test_a_tick_that_does_not_scale_keeps_the_last_scale_time_its_body_has_not_seen(cluster: Cluster) -> None:
    """The body a tick is given can be older than the loop's own last status write (its watch
    event not yet come, on a busy machine): a tick that does not scale leaves the lastScaleTime
    it finds in the object as it is, rather than deleting it for the body's lack of one."""
    stale = create(cluster, replicas=2, scaleUp={"pods": 1, "percent": 10, "periodSeconds": 60})
    first = make_loop(cluster, {"value": 15.0, "age": 0.4, "p95": 42.0})
    try:
        await first.tick(stale, parse_spec(stale["spec"]))
    finally:
        await first.aclose()
    scaled = cluster.get_cr("ml", "mlp")["status"]["autoscaler"]["lastScaleTime"]
    body = {**cluster.get_cr("ml", "mlp"), "status": stale.get("status") or {}}  # its status not yet seen
    steady = make_loop(cluster, {"value": 10.0, "age": 0.4, "p95": 42.0})
    try:
        await steady.tick(body, parse_spec(body["spec"]))
    finally:
        await steady.aclose()
    status = cluster.get_cr("ml", "mlp")["status"]["autoscaler"]
    assert status["desiredReplicas"] == 3 and status["lastScaleTime"] == scaled


async def test_a_routed_services_ready_replicas_are_its_workers_not_its_router(cluster: Cluster) -> None:
    """With routing.router, status.readyReplicas adds the router's pods to the workers': the
    loop counts the workers (the predictor's role), so a starting worker is waited for rather
    than a ready router taken for it and a third worker asked."""
    body = create(cluster, replicas=2, spec=ROUTED, metric="requestsWaiting")
    body = {**body, "status": routed_status(workers=1, router=1)}
    loop = make_loop(cluster, {"value": 15.0, "age": 0.4})
    try:
        await loop.tick(body, parse_spec(body["spec"]))
    finally:
        await loop.aclose()
    cr = cluster.get_cr("ml", "mlp")
    assert cr["spec"]["replicas"] == 2, cr["status"]["autoscaler"]
    assert "waiting for 1 starting replica" in cr["status"]["autoscaler"]["reason"]
