"""A prefill/decode pair on the built-in loop, driven tick by tick against the emulated API
server with Prometheus answers scripted per role: each role scales on its own metric and the
other does not move, missing data holds, and the pair goes to zero only together and wakes
together; and what the builders make of a pair at zero."""

from __future__ import annotations

import copy
import logging
from typing import Any

import httpx

from inference_operator.autoscaler.pair import PairAutoscaler
from inference_operator.builders import Owner, build_all
from inference_operator.builders.activator import ActivatorEndpoints, asked_replicas
from inference_operator.models import parse_spec
from inference_operator.prometheus.client import PrometheusClient
from inference_operator.scale_to_zero import wake
from inference_operator.settings import ANY_URL, CredentialPolicy
from inference_operator.stages.scale_to_zero import activator_slice
from tests.autoscaler.test_autoscaler_loop import Clock, make_api
from testsupport.cluster import Cluster

SCALING = {"maxReplicas": 4, "prometheusUrl": "http://prometheus:9090", "mode": "builtin"}
PREFILL = SCALING | {"metric": "ttftP95Ms", "target": 200}
DECODE = SCALING | {"metric": "itlP95Ms", "target": 50, "scaleDownStabilizationSeconds": 0}
ZERO = {"idleSeconds": 60}


def pd_spec(zero: bool = False, prefill: int = 1, decode: int = 1, prefill_floor: int = 1) -> dict[str, Any]:
    disaggregation: dict[str, Any] = {
        "prefill": {"replicas": prefill, "autoscaling": PREFILL | {"minReplicas": prefill_floor}},
        "decode": {"replicas": decode, "autoscaling": DECODE},
    }
    if zero:
        disaggregation["scaleToZero"] = ZERO
    return {
        "model": {"uri": "hf://org/llm@main", "name": "llm"},
        "runtime": {"engine": "vllm"},
        "routing": {"router": {}},
        "disaggregation": disaggregation,
    }


def create(cluster: Cluster, **kw: Any) -> None:
    obj = {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "llm", "namespace": "ml"},
        "spec": pd_spec(**kw),
    }
    response = cluster.apply_cr(obj)
    assert response.status_code in (200, 201), response.text


class Prometheus:
    """Answers each query by the role whose pods it selects: `values[role]` for its metric,
    its data age, the latency beside it; `requests` for the idle rule's count (over the
    service's pods, both roles). None: no series. Counts what it is asked."""

    def __init__(self) -> None:
        self.values: dict[str, float | None] = {"prefill": 200.0, "decode": 50.0}  # on target
        self.ages: dict[str, float | None] = {"prefill": 0.5, "decode": 0.5}
        self.requests: float | None = 0.0
        self.asked: list[str] = []

    def answer(self, request: httpx.Request) -> httpx.Response:
        query = request.url.params["query"]
        self.asked.append(query)
        role = "prefill" if "llm-prefill-" in query else "decode" if "llm-decode-" in query else None
        if role is None:
            assert "increase(vllm:e2e_request_latency_seconds_count" in query, query  # the idle rule alone reads both
            value = self.requests
        elif query.startswith("time() -"):
            value = self.ages[role]
        elif "e2e_request_latency" in query:
            value = 900.0
        else:
            value = self.values[role]
        result = [] if value is None else [{"metric": {}, "value": [1.0, str(value)]}]
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})

    def factory(self, url: str, **kw: Any) -> PrometheusClient:
        return PrometheusClient(url, transport=httpx.MockTransport(self.answer), **kw)


def pair_for(cluster: Cluster, prometheus: Prometheus, clock: Clock, wall: Clock, events: list) -> PairAutoscaler:
    return PairAutoscaler.of(
        api=make_api(cluster),
        namespace="ml",
        name="llm",
        logger=logging.getLogger("test"),
        post_event=lambda r, m: events.append((r, m)),
        policy=CredentialPolicy(allowed_urls=(ANY_URL,)),
        clock=clock,
        prometheus_factory=prometheus.factory,
        wall_clock=wall,
    )


SERVING = {
    "roles": [
        {"role": "decode", "readyReplicas": 1},
        {"role": "prefill", "readyReplicas": 1},
        {"role": "router", "readyReplicas": 2},
    ]
}


async def tick(cluster: Cluster, pair: PairAutoscaler, status: dict[str, Any] | None = None) -> dict[str, Any]:
    body = cluster.get_cr("ml", "llm")
    assert body is not None
    body = {**body, "status": {**(body.get("status") or {}), **(status or SERVING)}}
    await pair.tick(body, parse_spec(body["spec"]))
    fresh = cluster.get_cr("ml", "llm")
    assert fresh is not None
    return fresh


