"""The scale-to-zero activator (inference_activator/): its pure decisions (which hosts a
slice routes, to where, under which limits), and the process as the chart runs it, against a
small API server (testsupport/fake_kube_api.py) and a stand-in replica whose readiness the test
turns on: requests at zero are held, wake the service once, and are answered in order once a
replica is ready; the limits answer 429 and 503 with Retry-After; SIGTERM loses no held request."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import selectors
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from inference_activator.holding import Gate, Held, HeldRequests
from inference_activator.kube import ClientNamespaces, KubeApi, TokenFile
from inference_activator.metrics import ActivatorMetrics
from inference_activator.routes import (
    HoldPolicy,
    Load,
    RouteRefused,
    RouteTable,
    ServiceKey,
    fair_victim,
    hold_refusal,
    normalize_host,
    over_caps,
    policy_from_annotation,
    route_for,
    service_hosts,
    wake_target,
)
from testsupport.cluster import wait_for
from testsupport.fake_kube_api import FakeKubeApi, activator_slice, running_api, service
from testsupport.processes import free_port, running

CAPS = HoldPolicy(max_wait_seconds=600, max_held=100, max_held_bytes=64 << 20, ready_path="/health/ready")

# ---------------------------------------------------------------------- pure parts


def test_a_service_is_reached_by_every_name_its_clients_use_with_any_port() -> None:
    hosts = service_hosts(ServiceKey("team-a", "llm"), "cluster.local", ["10.96.0.10"])
    assert hosts == {"llm", "llm.team-a", "llm.team-a.svc", "llm.team-a.svc.cluster.local", "10.96.0.10"}
    for header in ("llm", "LLM.team-a:80", "llm.team-a.svc:8080", "llm.team-a.svc.cluster.local.", "10.96.0.10:80"):
        assert normalize_host(header) in hosts, header
    assert normalize_host("[fd00::10]:80") == "fd00::10"
    assert normalize_host("fd00::10") == "fd00::10"


def test_the_annotation_only_lowers_the_activators_limits() -> None:
    lower = {"maxWaitSeconds": 30, "maxHeld": 5, "maxHeldBytes": 1024, "readyPath": "/health"}
    assert policy_from_annotation(json.dumps(lower), CAPS) == HoldPolicy(30, 5, 1024, "/health")
    higher = {"maxWaitSeconds": 10**9, "maxHeld": 10**9, "maxHeldBytes": 10**12}
    assert policy_from_annotation(json.dumps(higher), CAPS) == CAPS
    wrong = {"maxWaitSeconds": "1", "maxHeld": True, "maxHeldBytes": -5, "readyPath": 3}
    assert policy_from_annotation(json.dumps(wrong), CAPS) == CAPS
    assert policy_from_annotation("not json", CAPS) == CAPS
    assert policy_from_annotation("[1]", CAPS) == CAPS
    assert policy_from_annotation(None, CAPS) == CAPS


@pytest.mark.parametrize(
    "path", ["//metadata.internal/x", "/../x", "http://evil/", "/a?b=1", "/%2e%2e/x", "ready", "/" + "a" * 300]
)
def test_a_readiness_path_that_is_not_a_plain_path_is_not_taken(path: str) -> None:
    assert policy_from_annotation(json.dumps({"readyPath": path}), CAPS).ready_path == CAPS.ready_path


def _services(namespace: str = "team-a", name: str = "llm") -> tuple[dict[str, Any], dict[str, Any]]:
    return service(namespace, name, "10.96.0.10", 80), service(namespace, f"{name}-private", "10.96.0.11", 80)


def test_the_route_comes_from_the_services_and_never_from_the_slice() -> None:
    public, private = _services()
    slice_ = activator_slice("team-a", "llm", {"maxHeld": 3, "upstream": "http://169.254.169.254", "hosts": ["x"]})
    route = route_for(slice_, public, private, CAPS, "cluster.local")
    assert route.key == ServiceKey("team-a", "llm")
    assert route.upstream == "http://10.96.0.11:80"
    assert route.policy.max_held == 3
    assert "x" not in route.hosts and "llm.team-a.svc" in route.hosts and "10.96.0.10" in route.hosts


def test_a_slice_whose_services_are_missing_or_lead_nowhere_routes_nothing() -> None:
    public, private = _services()
    slice_ = activator_slice("team-a", "llm")
    with pytest.raises(RouteRefused, match="team-a/llm not found"):
        route_for(slice_, None, private, CAPS, "cluster.local")
    with pytest.raises(RouteRefused, match="llm-private not found"):
        route_for(slice_, public, None, CAPS, "cluster.local")
    other_namespace = service("team-b", "llm-private", "10.96.0.12", 80)
    with pytest.raises(RouteRefused, match="not found"):
        route_for(slice_, public, other_namespace, CAPS, "cluster.local")
    unselected = service("team-a", "llm-private", "10.96.0.11", 80, selector={})
    external = {**private, "spec": {**private["spec"], "type": "ExternalName", "externalName": "evil.example"}}
    headless = service("team-a", "llm-private", "None", 80)
    for lead_nowhere in (unselected, external, headless):
        with pytest.raises(RouteRefused, match="no cluster IP, selector or port"):
            route_for(slice_, public, lead_nowhere, CAPS, "cluster.local")
    for label in ("llm.team-b", "LLM", "", "x" * 60):
        bad = activator_slice("team-a", "llm")
        bad["metadata"]["labels"]["kubernetes.io/service-name"] = label
        with pytest.raises(RouteRefused, match="service-name"):
            route_for(bad, public, private, CAPS, "cluster.local")


def test_a_wake_starts_the_inference_service_that_owns_the_private_service() -> None:
    """A routed service at zero is reached at NAME-router: its route is NAME-router's, and the
    wake goes to NAME, the InferenceService that owns NAME-router-private. A Service without an
    InferenceService for controller wakes the one named like it, as before."""
    public = service("team-a", "llm-router", "10.96.0.20", 80)
    private = service("team-a", "llm-router-private", "10.96.0.21", 80, owner="llm")
    route = route_for(activator_slice("team-a", "llm-router"), public, private, CAPS, "cluster.local")
    assert route.key == ServiceKey("team-a", "llm-router") and route.wake_name == "llm"
    assert "llm-router.team-a.svc" in route.hosts and route.upstream == "http://10.96.0.21:80"
    assert route_for(activator_slice("team-a", "llm"), *_services(), CAPS, "cluster.local").wake_name == "llm"
    key = ServiceKey("team-a", "llm-router")
    owned = service("team-a", "llm-router-private", "10.96.0.21", 80, owner="llm")
    reference = owned["metadata"]["ownerReferences"][0]
    not_ours = [
        {**reference, "controller": False},
        {**reference, "kind": "Deployment"},
        {**reference, "apiVersion": "example.com/v1"},
        {**reference, "name": "Not.A.Name"},
    ]
    for wrong in not_ours:
        assert wake_target({"metadata": {"ownerReferences": [wrong]}}, key) == "llm-router", wrong
    assert wake_target({"metadata": {"ownerReferences": "x"}}, key) == "llm-router"


def test_a_short_name_two_namespaces_claim_routes_to_neither() -> None:
    table = RouteTable()
    a = route_for(activator_slice("team-a", "llm"), *_services("team-a"), CAPS, "cluster.local")
    public_b, private_b = service("team-b", "llm", "10.96.1.10", 80), service("team-b", "llm-private", "10.96.1.11", 80)
    b = route_for(activator_slice("team-b", "llm"), public_b, private_b, CAPS, "cluster.local")
    table.set(a)
    assert table.lookup("llm:80") == a
    table.set(b)
    assert table.lookup("llm") == [a.key, b.key]
    assert table.lookup("llm.team-a.svc") == a and table.lookup("llm.team-b") == b
    assert table.lookup("10.96.1.10") == b and table.lookup("llm.team-c") is None
    table.remove(b.key)
    assert table.lookup("llm") == a and table.lookup("llm.team-b") is None


def test_holding_is_refused_over_any_limit() -> None:
    policy = HoldPolicy(60, max_held=2, max_held_bytes=100)
    caps = Load(requests=10, body_bytes=1000)

    def refusal(service: Load, total: Load, size: int) -> tuple[int, str]:
        return hold_refusal(service, policy, total, caps, size) or (0, "")

    assert hold_refusal(Load(1, 50), policy, Load(1, 50), caps, 50) is None
    assert refusal(Load(2, 0), Load(2, 0), 0) == (429, "2 requests are already waiting for this service to start")
    assert refusal(Load(1, 60), Load(1, 60), 41)[0] == 429  # room once the others go on
    assert refusal(Load(0, 0), Load(10, 0), 1) == (429, "the activator holds as many requests as it may; retry shortly")
    assert refusal(Load(0, 0), Load(5, 990), 11)[0] == 429
    too_large = refusal(Load(0, 0), Load(0, 0), 101)  # never: a retry cannot help it
    assert too_large[0] == 413 and "101 bytes" in too_large[1]


def test_a_full_pool_makes_room_from_whoever_holds_the_most_and_more_than_the_newcomer() -> None:
    holders = {"team-a": Load(2000, 0), "team-b": Load(3, 0)}
    assert fair_victim(holders, "team-c", "requests", 0) == "team-a"
    assert fair_victim(holders, "team-b", "requests", 0) == "team-a"
    assert fair_victim(holders, "team-a", "requests", 0) is None  # the flood is refused its own newest
    assert fair_victim({"a": Load(5, 0), "b": Load(4, 0)}, "b", "requests", 0) is None  # no see-saw
    assert fair_victim({"a": Load(3, 0), "b": Load(3, 0)}, "c", "requests", 0) == "b"  # ties: one, always the same
    by_bytes = {"a": Load(1, 100), "b": Load(1, 10)}
    assert fair_victim(by_bytes, "b", "body_bytes", 50) == "a"
    assert fair_victim(by_bytes, "b", "body_bytes", 95) is None
    assert fair_victim({}, "a", "requests", 0) is None
    assert over_caps(Load(2, 10), Load(3, 100), 90) is None
    assert over_caps(Load(3, 10), Load(3, 100), 0) == "requests"
    assert over_caps(Load(2, 10), Load(3, 100), 91) == "body_bytes"


def test_a_services_full_pool_takes_the_newest_request_of_the_client_holding_most() -> None:
    async def scenario() -> None:
        slice_ = activator_slice("team-a", "llm", {"maxHeld": 4})
        gate = Gate(route_for(slice_, *_services(), CAPS, "cluster.local"))
        pools = HeldRequests(Load(100, 1 << 30), ActivatorMetrics())
        loop = asyncio.get_running_loop()
        flood = [Held(0, float(n), loop.create_future(), "10.0.0.1") for n in range(4)]
        for request in flood:
            assert pools.make_room(gate, [gate], "10.0.0.1", 0) is None
            pools.take(gate, request)
        refused = pools.make_room(gate, [gate], "10.0.0.1", 0)
        assert refused is not None and refused[0] == 429  # the flood's own next one: refused
        assert pools.make_room(gate, [gate], "10.0.0.2", 0) is None  # another client's: room made
        assert flood[3].released.done() and flood[3].released.result() is None
        assert not any(request.released.done() for request in flood[:3])
        assert gate.clients == {"10.0.0.1": Load(3, 0)} and pools.tenants == {"team-a": Load(3, 0)}

    asyncio.run(scenario())


def test_a_clients_namespace_is_its_pods_asked_once_and_none_when_its_address_is_shared() -> None:
    """The pod lookup behind a short host: one API call per address at once, kept a while; no
    namespace for an address that pods of several namespaces share (host network), or whose pod
    has ended."""
    pods = {
        "10.0.0.1": [("team-a", "Running")],
        "10.0.0.2": [("team-a", "Running"), ("team-b", "Running")],
        "10.0.0.3": [("team-c", "Succeeded")],
    }
    asked: list[str] = []

    class Pods:
        async def list(self, path: str, params: dict[str, str]) -> dict[str, Any]:
            ip = params["fieldSelector"].removeprefix("status.podIP=")
            asked.append(ip)
            await asyncio.sleep(0.01)
            items = [{"metadata": {"namespace": ns}, "status": {"phase": phase}} for ns, phase in pods.get(ip, [])]
            return {"items": items}

    now = [0.0]
    namespaces = ClientNamespaces(Pods(), clock=lambda: now[0], max_entries=2)  # type: ignore[arg-type]

    async def scenario() -> None:
        assert await asyncio.gather(*(namespaces.of("10.0.0.1") for _ in range(10))) == ["team-a"] * 10
        assert asked == ["10.0.0.1"]
        assert await namespaces.of("10.0.0.2") is None
        assert await namespaces.of("10.0.0.3") is None
        assert len(namespaces._known) == 2  # the oldest forgotten
        now[0] = 1.0
        assert await namespaces.of("10.0.0.3") is None and asked.count("10.0.0.3") == 1  # kept
        now[0] = 10.0
        assert await namespaces.of("10.0.0.3") is None and asked.count("10.0.0.3") == 2  # asked again

    asyncio.run(scenario())


def test_in_a_pod_the_api_server_and_the_service_account_come_from_the_pod() -> None:
    api = KubeApi.in_cluster({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"})
    assert api.base_url == "https://[fd00::1]:6443"
    assert api.token is not None and api.token.path == Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    assert api.ca_file == Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
    with pytest.raises(RuntimeError, match="--kube-api"):
        KubeApi.in_cluster({})


def test_a_rotated_token_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("one\n")
    token = TokenFile(path)
    assert token.token() == "one"
    path.write_text("two-rotated\n")
    assert token.token() == "two-rotated"


# ---------------------------------------------------------------------- the process


@dataclass
class Replicas:
    """A stand-in for a service's ready replicas behind S-private: readiness per service (turned on
    by the test), the requests that reached it in order, and a gate its streams wait on."""

    port: int = 0
    ready: set[str] = field(default_factory=set)
    seen: list[str] = field(default_factory=list)
    gate: threading.Event = field(default_factory=threading.Event)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if path.startswith("/ready/"):
            await _json(send, {}, 200 if path.removeprefix("/ready/") in self.ready else 503)
            return
        self.seen.append(f"{path}?{scope['query_string'].decode()}")
        if path == "/v1/stream":
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
            )
            await send({"type": "http.response.body", "body": b"data: first\n\n", "more_body": True})
            while not self.gate.is_set():
                await asyncio.sleep(0.02)
            for n in range(3):
                await send({"type": "http.response.body", "body": b"data: %d\n\n" % n, "more_body": True})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
            return
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        await _json(send, {"path": path, "body": body.decode(), "headers": headers})


async def _json(send: Any, value: object, status: int = 200) -> None:
    data = json.dumps(value).encode()
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": data})


@pytest.fixture(scope="module")
def replicas() -> Iterator[Replicas]:
    app = Replicas(port=free_port())
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=app.port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started or None, timeout=10, message="the stand-in replicas to listen")
    yield app
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def api() -> Iterator[tuple[FakeKubeApi, str]]:
    fake = FakeKubeApi()
    with running_api(fake) as url:
        yield fake, url


@dataclass
class Activator:
    url: str
    metrics: str
    process: Any

    def get(self, host: str, path: str = "/v1/echo", **kwargs: Any) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", headers={"host": host}, **{"timeout": 60, **kwargs})

    def post(self, host: str, path: str = "/v1/echo", **kwargs: Any) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", headers={"host": host}, timeout=60, **kwargs)

    def metric(self, name: str, **labels: str) -> float | None:
        text = httpx.get(self.metrics, timeout=5).text
        wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in text.splitlines():
            match = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
            if match and ",".join(sorted(match.group(1).split(","))) == wanted:
                return float(match.group(2))
        return None


def activator_command(api_url: str, port: int, metrics_port: int, *flags: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "model_server",
        "activator",
        f"--kube-api={api_url}",
        "--host=127.0.0.1",
        f"--port={port}",
        "--grpc-port=0",  # HTTP alone (test_activator_grpc.py has the gRPC port)
        f"--metrics-port={metrics_port}",
        "--max-wait-seconds=60",
        f"--memory-limit-bytes={256 << 20}",
        "--log-level=info",
        *flags,
    ]


MAX_BODY = 1 << 20
#: How long a replica may take to begin its answer.
RESPONSE_START_S = 3
#: How long a removed route is still proxied here: long enough to see it, short enough to see it end.
LINGER_S = 5


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = Path(tmp_path_factory.mktemp("token")) / "token"
    path.write_text("first-token\n")
    return path


@pytest.fixture(scope="module")
def activator(
    api: tuple[FakeKubeApi, str], token_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Activator]:
    _, url = api
    port, metrics_port = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    log = Path(tmp_path_factory.mktemp("activator")) / "activator.log"
    flags = ["--drain-listen-seconds=0", f"--kube-token-file={token_file}", f"--max-body-bytes={MAX_BODY}"]
    flags.append(f"--response-start-timeout={RESPONSE_START_S}")
    command = activator_command(url, port, metrics_port, *flags, f"--linger-seconds={LINGER_S}")
    with running(command, env=env, log=log, ready_url=f"http://127.0.0.1:{port}/readyz") as process:
        yield Activator(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics", process)


def at_zero(
    api: FakeKubeApi, activator: Activator, replicas: Replicas, namespace: str, name: str, **policy: Any
) -> str:
    """Service `name` in `namespace` at zero, routed through the activator; its host."""
    api.put_service(service(namespace, name, "10.96.0.10", 80))
    api.put_service(service(namespace, f"{name}-private", "127.0.0.1", replicas.port))
    api.put_slice(activator_slice(namespace, name, {"readyPath": f"/ready/{namespace}.{name}", **policy}))
    wait_for(
        lambda: activator.metric("activator_held_requests", namespace=namespace, service=name) is not None,
        timeout=20,
        message=f"{namespace}/{name} to be routed",
    )
    return f"{name}.{namespace}.svc"


def in_background(call: Callable[[], httpx.Response]) -> Future[httpx.Response]:
    pool = ThreadPoolExecutor(max_workers=1)
    future = pool.submit(call)
    pool.shutdown(wait=False)
    return future


def held(activator: Activator, namespace: str, name: str) -> float:
    return activator.metric("activator_held_requests", namespace=namespace, service=name) or 0.0


def test_a_request_at_zero_is_held_wakes_the_service_once_and_is_answered_once_ready(
    api: tuple[FakeKubeApi, str], activator: Activator, replicas: Replicas
) -> None:
    fake, _ = api
    host = at_zero(fake, activator, replicas, "team-a", "llm")
    pending = in_background(lambda: activator.post(host, "/v1/echo?q=1", json={"prompt": "hi"}))
    wait_for(lambda: fake.patches_of("team-a", "llm"), timeout=20, message="a wake patch")
    wait_for(lambda: held(activator, "team-a", "llm") == 1, timeout=20, message="the request to be held")
    assert not pending.done()
    replicas.ready.add("team-a.llm")
    response = pending.result(timeout=30)
    assert response.status_code == 200
    answered = response.json()
    assert answered["path"] == "/v1/echo" and json.loads(answered["body"]) == {"prompt": "hi"}
    assert answered["headers"]["x-forwarded-for"] == "127.0.0.1"
    [patch] = fake.patches_of("team-a", "llm")
    stamp = patch.body["metadata"]["annotations"]["inference.rocm.dev/wake"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", stamp)
    labels = {"namespace": "team-a", "service": "llm"}
    wait_for(lambda: activator.metric("activator_wait_seconds_count", **labels, outcome="served") == 1, timeout=10)
    assert activator.metric("activator_wakes_total", **labels) == 1
    assert activator.metric("activator_requests_total", **labels, code="200") == 1
    assert activator.metric("activator_held_requests", **labels) == 0


def test_a_request_for_a_router_at_zero_wakes_its_service_and_goes_on_through_the_router(
    api: tuple[FakeKubeApi, str], activator: Activator, replicas: Replicas
) -> None:
    """With routing.router the slice leads NAME-router: a request for that host is held, the
    wake goes to the InferenceService NAME (the owner of NAME-router-private), and the request
    goes on through NAME-router-private once the router's readiness answers 200."""
    fake, _ = api
    fake.put_service(service("team-r", "chat-router", "10.96.0.30", 80))
    fake.put_service(service("team-r", "chat-router-private", "127.0.0.1", replicas.port, owner="chat"))
    fake.put_slice(activator_slice("team-r", "chat-router", {"readyPath": "/ready/team-r.chat-router"}))
    wait_for(
        lambda: activator.metric("activator_held_requests", namespace="team-r", service="chat-router") is not None,
        timeout=20,
        message="team-r/chat-router to be routed",
    )
    pending = in_background(lambda: activator.post("chat-router.team-r.svc", "/v1/echo?r=1", json={"p": 1}))
    wait_for(lambda: held(activator, "team-r", "chat-router") == 1, timeout=20, message="the request held")
    wait_for(lambda: fake.patches_of("team-r", "chat"), timeout=20, message="a wake patch of the InferenceService")
    assert fake.patches_of("team-r", "chat-router") == []  # no InferenceService has that name
    assert not pending.done()
    replicas.ready.add("team-r.chat-router")
    response = pending.result(timeout=30)
    assert response.status_code == 200 and response.json()["path"] == "/v1/echo"
    assert "/v1/echo?r=1" in replicas.seen


