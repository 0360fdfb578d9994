"""The built-in loop with autoscaling.scaleToZero: zero after idleSeconds without a request (both
Prometheus and the loop's own memory must say so), nothing asked of Prometheus at zero, a wake
starting a new idle period, no scale to zero mid-rollout; and the pure rule itself."""

from __future__ import annotations

import logging
from typing import Any

import httpx

from inference_operator.autoscaler.loop import Autoscaler
from inference_operator.autoscaler.policy import Idleness, idle_decision
from inference_operator.models import parse_spec
from inference_operator.prometheus.client import PrometheusClient
from inference_operator.settings import ANY_URL, CredentialPolicy
from testsupport.cluster import Cluster

from .test_autoscaler_loop import ROUTED, Clock, create, make_api, routed_status

STZ = {"minReplicas": 0, "scaleToZero": {"idleSeconds": 60}}


class Prometheus:
    """Answers the idle query with `requests`, every other query with a healthy service; counts
    what it is asked."""

    def __init__(self) -> None:
        self.requests: float | None = 0.0
        self.asked: list[str] = []

    def answer(self, request: httpx.Request) -> httpx.Response:
        query = request.url.params["query"]
        self.asked.append(query)
        if (
            "increase(model_server_requests_total" in query
            or "increase(vllm:e2e_request_latency_seconds_count" in query
        ):
            value = self.requests
        elif query.startswith("time() -"):
            value = 0.5
        else:
            value = 10.0  # on target: the latency rule holds
        result = [] if value is None else [{"metric": {}, "value": [1.0, str(value)]}]
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})

    def factory(self, url: str, **kw: Any) -> PrometheusClient:
        return PrometheusClient(url, transport=httpx.MockTransport(self.answer), **kw)


def loop_for(
    cluster: Cluster, prometheus: Prometheus, wall: Clock, events: list[tuple[str, str]], activator: bool = True
) -> Autoscaler:
    return Autoscaler(
        make_api(cluster),
        "ml",
        "mlp",
        logging.getLogger("test"),
        post_event=lambda r, m: events.append((r, m)),
        policy=CredentialPolicy(allowed_urls=(ANY_URL,)),
        clock=Clock(),
        prometheus_factory=prometheus.factory,
        wall_clock=wall,
        activator=activator,
    )


async def tick(cluster: Cluster, loop: Autoscaler, **changes: Any) -> dict[str, Any]:
    body = cluster.get_cr("ml", "mlp")
    assert body is not None
    body = {**body, "status": {"readyReplicas": 1}, **changes}  # serving, unless the test says otherwise
    await loop.tick(body, parse_spec(body["spec"]))
    fresh = cluster.get_cr("ml", "mlp")
    assert fresh is not None
    return fresh


async def test_idle_for_the_idle_period_goes_to_zero_and_requests_hold_it(cluster: Cluster) -> None:
    create(cluster, replicas=1, metric="latencyP95Ms", **STZ)
    prometheus, wall, events = Prometheus(), Clock(), list[tuple[str, str]]()
    loop = loop_for(cluster, prometheus, wall, events)
    try:
        assert (await tick(cluster, loop))["spec"]["replicas"] == 1  # idle, but not for 60 s yet
        wall.now += 61
        prometheus.requests = 3.0
        assert (await tick(cluster, loop))["spec"]["replicas"] == 1  # requests: a new idle period
        wall.now += 59
        prometheus.requests = 0.0
        assert (await tick(cluster, loop))["spec"]["replicas"] == 1  # 59 s since the last ones
        prometheus.requests = None
        wall.now += 10
        assert (await tick(cluster, loop))["spec"]["replicas"] == 1  # Prometheus cannot say: hold
        prometheus.requests = 0.0
        cr = await tick(cluster, loop)
        assert cr["spec"]["replicas"] == 0
        assert "scale to zero" in cr["status"]["autoscaler"]["reason"]
        assert [r for r, _ in events] == ["ScaledDown"]

        asked = len(prometheus.asked)
        cr = await tick(cluster, loop)  # at zero: no pods, nothing to ask, and no scale up
        assert cr["spec"]["replicas"] == 0 and len(prometheus.asked) == asked
        assert "scaled to zero" in cr["status"]["autoscaler"]["reason"]
    finally:
        await loop.aclose()