def counts(cr: dict[str, Any]) -> tuple[int, int]:
    pd = cr["spec"]["disaggregation"]
    return pd["prefill"]["replicas"], pd["decode"]["replicas"]


async def test_a_role_scales_on_its_own_metric_and_the_other_does_not_move(cluster: Cluster) -> None:
    create(cluster)
    prometheus, clock, events = Prometheus(), Clock(), list[tuple[str, str]]()
    pair = pair_for(cluster, prometheus, clock, Clock(), events)
    try:
        prometheus.values["prefill"] = 400.0  # TTFT twice its target: prefill is short
        cr = await tick(cluster, pair)
        assert counts(cr) == (2, 1)
        assert cr["spec"]["replicas"] == 1  # the service's own count is not the roles'
        assert cluster.emulator.writes["inferenceservices:update"] == 1  # one merge patch, prefill's
        assert cluster.emulator.writes["inferenceservices/scale:update"] == 0
        scaler = cr["status"]["autoscaler"]
        assert scaler["prefill"]["metric"] == "ttftP95Ms" and scaler["prefill"]["desiredReplicas"] == 2
        assert scaler["prefill"]["currentValue"] == 400.0
        assert scaler["decode"]["metric"] == "itlP95Ms" and scaler["decode"]["desiredReplicas"] == 1
        assert [r for r, _ in events] == ["ScaledUp"] and events[0][1].startswith("prefill replicas 1 -> 2")
        # Each role's queries select its own pods: the decode's never read the prefill's.
        decode_queries = [q for q in prometheus.asked if "llm-decode-" in q]
        assert decode_queries and all("llm-prefill-" not in q for q in decode_queries)
        assert any("vllm:inter_token_latency_seconds" in q for q in decode_queries)

        prometheus.values["prefill"], prometheus.values["decode"] = 200.0, 150.0  # now decode is short
        clock.now += 15
        cr = await tick(cluster, pair)
        assert counts(cr) == (2, 3)
    finally:
        await pair.aclose()


async def test_missing_data_holds_a_role_and_says_which(cluster: Cluster) -> None:
    create(cluster, prefill=2)
    prometheus, clock, events = Prometheus(), Clock(), list[tuple[str, str]]()
    pair = pair_for(cluster, prometheus, clock, Clock(), events)
    try:
        prometheus.ages["prefill"] = None  # the prefill pods are not scraped
        prometheus.values["prefill"] = None
        prometheus.values["decode"] = 150.0
        cr = await tick(cluster, pair)
        assert counts(cr) == (2, 3)  # prefill held at 2, decode up on its own data
        active = next(c for c in cr["status"]["conditions"] if c["type"] == "ScalingActive")
        assert active["status"] == "False" and active["message"].startswith("prefill: ")
        clock.now += 15
        cr = await tick(cluster, pair)  # decode's data does not turn it over
        active = next(c for c in cr["status"]["conditions"] if c["type"] == "ScalingActive")
        assert active["status"] == "False" and active["message"].startswith("prefill: ")
        assert counts(cr) == (2, 3)
        prometheus.ages["prefill"], prometheus.values["prefill"] = 0.5, 200.0
        clock.now += 15
        cr = await tick(cluster, pair)
        active = next(c for c in cr["status"]["conditions"] if c["type"] == "ScalingActive")
        assert active["status"] == "True"
    finally:
        await pair.aclose()