def test_requests_held_together_are_all_answered_in_the_order_they_came(
    api: tuple[FakeKubeApi, str], activator: Activator, replicas: Replicas
) -> None:
    fake, _ = api
    host = at_zero(fake, activator, replicas, "team-a", "many")
    pending = []
    for n in range(20):
        pending.append(in_background(lambda n=n: activator.get(host, f"/v1/order?n={n}")))  # type: ignore[misc]
        wait_for(lambda n=n: held(activator, "team-a", "many") == n + 1, timeout=20, message=f"request {n} held")  # type: ignore[misc]
    replicas.ready.add("team-a.many")
    assert [p.result(timeout=30).status_code for p in pending] == [200] * 20
    order = [seen for seen in replicas.seen if seen.startswith("/v1/order")]
    assert order == [f"/v1/order?n={n}" for n in range(20)]
    assert len(fake.patches_of("team-a", "many")) < 20  # throttled: not one per request


def test_a_stream_passes_chunk_by_chunk_after_the_wait(
    api: tuple[FakeKubeApi, str], activator: Activator, replicas: Replicas
) -> None:
    fake, _ = api
    host = at_zero(fake, activator, replicas, "team-a", "stream")
    replicas.gate.clear()
    lines: list[str] = []
    done = threading.Event()

    def read() -> None:
        with httpx.Client(timeout=60) as client:
            with client.stream("GET", f"{activator.url}/v1/stream", headers={"host": host}) as response:
                assert response.status_code == 200
                for line in response.iter_lines():
                    if line:
                        lines.append(line)
        done.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    wait_for(lambda: held(activator, "team-a", "stream") == 1, timeout=20, message="the stream request held")
    replicas.ready.add("team-a.stream")
    wait_for(lambda: lines == ["data: first"], timeout=20, message="the first event, before the rest exists")
    replicas.gate.set()
    assert done.wait(20)
    assert lines == ["data: first", "data: 0", "data: 1", "data: 2", "data: [DONE]"]