async def test_idle_counts_from_when_a_replica_serves(cluster: Cluster) -> None:
    """A service whose first replica took longer than idleSeconds to start is not idle yet."""
    create(cluster, replicas=1, metric="latencyP95Ms", **STZ)
    prometheus, wall, events = Prometheus(), Clock(), list[tuple[str, str]]()
    loop = loop_for(cluster, prometheus, wall, events)
    try:
        wall.now += 600
        starting = {"status": {"readyReplicas": 0}}
        assert (await tick(cluster, loop, **starting))["spec"]["replicas"] == 1
        wall.now += 30
        assert (await tick(cluster, loop))["spec"]["replicas"] == 1  # Ready for 30 s of 60
        wall.now += 31
        assert (await tick(cluster, loop))["spec"]["replicas"] == 0
    finally:
        await loop.aclose()


async def test_a_routed_service_is_idle_only_from_when_its_router_serves_too(cluster: Cluster) -> None:
    """With routing.router a request passes the router and a worker: a Ready worker whose router
    has no ready pod serves nothing (the activator holds the woken requests until it has one),
    so idleness counts from when both are ready."""
    create(cluster, replicas=1, spec=ROUTED, metric="ttftP95Ms", **STZ)
    prometheus, wall, events = Prometheus(), Clock(), list[tuple[str, str]]()
    loop = loop_for(cluster, prometheus, wall, events)
    try:
        wall.now += 600
        assert (await tick(cluster, loop, status=routed_status(workers=1, router=0)))["spec"]["replicas"] == 1
        wall.now += 30
        serving = {"status": routed_status(workers=1, router=1)}
        assert (await tick(cluster, loop, **serving))["spec"]["replicas"] == 1  # on the path for 30 s of 60
        wall.now += 31
        assert (await tick(cluster, loop, **serving))["spec"]["replicas"] == 0
    finally:
        await loop.aclose()


async def test_a_wake_starts_a_new_idle_period(cluster: Cluster) -> None:
    create(cluster, replicas=1, metric="latencyP95Ms", **STZ)
    prometheus, wall, events = Prometheus(), Clock(), list[tuple[str, str]]()
    wall.now = 1_800_000_000.0
    loop = loop_for(cluster, prometheus, wall, events)
    try:
        wall.now += 120
        woken = {"annotations": {"inference.rocm.dev/wake": "2027-01-15T08:01:30Z"}}  # 1_800_000_090: 30 s ago
        body = cluster.get_cr("ml", "mlp")
        assert body is not None
        cr = await tick(cluster, loop, metadata={**body["metadata"], **woken})
        assert cr["spec"]["replicas"] == 1  # woken 30 s ago: its requests are still to come
    finally:
        await loop.aclose()


async def test_no_scale_to_zero_while_a_canary_is_judged(cluster: Cluster) -> None:
    create(cluster, replicas=1, metric="latencyP95Ms", **STZ)
    prometheus, wall, events = Prometheus(), Clock(), list[tuple[str, str]]()
    loop = loop_for(cluster, prometheus, wall, events)
    try:
        wall.now += 600
        rollout = {"status": {"readyReplicas": 1, "rollout": {"phase": "Progressing", "step": 0, "weight": 50}}}
        assert (await tick(cluster, loop, **rollout))["spec"]["replicas"] == 1
        assert (await tick(cluster, loop))["spec"]["replicas"] == 0  # the rollout is over
    finally:
        await loop.aclose()


async def test_without_an_activator_nothing_would_wake_it_so_it_stays_at_one(cluster: Cluster) -> None:
    create(cluster, replicas=1, metric="latencyP95Ms", **STZ)
    prometheus, wall, events = Prometheus(), Clock(), list[tuple[str, str]]()
    loop = loop_for(cluster, prometheus, wall, events, activator=False)
    try:
        wall.now += 600
        assert (await tick(cluster, loop))["spec"]["replicas"] == 1
    finally:
        await loop.aclose()


def test_the_idle_rule() -> None:
    idle = Idleness(now=1000, active_since=900, idle_seconds=60, requests=0)
    decision = idle_decision(idle, current=3)
    assert decision is not None and decision.replicas == 0
    assert idle_decision(idle, current=0) is None
    assert idle_decision(Idleness(1000, 950, 60, 0), 1) is None
    assert idle_decision(Idleness(1000, 900, 60, 0.5), 1) is None  # one request in flight
    assert idle_decision(Idleness(1000, 900, 60, float("nan")), 1) is None
    assert idle_decision(Idleness(1000, 900, 60, 0, rollout_in_progress=True), 1) is None