async def test_the_pair_goes_to_zero_only_together_and_wakes_together(cluster: Cluster) -> None:
    create(cluster, zero=True)
    prometheus, clock, wall, events = Prometheus(), Clock(), Clock(), list[tuple[str, str]]()
    pair = pair_for(cluster, prometheus, clock, wall, events)
    try:
        assert counts(await tick(cluster, pair)) == (1, 1)  # idle, not for 60 s yet
        wall.now += 61
        clock.now += 15
        prometheus.values["decode"] = 150.0  # decode wants more: not idle
        assert counts(await tick(cluster, pair)) == (1, 3)
        prometheus.values["decode"] = 10.0  # decode wants fewer: its write first, not zero over it
        clock.now += 15
        three = {"roles": [{"role": "decode", "readyReplicas": 3}, *SERVING["roles"][1:]]}
        assert counts(await tick(cluster, pair, three)) == (1, 2)
        prometheus.values["decode"] = 50.0
        prometheus.requests = None  # Prometheus cannot say: hold
        clock.now += 15
        assert counts(await tick(cluster, pair)) == (1, 2)
        prometheus.requests = 0.0
        writes = cluster.emulator.writes["inferenceservices:update"]
        clock.now += 15
        cr = await tick(cluster, pair)
        assert counts(cr) == (0, 0)
        assert cluster.emulator.writes["inferenceservices:update"] == writes + 1  # both in one write
        assert cr["status"]["autoscaler"]["reason"].startswith("prefill and decode at zero: no request for")
        zero_time = cr["status"]["autoscaler"]["lastScaleTime"]

        asked = len(prometheus.asked)
        at_zero = {"roles": [{"role": r, "readyReplicas": 0} for r in ("decode", "prefill", "router")]}
        for _ in range(2):
            clock.now += 15
            cr = await tick(cluster, pair, at_zero)  # no pods: nothing asked, nothing moved
            assert counts(cr) == (0, 0)
        assert len(prometheus.asked) == asked
        assert cr["status"]["autoscaler"]["prefill"]["reason"].startswith("scaled to zero")

        spec = parse_spec(cr["spec"])
        assert asked_replicas(spec) == 0
        wake(make_api(cluster), "ml", "llm", spec, 1)  # what the wake handler writes
        cr = cluster.get_cr("ml", "llm")
        assert cr is not None and counts(cr) == (1, 1)
        assert cluster.emulator.writes["inferenceservices:update"] == writes + 2  # the wake: one write
        clock.now += 15
        cr = await tick(cluster, pair)
        assert counts(cr) == (1, 1)  # woken: idle counts again from now
        assert "reason" not in cr["status"]["autoscaler"] and cr["status"]["autoscaler"]["lastScaleTime"] == zero_time
    finally:
        await pair.aclose()


async def test_a_roles_min_replicas_is_its_floor_while_the_pair_serves(cluster: Cluster) -> None:
    """Woken from zero (each role at one) with prefill's minReplicas two: prefill goes to its
    floor and stays there however little its latency asks for; at zero the pair runs nothing."""
    create(cluster, zero=True, prefill_floor=2)  # as the wake leaves it: one of each
    prometheus, clock, events = Prometheus(), Clock(), list[tuple[str, str]]()
    pair = pair_for(cluster, prometheus, clock, Clock(), events)
    try:
        cr = await tick(cluster, pair)
        assert counts(cr) == (2, 1)
        assert cr["status"]["autoscaler"]["prefill"]["desiredReplicas"] == 2
        prometheus.values["prefill"] = 10.0  # far below its target: fewer, if it could
        for _ in range(3):
            clock.now += 15
            assert counts(await tick(cluster, pair)) == (2, 1)
    finally:
        await pair.aclose()

    def replicas(prefill: int, decode: int) -> dict[str, int]:
        owner = Owner("llm", "ml", "u-1", parse_spec(pd_spec(True, prefill, decode, prefill_floor=2)))
        return {o["metadata"]["name"]: o["spec"]["replicas"] for o in build_all(owner) if o["kind"] == "Deployment"}

    assert replicas(2, 1) == {"llm-prefill": 2, "llm-decode": 1, "llm-router": 2}
    assert replicas(0, 0) == {"llm-prefill": 0, "llm-decode": 0, "llm-router": 0}


def test_the_builders_take_the_pair_and_its_router_to_zero_and_the_activator_in_front() -> None:
    def owner(prefill: int, decode: int) -> Owner:
        return Owner(name="llm", namespace="ml", uid="u-1", spec=parse_spec(pd_spec(True, prefill, decode)))

    def replicas(objects: list[dict[str, Any]]) -> dict[str, int]:
        return {o["metadata"]["name"]: o["spec"]["replicas"] for o in objects if o["kind"] == "Deployment"}

    serving = build_all(owner(1, 2))
    assert replicas(serving) == {"llm-prefill": 1, "llm-decode": 2, "llm-router": 2}
    assert not [o for o in serving if o["kind"] in ("HorizontalPodAutoscaler", "ScaledObject")]  # the loop's
    assert replicas(build_all(owner(0, 0))) == {"llm-prefill": 0, "llm-decode": 0, "llm-router": 0}

    activator = ActivatorEndpoints(("10.0.0.9",), 8080)
    at_zero = activator_slice(owner(0, 0), 0, activator)
    assert at_zero is not None and at_zero["metadata"]["labels"]["kubernetes.io/service-name"] == "llm-router"
    assert activator_slice(owner(1, 1), 1, activator) is None
    assert activator_slice(owner(1, 1), 0, activator) is not None  # a role not ready yet: still held
    spec = copy.deepcopy(pd_spec(True))
    del spec["disaggregation"]["scaleToZero"]
    assert activator_slice(Owner("llm", "ml", "u-1", parse_spec(spec)), 0, activator) is None