def test_past_its_wait_a_request_gets_a_503_to_retry_and_not_before(
    api: tuple[FakeKubeApi, str], activator: Activator, replicas: Replicas
) -> None:
    fake, _ = api
    host = at_zero(fake, activator, replicas, "team-a", "never", maxWaitSeconds=2)
    pending = in_background(lambda: activator.post(host, json={"prompt": "hi"}))
    # Held first (the wait, not an answer at once), then let go with the 503.
    wait_for(lambda: held(activator, "team-a", "never") == 1, timeout=20, message="the request to be held")
    response = pending.result(timeout=60)
    assert response.status_code == 503
    assert int(response.headers["retry-after"]) >= 1
    error = response.json()["error"]
    assert "did not become ready within 2s" in error["message"] and error["code"] == 503
    timeouts = {"namespace": "team-a", "service": "never", "outcome": "timeout"}
    wait_for(lambda: activator.metric("activator_wait_seconds_count", **timeouts) == 1, timeout=10)


def test_over_its_held_limit_a_request_gets_a_429(
    api: tuple[FakeKubeApi, str], activator: Activator, replicas: Replicas
) -> None:
    fake, _ = api
    host = at_zero(fake, activator, replicas, "team-a", "small", maxHeld=2)
    first = [in_background(lambda: activator.get(host)) for _ in range(2)]
    wait_for(lambda: held(activator, "team-a", "small") == 2, timeout=20, message="two requests held")
    refused = activator.get(host)
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert "2 requests are already waiting" in refused.json()["error"]["message"]
    replicas.ready.add("team-a.small")
    assert [f.result(timeout=30).status_code for f in first] == [200, 200]


def test_an_unknown_host_is_a_404_naming_it(activator: Activator) -> None:
    response = activator.get("nobody.team-z.svc:80", "/v1/completions")
    assert response.status_code == 404
    assert response.json()["error"]["message"] == (
        "no service is routed through the activator for host 'nobody.team-z.svc:80'"
    )


def test_a_slice_routes_nothing_of_another_namespace(
    api: tuple[FakeKubeApi, str], activator: Activator, replicas: Replicas
) -> None:
    fake, _ = api
    # team-b's service exists; team-x writes a slice naming it, and has no such Service itself.
    fake.put_service(service("team-b", "secret", "10.96.2.10", 80))
    fake.put_service(service("team-b", "secret-private", "127.0.0.1", replicas.port))
    fake.put_slice(activator_slice("team-x", "secret"))
    wait_for(lambda: fake.seen("/api/v1/namespaces/team-x/services/secret") > 0, timeout=20, message="the lookup")
    # team-x routes its own service, and tries hosts of team-b through it.
    at_zero(fake, activator, replicas, "team-x", "own")
    replicas.ready.add("team-x.own")
    for host in ("secret.team-b", "secret.team-b.svc", "secret.team-b.svc.cluster.local", "10.96.2.10", "secret"):
        assert activator.get(host).status_code == 404, host
    assert fake.seen("/api/v1/namespaces/team-b/services/secret-private") == 0


def test_a_slice_that_comes_before_its_services_is_routed_once_they_exist(
    api: tuple[FakeKubeApi, str], activator: Activator, replicas: Replicas
) -> None:
    fake, _ = api
    fake.put_slice(activator_slice("team-i", "early", {"readyPath": "/ready/team-i.early"}))
    wait_for(lambda: fake.seen("/api/v1/namespaces/team-i/services/early") > 0, timeout=20, message="the lookup")
    assert activator.get("early.team-i").status_code == 404  # no Service: nothing routed
    fake.put_service(service("team-i", "early", "10.96.0.10", 80))
    fake.put_service(service("team-i", "early-private", "127.0.0.1", replicas.port))  # the slice unchanged
    labels = {"namespace": "team-i", "service": "early"}
    wait_for(lambda: activator.metric("activator_held_requests", **labels) is not None, timeout=20, message="a route")
    # Routed, every series starts at 0: a first wake or timeout is then an increase an alert sees.
    assert activator.metric("activator_wakes_total", **labels) == 0
    for outcome in ("served", "timeout", "refused", "gone"):
        assert activator.metric("activator_wait_seconds_count", **labels, outcome=outcome) == 0, outcome
    replicas.ready.add("team-i.early")
    assert activator.get("early.team-i").status_code == 200


def test_a_slice_after_a_broken_watch_or_a_410_is_still_routed(
    api: tuple[FakeKubeApi, str], activator: Activator, replicas: Replicas
) -> None:
    fake, _ = api
    fake.break_watches()
    at_zero(fake, activator, replicas, "team-c", "after-break")
    fake.expire_watches()
    at_zero(fake, activator, replicas, "team-c", "after-gone")
    replicas.ready.add("team-c.after-gone")
    assert activator.get("after-gone.team-c").status_code == 200
    assert fake.patches_of("team-c", "after-gone") == []  # already up (kube-proxy was late): no wake


def test_a_removed_route_still_proxies_what_kube_proxy_sends_then_is_forgotten(
    api: tuple[FakeKubeApi, str], activator: Activator, replicas: Replicas
) -> None:
    fake, _ = api
    host = at_zero(fake, activator, replicas, "team-d", "woken")
    fake.delete_slice("team-d", "woken-activator")  # the operator: a replica is ready
    # Its readiness path still says 503: a request held would wait; one passed on is answered.

    def passed_on() -> bool:
        try:
            return activator.get(host, timeout=httpx.Timeout(5, read=1)).status_code == 200
        except httpx.ReadTimeout:
            return False  # held: the removal not seen yet

    wait_for(passed_on, timeout=20, message="requests passed straight on once the slice is gone")
    labels = {"namespace": "team-d", "service": "woken"}
    wait_for(lambda: activator.metric("activator_requests_total", **labels, code="200"), timeout=10)
    wait_for(
        lambda: (
            activator.get(host).status_code == 404 and activator.metric("activator_requests_total", **labels) is None
        ),
        timeout=LINGER_S + 20,
        message="the route and its series to be forgotten",
    )
    assert activator.metric("activator_held_requests", **labels) is None


def test_a_cluster_ip_a_lingering_route_had_goes_to_the_service_created_on_it(
    api: tuple[FakeKubeApi, str], activator: Activator, replicas: Replicas
) -> None:
    """Deleted with its Service, a service's route lingers; the API server gives its ClusterIP to
    the next Service. Requests for that address are the new service's: held for it, not passed
    to the old one's replicas."""
    fake, _ = api
    address = "10.96.7.7"
    fake.put_service(service("team-g", "old", address, 80))
    fake.put_service(service("team-g", "old-private", "127.0.0.1", replicas.port))
    fake.put_slice(activator_slice("team-g", "old", {"readyPath": "/ready/team-g.old"}))
    wait_for(lambda: activator.metric("activator_held_requests", namespace="team-g", service="old") is not None)
    fake.delete_slice("team-g", "old-activator")
    replicas.ready.add("team-g.old")
    fake.put_service(service("team-h", "new", address, 80))
    fake.put_service(service("team-h", "new-private", "127.0.0.1", replicas.port))
    fake.put_slice(activator_slice("team-h", "new", {"readyPath": "/ready/team-h.new"}))
    wait_for(lambda: activator.metric("activator_held_requests", namespace="team-h", service="new") is not None)
    pending = in_background(lambda: activator.post(address, "/v1/echo?q=reused"))
    wait_for(lambda: held(activator, "team-h", "new") == 1, timeout=20, message="held for the new service")
    replicas.ready.add("team-h.new")
    assert pending.result(timeout=30).status_code == 200


def test_an_oversized_body_is_refused_before_it_is_held(
    api: tuple[FakeKubeApi, str], activator: Activator, replicas: Replicas
) -> None:
    fake, _ = api
    host = at_zero(fake, activator, replicas, "team-f", "big")
    declared = activator.post(host, content=b"x" * (MAX_BODY + 1))
    assert declared.status_code == 413 and f"limit of {MAX_BODY} bytes" in declared.json()["error"]["message"]
    chunked = activator.post(host, content=iter([b"x" * 65536] * (MAX_BODY // 65536 + 2)))
    assert chunked.status_code == 413
    assert fake.patches_of("team-f", "big") == []  # nothing held: nothing woken


def test_a_client_that_leaves_while_held_is_let_go(
    api: tuple[FakeKubeApi, str], activator: Activator, replicas: Replicas
) -> None:
    fake, _ = api
    host = at_zero(fake, activator, replicas, "team-g", "impatient")
    with pytest.raises(httpx.ReadTimeout):
        httpx.get(f"{activator.url}/v1/echo", headers={"host": host}, timeout=httpx.Timeout(5, read=1))
    labels = {"namespace": "team-g", "service": "impatient"}
    wait_for(lambda: activator.metric("activator_wait_seconds_count", **labels, outcome="gone") == 1, timeout=10)
    assert held(activator, "team-g", "impatient") == 0


def test_wakes_carry_the_service_accounts_token_as_it_is_rotated(
    api: tuple[FakeKubeApi, str], activator: Activator, replicas: Replicas, token_file: Path
) -> None:
    fake, _ = api

    def woken_and_answered(name: str) -> None:
        pending = in_background(lambda: activator.get(at_zero(fake, activator, replicas, "team-h", name)))
        wait_for(lambda: fake.patches_of("team-h", name), timeout=20, message=f"{name} woken")
        replicas.ready.add(f"team-h.{name}")
        assert pending.result(timeout=30).status_code == 200

    woken_and_answered("first")
    token_file.write_text("rotated-token\n")
    woken_and_answered("second")
    assert [p.authorization for p in fake.patches_of("team-h", "first")] == ["Bearer first-token"]
    assert [p.authorization for p in fake.patches_of("team-h", "second")] == ["Bearer rotated-token"]


def test_on_sigterm_held_requests_are_answered_before_the_process_exits(
    api: tuple[FakeKubeApi, str], replicas: Replicas, tmp_path: Path
) -> None:
    fake, url = api
    port, metrics_port = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = activator_command(url, port, metrics_port, "--drain-listen-seconds=3", "--final-scrape-seconds=3")
    with running(
        command, env=env, log=tmp_path / "activator.log", ready_url=f"http://127.0.0.1:{port}/readyz", stop_timeout=60
    ) as process:
        this = Activator(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics", process)
        host = at_zero(fake, this, replicas, "team-e", "rolled")
        pending = in_background(lambda: this.post(host, json={"prompt": "held across a rollout"}))
        wait_for(lambda: held(this, "team-e", "rolled") == 1, timeout=20, message="the request to be held")
        process.send_signal(signal.SIGTERM)
        wait_for(lambda: httpx.get(f"{this.url}/readyz", timeout=5).status_code == 503, timeout=5, message="unready")
        wait_for(lambda: _refused(this.url), timeout=20, message="the listener to close")
        assert process.poll() is None and not pending.done()
        # The listener is closed, the metrics port is not: a scrape still sees the held request.
        assert held(this, "team-e", "rolled") == 1
        replicas.ready.add("team-e.rolled")
        response = pending.result(timeout=30)
        assert response.status_code == 200
        assert json.loads(response.json()["body"]) == {"prompt": "held across a rollout"}
        # Every request has ended, and the metrics port still answers: the scrape after it
        # learns how its wait did. Once the port closes the process exits, so a scrape seen
        # here was one inside the final scrape window.
        lingering = "every request answered; metrics answer 3.0s more"
        wait_for(lambda: lingering in (tmp_path / "activator.log").read_text(), message="the final scrape window")
        labels = {"namespace": "team-e", "service": "rolled", "outcome": "served"}
        wait_for(lambda: this.metric("activator_wait_seconds_count", **labels) == 1, message="the served wait scraped")
        assert held(this, "team-e", "rolled") == 0
        assert process.wait(30) == 0


def _refused(url: str) -> bool:
    try:
        httpx.get(f"{url}/healthz", timeout=2)
    except httpx.ConnectError:
        return True
    except httpx.HTTPError:
        return False
    return False


# ---------------------------------------------------------------------- tenants sharing the activator


@dataclass
class Stalled:
    """An upstream that reads each POST's body whole and never answers it: the bodies it has read,
    and the requests still open on it (one ends when the activator lets it go). Never ready, so a
    request that reaches it was passed straight on, not held."""

    port: int = 0
    bodies: int = 0
    open: int = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"].startswith("/ready/"):
            await _json(send, {}, 503)
            return
        if scope["method"] == "GET":
            await _json(send, {"passed": "on"})
            return
        while (await receive()).get("more_body"):
            pass
        self.bodies += 1
        self.open += 1
        try:
            while (await receive())["type"] != "http.disconnect":
                pass
        finally:
            self.open -= 1


@pytest.fixture(scope="module")
def stalled() -> Iterator[Stalled]:
    app = Stalled(port=free_port())
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=app.port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started or None, timeout=10, message="the stalled upstream to listen")
    yield app
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def tenants(api: tuple[FakeKubeApi, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Activator]:
    """The activator with its shipped limits (bodies up to 16 MiB under a 256 MiB memory limit,
    1,000 requests held per service, 2,000 in all) and routes that linger for the whole module."""
    _, url = api
    port, metrics_port = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    log = Path(tmp_path_factory.mktemp("tenants")) / "activator.log"
    command = activator_command(url, port, metrics_port, "--drain-listen-seconds=0", "--linger-seconds=600")
    with running(command, env=env, log=log, ready_url=f"http://127.0.0.1:{port}/readyz") as process:
        yield Activator(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics", process)


def _connect(activator: Activator) -> socket.socket:
    host, port = activator.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=60)


def test_a_tenants_stalled_upstream_leaves_the_read_budget_to_the_others(
    api: tuple[FakeKubeApi, str], tenants: Activator, replicas: Replicas, stalled: Stalled
) -> None:
    """Four 16 MiB bodies (the whole read budget) passed straight on to a lingering route whose
    replica reads them and never answers; their clients leave. Another tenant is served, and the
    upstream requests are let go."""
    fake, _ = api
    fake.put_service(service("team-hog", "hog", "10.96.9.10", 80))
    fake.put_service(service("team-hog", "hog-private", "127.0.0.1", stalled.port))
    fake.put_slice(activator_slice("team-hog", "hog", {"readyPath": "/ready/team-hog.hog"}))
    labels = {"namespace": "team-hog", "service": "hog"}
    wait_for(lambda: tenants.metric("activator_held_requests", **labels) is not None, timeout=20, message="routed")
    fake.delete_slice("team-hog", "hog-activator")  # a replica is ready: the route lingers

    def passed_on() -> bool:
        try:
            return tenants.get("hog.team-hog", timeout=httpx.Timeout(5, read=1)).status_code == 200
        except httpx.ReadTimeout:
            return False  # held: the removal not seen yet

    wait_for(passed_on, timeout=20, message="team-hog's requests passed straight on")
    size = 16 << 20
    head = b"POST /v1/completions HTTP/1.1\r\nHost: hog.team-hog\r\nContent-Length: %d\r\n\r\n" % size
    hogs = [_connect(tenants) for _ in range(4)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        for conn in hogs:
            pool.submit(conn.sendall, head + b"x" * size)
        wait_for(lambda: stalled.bodies == 4, timeout=120, message="the four bodies read by the stalled upstream")
    for conn in hogs:
        conn.close()
    host = at_zero(fake, tenants, replicas, "team-ok", "fine")
    replicas.ready.add("team-ok.fine")
    response = tenants.post(host, content=b"y" * (1 << 20))
    assert response.status_code == 200, response.text
    assert json.loads(response.text)["body"] == "y" * (1 << 20)
    wait_for(lambda: stalled.open == 0, timeout=20, message="the stalled upstream requests let go")


def test_one_tenants_stalled_uploads_hold_no_more_than_its_share_of_the_read_budget(
    api: tuple[FakeKubeApi, str], tenants: Activator, replicas: Replicas
) -> None:
    """One tenant's uploads stall one byte short of 16 MiB, four of them: the whole read budget.
    Its first is read, its others are refused (503) once their wait is over, and another
    tenant's body is still read, held and served while the first stalls."""
    fake, _ = api
    greedy = at_zero(fake, tenants, replicas, "team-greedy", "up")
    size = 16 << 20
    upload = b"POST /v1/echo HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n" % (greedy.encode(), size)
    upload += b"x" * (size - 1)
    stalls = [_connect(tenants) for _ in range(4)]

    def send(conn: socket.socket) -> None:
        with contextlib.suppress(OSError):  # refused and closed
            conn.sendall(upload)

    try:
        send(stalls[0])  # read whole but its last byte, which never comes
        with ThreadPoolExecutor(max_workers=3) as pool:
            list(pool.map(send, stalls[1:], timeout=60))  # read, or refused
        other = at_zero(fake, tenants, replicas, "team-modest", "up")
        replicas.ready.add("team-modest.up")
        response = tenants.post(other, content=b"y" * (1 << 20))
        assert response.status_code == 200, response.text
        refused = {"namespace": "team-greedy", "service": "up", "code": "503"}
        wait_for(lambda: tenants.metric("activator_requests_total", **refused) == 3, timeout=10)
    finally:
        for conn in stalls:
            conn.close()


def test_one_tenant_holding_every_slot_leaves_another_tenant_room(
    api: tuple[FakeKubeApi, str], tenants: Activator, replicas: Replicas
) -> None:
    """2 x 1,000 requests held for one tenant's two services fill the activator's 2,000; another
    tenant's request is still held (the flood's newest gives its slot back, with a 429)."""
    fake, _ = api
    flood = [at_zero(fake, tenants, replicas, "team-flood", name) for name in ("one", "two")]
    conns: list[socket.socket] = []
    try:
        for host in flood:
            for _ in range(1000):
                conn = _connect(tenants)
                conn.sendall(b"GET /v1/echo HTTP/1.1\r\nHost: %s\r\n\r\n" % host.encode())
                conns.append(conn)
        wait_for(
            lambda: held(tenants, "team-flood", "one") + held(tenants, "team-flood", "two") == 2000,
            timeout=120,
            message="2,000 requests held",
        )
        quiet = at_zero(fake, tenants, replicas, "team-quiet", "llm")
        pending = in_background(lambda: tenants.get(quiet))
        wait_for(
            lambda: pending.done() or held(tenants, "team-quiet", "llm") == 1,
            timeout=20,
            message="another tenant's request held or refused",
        )
        assert not pending.done(), pending.result().text
        replicas.ready.add("team-quiet.llm")
        assert pending.result(timeout=30).status_code == 200
        assert held(tenants, "team-flood", "one") + held(tenants, "team-flood", "two") == 1999
        with selectors.DefaultSelector() as selector:
            for conn in conns:
                selector.register(conn, selectors.EVENT_READ)
            answered = [key.fileobj for key, _ in selector.select(timeout=5)]
        assert len(answered) == 1
        reply = answered[0].recv(65536)  # type: ignore[union-attr]
        assert reply.startswith(b"HTTP/1.1 429") and b"retry-after" in reply.lower()
    finally:
        for conn in conns:
            conn.close()


def test_a_short_name_several_namespaces_use_goes_to_the_clients_own_namespace(
    api: tuple[FakeKubeApi, str], tenants: Activator, replicas: Replicas
) -> None:
    """team short-b's clients call `http://chat/`; short-a then puts its own `chat` at zero. Each
    client's short name is its own namespace's service (as DNS resolves it), known by its pod's
    address; a client that is no pod is told to name the namespace."""
    fake, _ = api
    fake.put_pod("short-b", "client", "127.0.0.3")
    fake.put_pod("short-a", "client", "127.0.0.4")
    at_zero(fake, tenants, replicas, "short-b", "chat")
    at_zero(fake, tenants, replicas, "short-a", "chat")

    def from_(source: str) -> Future[httpx.Response]:
        transport = httpx.HTTPTransport(local_address=source)

        def call() -> httpx.Response:
            with httpx.Client(transport=transport, timeout=60) as client:
                return client.get(f"{tenants.url}/v1/echo", headers={"host": "chat"})

        return in_background(call)

    for namespace, source in (("short-b", "127.0.0.3"), ("short-a", "127.0.0.4")):
        pending = from_(source)
        wait_for(
            lambda: pending.done() or held(tenants, namespace, "chat") == 1,  # noqa: B023
            timeout=20,
            message=f"the request from {namespace} held",
        )
        assert not pending.done(), pending.result().text
        replicas.ready.add(f"{namespace}.chat")
        assert pending.result(timeout=30).status_code == 200
    stranger = from_("127.0.0.5").result(timeout=30)
    assert stranger.status_code == 404
    assert "chat.<namespace>" in stranger.json()["error"]["message"]


def test_while_no_body_can_be_read_the_activator_is_unready_and_then_ready_again(
    api: tuple[FakeKubeApi, str], tenants: Activator, replicas: Replicas
) -> None:
    """Four tenants' uploads stall one byte short of 16 MiB: the whole read budget. A fifth
    tenant's body is refused (503) when its wait is over; /readyz then says so (the operator
    takes this pod out of the services' slices), /healthz stays 200, and once the uploads end
    the activator is ready again."""
    fake, _ = api
    size = 16 << 20
    stalls = []
    try:
        for n in range(4):
            host = at_zero(fake, tenants, replicas, f"team-slow{n}", "up")
            conn = _connect(tenants)
            conn.sendall(b"POST /v1/echo HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n" % (host.encode(), size))
            conn.sendall(b"x" * (size - 1))
            stalls.append(conn)
        late = at_zero(fake, tenants, replicas, "team-late", "up")
        refused = tenants.post(late, content=b"y" * (1 << 20))
        assert refused.status_code == 503, refused.text
        assert "bodies arriving at once" in refused.json()["error"]["message"]
        assert httpx.get(f"{tenants.url}/readyz", timeout=5).status_code == 503
        assert httpx.get(f"{tenants.url}/healthz", timeout=5).status_code == 200
    finally:
        for conn in stalls:
            conn.close()
    wait_for(lambda: httpx.get(f"{tenants.url}/readyz", timeout=5).status_code == 200, timeout=20, message="ready")


def test_an_answer_that_does_not_begin_in_time_is_a_504_and_the_upstream_request_ends(
    api: tuple[FakeKubeApi, str], activator: Activator, stalled: Stalled
) -> None:
    fake, _ = api
    fake.put_service(service("team-s", "silent", "10.96.9.20", 80))
    fake.put_service(service("team-s", "silent-private", "127.0.0.1", stalled.port))
    fake.put_slice(activator_slice("team-s", "silent", {"readyPath": "/ready/team-s.silent"}))
    labels = {"namespace": "team-s", "service": "silent"}
    wait_for(lambda: activator.metric("activator_held_requests", **labels) is not None, timeout=20, message="routed")
    fake.delete_slice("team-s", "silent-activator")  # lingers: passed straight on

    def passed_on() -> bool:
        try:
            return activator.get("silent.team-s", timeout=httpx.Timeout(5, read=1)).status_code == 200
        except httpx.ReadTimeout:
            return False

    wait_for(passed_on, timeout=20, message="team-s's requests passed straight on")
    bodies = stalled.bodies
    pending = in_background(
        lambda: httpx.post(
            f"{activator.url}/v1/completions", headers={"host": "silent.team-s"}, content=b"{}", timeout=60
        )
    )
    # The upstream has the request open (the wait for its answer), then the 504 ends it.
    wait_for(lambda: stalled.bodies == bodies + 1 and stalled.open == 1, timeout=20, message="the request upstream")
    response = pending.result(timeout=60)
    assert response.status_code == 504
    assert "did not begin its answer within 3s" in response.json()["error"]["message"]
    wait_for(lambda: stalled.open == 0, timeout=20, message="the upstream request let go")
