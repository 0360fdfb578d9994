"""The activator: where a service's requests go while it has no ready replica (scale to zero).

As Knative's activator, it is in the request path only at zero. The operator then points the
service's own Service at this Deployment through an EndpointSlice (routes.py says what a slice
may route), and removes that slice once a replica is ready. Each request that arrives here is
read whole under the vLLM front's bounds (proxy.py), then held: it wakes the
service (a merge patch of the InferenceService's wake annotation, at most one per service every
2 s), and one poller per service asks the replicas' readiness path through the `S-private`
Service (kube-proxy sends that only to Ready pods) every 0.25 s. On the first 200 the held
requests go on in the order they came, each proxied as the front proxies (hop-by-hop headers
dropped, the client named by its peer address) with its answer streamed back. A request held
past its wait gets a 503 with Retry-After; more than a service's (or the activator's) limits of
held requests or bytes get a 429, the pools shared fairly among clients and namespaces
(holding.py).

Tenants share this process, so none may starve the others. A namespace's bodies being read
hold at most its share of the read budget (TENANT_READ_SHARE), and a body's bytes go back to
the budget as soon as they are written upstream, not when the answer ends. Until the answer's
head comes, the client's leaving is watched: it cancels the upstream request, as does a head
that takes longer than `response_start_timeout_s` (504). /readyz says 503 while no body of the
largest size could be read and one was just refused for want of budget.

A short host (`http://llm/`) that services at zero in several namespaces claim goes to the
client's own namespace, as DNS resolves a short name (kube.ClientNamespaces: the client pod's
namespace, from its address); a client that is no pod of theirs is told to name the namespace.

A route whose slice is removed keeps serving for a minute: requests held for it still go to the
upstream they waited for, and new ones that kube-proxy still sends here are proxied at once.

SIGTERM: /readyz turns 503, the listener stays open `drain_listen_seconds` (the operator and
kube-proxy take this pod out of the slices meanwhile), then closes; the process exits once no
request is held or in flight, each having been served or having reached its wait, and the
metrics port has answered `final_scrape_seconds` more. A rolling update of the activator loses
no held request, nor the record of how its wait ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import uvicorn
from starlette.types import Receive, Scope, Send
from uvicorn.server import ServerState

from bounded_http import metrics_port, signals
from bounded_http.budgets import ReadBudget
from bounded_http.errors import Busy, PayloadTooLarge
from bounded_http.http_protocol import ConnectionLimits, LimitedHttpProtocol
from bounded_http.proxy import (
    Body,
    BodyReader,
    ClientGone,
    answer,
    error_body,
    request_headers,
    server_config,
    stream,
    target,
)

from .config import LIVE_PATH, READY_PATH, ActivatorConfig
from .grpc_proxy import GrpcLimits, GrpcPort
from .holding import REWAKE_S, Gate, Held, HeldRequests, Refusal, Released
from .kube import SLICES, ApiError, ClientNamespaces, KubeApi, TokenFile, inference_service_path, service_path
from .metrics import ActivatorMetrics
from .routes import (
    SLICE_SELECTOR,
    WAKE_ANNOTATION,
    Load,
    Route,
    RouteRefused,
    RouteTable,
    ServiceKey,
    route_for,
    slice_service,
)

log = logging.getLogger("inference_activator")

#: How often a service's readiness is asked while requests wait for it.
POLL_S = 0.25
#: At most one wake patch per service this often (and again every REWAKE_S while requests wait).
WAKE_INTERVAL_S = 2.0
#: After a 200 from the readiness path, new requests go straight on for this long.
READY_REUSE_S = 1.0
#: The longest a released request waits for the one before it to be answered (see `_written`).
ORDER_GRACE_S = 0.1
#: The longest a request whose short host several namespaces claim waits to learn its client's.
CLIENT_LOOKUP_S = 5.0
#: Slices whose Services are missing are tried again, and lingering routes ended, this often.
HOUSEKEEPING_S = 2.0
BACKOFF_S = (0.5, 30.0)
#: Of the bodies being read at once: the most one namespace's may hold (at least one whole body).
TENANT_READ_SHARE = 1 / 4
#: How long one exposition of the metrics serves every scrape (a flood costs five a second).
EXPOSITION_MAX_AGE_S = 0.2
#: What a request that waited its whole wait is told to wait before it tries again.
RETRY_AFTER_S = 5
GONE = 499  # nginx's code for a client that left: counted, never sent


class Activator:
    """The ASGI app, the routes it keeps from the API server, and the requests it holds."""

    def __init__(
        self,
        config: ActivatorConfig,
        api: KubeApi,
        metrics: ActivatorMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.api = api
        self.metrics = metrics if metrics is not None else ActivatorMetrics()
        self.clock = clock
        self.caps = config.caps()
        max_body, reading, held = config.limits()
        self.bodies = BodyReader(max_body, ReadBudget(reading), config.body_wait_s)
        self.tenant_read_bytes = max(max_body, int(reading * TENANT_READ_SHARE))
        self.shares: dict[str, ReadBudget] = {}  # a namespace's part of the read budget
        self.read_refused = False  # the last body read ran out of budget
        self.holding = HeldRequests(Load(config.max_held_total, held), self.metrics)
        self.table = RouteTable()
        self.client_namespaces = ClientNamespaces(api)
        self.gates: dict[ServiceKey, Gate] = {}
        self.slices: dict[tuple[str, str], dict[str, Any]] = {}
        self.slice_routes: dict[tuple[str, str], ServiceKey] = {}
        self.pending: set[tuple[str, str]] = set()
        self.synced = False
        self.draining = False
        self._client: httpx.AsyncClient | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        #: Awaited at shutdown before the pollers stop: other ports' calls still held (the gRPC port).
        self.before_shutdown: list[Callable[[], Awaitable[None]]] = []

    # ------------------------------------------------------------------ HTTP

    @property
    def client(self) -> httpx.AsyncClient:
        """One pool of connections to the services' upstreams, made on the serving loop."""
        if self._client is None:
            limits = httpx.Limits(max_connections=self.config.max_connections, max_keepalive_connections=64)
            # No read timeout: a long completion writes nothing until it is done; the client's
            # leaving (or this server's write timeout) is what ends a request that waits.
            timeout = httpx.Timeout(connect=self.config.connect_timeout_s, read=None, write=30.0, pool=30.0)
            self._client = httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False)
        return self._client

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        # The probe paths are the activator's whatever the Host (no engine serves them), so
        # they cost nothing however many a client sends.
        if scope["path"] == LIVE_PATH:
            await answer(send, 200, b'{"status":"live"}')
            return
        if scope["path"] == READY_PATH:
            ready = self.synced and not self.draining and not self.starved
            await answer(send, 200 if ready else 503, b'{"ready":%s}' % (b"true" if ready else b"false"))
            return
        found = await self.route_of(_host(scope), str((scope.get("client") or ("",))[0]))
        if isinstance(found, Route):
            gate = self.gates[found.key]
            code = await self.serve(gate, scope, receive, send)
            self.metrics.answered(found.key, code)
        else:
            await answer(send, 404, error_body(404, found))

    async def route_of(self, host: str, client: str) -> Route | str:
        """The route of a Host (or a gRPC call's :authority) from `client`'s address, or why none."""
        found = self.table.lookup(host)
        if isinstance(found, list):
            found = await self._clients_own(found, client)
        if isinstance(found, Route):
            return found
        if isinstance(found, list):
            name = found[0].name
            return (
                f"host {host!r} names services at zero in several namespaces, and the client is no pod of "
                f"one of them: use {name}.<namespace>"
            )
        return f"no service is routed through the activator for host {host!r}"

    async def _clients_own(self, claims: list[ServiceKey], client: str) -> Route | list[ServiceKey]:
        """Of the services a short name claims in several namespaces, the one in the client's own
        namespace, as DNS resolves a short name (its search path); `claims` if the client is no
        pod of theirs (or the API server does not say in time)."""
        namespace = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLIENT_LOOKUP_S):
                namespace = await self.client_namespaces.of(client)
        for key in claims:
            if key.namespace == namespace and key in self.table.routes:
                return self.table.routes[key]
        return claims

    async def serve(self, gate: Gate, scope: Scope, receive: Receive, send: Send) -> int:
        """One request of a routed service: read, then held or passed on; the status answered."""
        share = self.namespace_share(gate.route.key.namespace)
        try:
            body = await self.bodies.read(scope, receive, share)
        except PayloadTooLarge as exc:
            await answer(send, 413, error_body(413, str(exc)))
            return 413
        except Busy:
            self.read_refused = True
            await answer(send, 503, error_body(503, "too many request bodies arriving at once"), retry_after=True)
            return 503
        except ClientGone:
            return GONE
        self.read_refused = False
        try:
            if self.passes_on_now(gate):
                return await self.forward(gate.route.upstream, scope, body, receive, send)
            return await self.hold(gate, scope, body, receive, send)
        finally:
            body.release()

    async def hold(self, gate: Gate, scope: Scope, body: Body, receive: Receive, send: Send) -> int:
        client = str((scope.get("client") or ("",))[0])
        waited = await self.wait_held(gate, client, len(body.data), body.release, lambda: _disconnected(receive))
        if isinstance(waited, Released):
            return await self.forward(waited.upstream, scope, body, receive, send, waited.before, waited.next_may_go)
        if waited.status == GONE:
            return GONE
        await answer(send, waited.status, error_body(waited.status, waited.message), retry_after=waited.retry_after)
        return waited.status

    async def wait_held(
        self,
        gate: Gate,
        client: str,
        size: int,
        on_held: Callable[[], None],
        gone: Callable[[], Awaitable[None]] | None = None,
    ) -> Released | Refusal:
        """One request of `client` with `size` body bytes held for `gate`, whatever its transport:
        released once a replica is Ready, or refused (the limits, its wait, a fairer claim, the
        client gone: `gone` returns when it goes, or the caller's task is cancelled). `on_held`
        is called once it is held (its bytes then count against the held limits)."""
        key, policy = gate.route.key, gate.route.policy
        refusal = self.holding.make_room(gate, self.gates.values(), client, size)
        if refusal is not None:
            status, message = refusal
            self.metrics.waited(key, "refused", 0.0)
            return Refusal(status, message, status == 429)
        on_held()
        held = Held(size, self.clock(), asyncio.get_running_loop().create_future(), client)
        self.holding.take(gate, held)
        gate.wake_wanted = True
        if gate.poller is None:
            gate.poller = self._spawn(self.poll(gate))
        try:
            outcome = await self._wait(held, policy.max_wait_seconds, gone)
        except asyncio.CancelledError:
            self.holding.give_back(gate, held)
            held.next_may_go.set()
            self.metrics.waited(key, "gone", self.clock() - held.arrived)
            raise
        waited = self.clock() - held.arrived
        if outcome == "served" and (released := held.released.result()) is not None:
            self.metrics.waited(key, "served", waited)
            upstream, before = released
            return Released(upstream, before, held.next_may_go)
        self.holding.give_back(gate, held)
        held.next_may_go.set()
        outcome = "refused" if outcome == "served" else outcome
        self.metrics.waited(key, outcome, waited)
        if outcome == "gone":
            return Refusal(GONE, "the client left", False)
        if outcome == "refused":
            message = "the activator holds as many requests as it may, most of them for your namespace or address"
            return Refusal(429, message + "; retry shortly", True)
        retry = max(1, int(min(policy.max_wait_seconds, RETRY_AFTER_S)))
        message = f"the service did not become ready within {policy.max_wait_seconds:g}s; retry later"
        return Refusal(503, message, retry)

    def passes_on_now(self, gate: Gate) -> bool:
        """A request of `gate` goes straight on: its route lingers, or a replica was just Ready."""
        return gate.lingering_until is not None or gate.ready_until > self.clock()

    def namespace_share(self, namespace: str) -> ReadBudget:
        return self.shares.get(namespace) or self.shares.setdefault(namespace, ReadBudget(self.tenant_read_bytes))

    @property
    def starved(self) -> bool:
        """A body was refused for want of budget and not even one more of the largest could be
        read now: no client can be served here until bodies end (readiness says so, and the
        operator sends the services' traffic to the other activator pods meanwhile)."""
        return self.read_refused and self.bodies.budget.free < self.bodies.max_body

    async def _wait(self, held: Held, max_wait: float, client_gone: Callable[[], Awaitable[None]] | None) -> str:
        """Until released (served), the client leaves (gone), or the wait is over (timeout)."""
        gone = asyncio.ensure_future(client_gone() if client_gone is not None else asyncio.Event().wait())
        remaining = held.arrived + max_wait - self.clock()
        try:
            waiting: set[asyncio.Future[Any]] = {held.released, gone}
            await asyncio.wait(waiting, timeout=max(remaining, 0.0), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await gone
        if held.released.done():
            return "served"  # or given back: the result says
        return "gone" if gone.done() and not gone.cancelled() else "timeout"

    async def forward(
        self,
        upstream: str,
        scope: Scope,
        body: Body,
        receive: Receive,
        send: Send,
        before: asyncio.Event | None = None,
        next_may_go: asyncio.Event | None = None,
    ) -> int:
        """The request to the service's ready replicas, after the one before it has been
        handed over; their answer streamed back."""
        try:
            if before is not None:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.config.connect_timeout_s + 5):
                        await before.wait()
            headers = [*request_headers(scope), (b"content-length", b"%d" % len(body.data))]
            url = httpx.URL(upstream).copy_with(raw_path=target(scope).encode("latin-1"))
            content = _written(body, next_may_go)
            request = self.client.build_request(scope["method"], url, headers=headers, content=content)
            response = await self._answer_head(request, receive)
        except ClientGone:
            return GONE
        except TimeoutError:
            message = f"the service did not begin its answer within {self.config.response_start_timeout_s:g}s"
            await answer(send, 504, error_body(504, message))
            return 504
        except httpx.TimeoutException:
            await answer(send, 504, error_body(504, "the service did not accept the request in time"))
            return 504
        except httpx.HTTPError:
            message = "the service is not answering (starting or stopping)"
            await answer(send, 503, error_body(503, message), retry_after=True)
            return 503
        finally:
            if next_may_go is not None:
                next_may_go.set()
            body.data = b""
        try:
            await stream(response, receive, send)
        finally:
            await response.aclose()
        return response.status_code

    async def _answer_head(self, request: httpx.Request, receive: Receive) -> httpx.Response:
        """The upstream's answer head, waited for at most `response_start_timeout_s` (then
        TimeoutError) and only while the client is there (else ClientGone): either way the
        upstream request is cancelled, its connection closed, and nothing waits on it."""
        sending = asyncio.ensure_future(self.client.send(request, stream=True))
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait(
                {sending, gone}, timeout=self.config.response_start_timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for task in (sending, gone):
                task.cancel()
            for task in (sending, gone):
                with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                    await task
        if sending.done() and not sending.cancelled():
            return sending.result()
        if gone.done() and not gone.cancelled():
            raise ClientGone()
        raise TimeoutError()

    # ------------------------------------------------------------------ waking and polling

    def wake(self, gate: Gate) -> None:
        """Ask the operator to start the service, if requests came since the last time (at most
        once per WAKE_INTERVAL_S) or they have waited REWAKE_S since."""
        now = self.clock()
        since = now - gate.last_wake
        if (gate.wake_wanted and since >= WAKE_INTERVAL_S) or since >= REWAKE_S:
            gate.last_wake, gate.wake_wanted = now, False
            self._spawn(self._patch_wake(gate.route))

    async def _patch_wake(self, route: Route) -> None:
        """The wake annotation on the InferenceService the route starts (`routes.wake_target`);
        counted under the route's own Service, as every other metric of it is."""
        key, target = route.key, route.wake_name
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        patch = {"metadata": {"annotations": {WAKE_ANNOTATION: stamp}}}
        try:
            await self.api.merge_patch(inference_service_path(key.namespace, target), patch)
        except (ApiError, httpx.HTTPError) as exc:
            log.warning("wake of %s/%s (for %s) failed: %s", key.namespace, target, key, exc)
            return
        self.metrics.wakes.labels(key.namespace, key.name).inc()
        log.info("woke %s/%s for %s (%s)", key.namespace, target, key, stamp)

    async def poll(self, gate: Gate) -> None:
        """While requests of the gate wait: its readiness path every POLL_S; on a 200, release.
        A wake is sent only once the replicas have not answered: requests that kube-proxy still
        sends here for a service already up go on without a write to the API server."""
        try:
            while gate.held:
                route = gate.route
                if await self.ready(route):
                    gate.ready_until = self.clock() + READY_REUSE_S
                    self.holding.release(gate, route.upstream)
                    break
                self.wake(gate)
                await asyncio.sleep(POLL_S)
        finally:
            gate.poller = None

    async def ready(self, route: Route) -> bool:
        """The readiness path answers 200 through S-private (its body is never read)."""
        url = httpx.URL(route.upstream).copy_with(raw_path=route.policy.ready_path.encode())
        timeout = httpx.Timeout(connect=0.5, read=1.0, write=1.0, pool=1.0)
        try:
            async with self.client.stream("GET", url, timeout=timeout) as response:
                return response.status_code == 200
        except httpx.HTTPError:
            return False

    # ------------------------------------------------------------------ routes

    async def watch_slices(self) -> None:
        """List the activator's slices, then watch from the list; list again on 410 or a broken
        stream, with backoff."""
        backoff = BACKOFF_S[0]
        params = {"labelSelector": SLICE_SELECTOR}
        while True:
            try:
                listing = await self.api.list(SLICES, params)
                version = str((listing.get("metadata") or {}).get("resourceVersion") or "")
                await self.replace_slices(listing.get("items") or [])
                self.synced = True
                backoff = BACKOFF_S[0]
                while True:
                    started = self.clock()
                    async for event in self.api.watch(SLICES, {**params, "resourceVersion": version}):
                        obj = event.get("object") or {}
                        version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                        if event.get("type") == "DELETED":
                            self.remove_slice(obj)
                        elif event.get("type") in ("ADDED", "MODIFIED"):
                            await self.apply_slice(obj)
                    if self.clock() - started < 1.0:  # ended at once: not a watch to spin on
                        await asyncio.sleep(1.0)
            except (ApiError, httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError) as exc:
                log.warning("EndpointSlices: %s; listing again in %.1fs", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_S[1])

    async def replace_slices(self, items: list[dict[str, Any]]) -> None:
        ids = {_slice_id(item) for item in items}
        for gone in [sid for sid in self.slices if sid not in ids]:
            self.remove_slice(self.slices[gone])
        for item in items:
            await self.apply_slice(item)

    async def apply_slice(self, slice_: dict[str, Any]) -> None:
        sid = _slice_id(slice_)
        self.slices[sid] = slice_
        await self.resolve(sid)

    async def resolve(self, sid: tuple[str, str]) -> None:
        """The route of slice `sid` from its namespace's Services; pending while they are missing."""
        slice_ = self.slices.get(sid)
        if slice_ is None:
            return
        try:
            key = slice_service(slice_)
            service = await self.api.get(service_path(key.namespace, key.name))
            private = await self.api.get(service_path(key.namespace, key.name + "-private"))
            route = route_for(slice_, service, private, self.caps, self.config.cluster_domain)
        except RouteRefused as exc:
            if sid not in self.pending:
                log.warning("%s: no route", exc)
            self.pending.add(sid)
            return
        except (ApiError, httpx.HTTPError, ValueError) as exc:
            log.warning("slice %s/%s: %s; trying again", *sid, exc)
            self.pending.add(sid)
            return
        if self.slices.get(sid) is not slice_:
            return  # changed or removed while the Services were read: its newer self decides
        self.pending.discard(sid)
        previous = self.slice_routes.get(sid)
        self.slice_routes[sid] = route.key
        if previous is not None and previous != route.key:
            self._unroute_if_unused(previous)
        gate = self.gates.get(route.key)
        if gate is None:
            self.gates[route.key] = Gate(route)
            self.metrics.routed(route.key)
            log.info("routing %s: %s -> %s", route.key, ", ".join(sorted(route.hosts)), route.upstream)
        else:
            gate.route, gate.lingering_until = route, None
        for other_key, other in self.gates.items():
            if other_key != route.key and other.lingering_until is not None and other.route.hosts & route.hosts:
                # A routed service wins a host over one that only lingers: a deleted Service's
                # ClusterIP goes to the next one created. Requests it holds keep their route.
                self.table.remove(other_key)
        self.table.set(route)

    def remove_slice(self, slice_: dict[str, Any]) -> None:
        sid = _slice_id(slice_)
        self.slices.pop(sid, None)
        self.pending.discard(sid)
        key = self.slice_routes.pop(sid, None)
        if key is not None:
            self._unroute_if_unused(key)

    def _unroute_if_unused(self, key: ServiceKey) -> None:
        """No slice routes `key` any more: it lingers (see the module doc), then is forgotten."""
        if key in self.slice_routes.values():
            return
        gate = self.gates.get(key)
        if gate is not None and gate.lingering_until is None:
            gate.lingering_until = self.clock() + self.config.linger_seconds
            log.info("route of %s removed: proxied directly for %.0fs", key, self.config.linger_seconds)

    async def housekeeping(self) -> None:
        """Slices whose Services were missing, tried again; lingering routes ended."""
        while True:
            await asyncio.sleep(HOUSEKEEPING_S)
            for sid in list(self.pending):
                await self.resolve(sid)
            self.end_lingering()

    def end_lingering(self) -> None:
        now = self.clock()
        for key, gate in list(self.gates.items()):
            if gate.lingering_until is not None and gate.lingering_until <= now and not gate.held:
                self.table.remove(key)
                del self.gates[key]
                self.metrics.forget(key)
                share = self.shares.get(key.namespace)
                if share is not None and share.free == share.total:
                    if all(other.namespace != key.namespace for other in self.gates):
                        del self.shares[key.namespace]
                log.info("route of %s forgotten", key)

    # ------------------------------------------------------------------ lifespan

    def _spawn(self, work: Awaitable[None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        background: list[asyncio.Task[None]] = []
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                background = [self._spawn(self.watch_slices()), self._spawn(self.housekeeping())]
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                for drain in self.before_shutdown:
                    await drain()
                for task in [*background, *self._tasks]:
                    task.cancel()
                await asyncio.gather(*background, *self._tasks, return_exceptions=True)
                if self._client is not None:
                    await self._client.aclose()
                await self.api.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return


def _slice_id(slice_: dict[str, Any]) -> tuple[str, str]:
    metadata = slice_.get("metadata") or {}
    return str(metadata.get("namespace") or ""), str(metadata.get("name") or "")


def _host(scope: Scope) -> str:
    for name, value in scope["headers"]:
        if name == b"host":
            host: str = value.decode("latin-1")
            return host[:255]
    return ""


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _written(body: Body, next_may_go: asyncio.Event | None) -> AsyncIterator[bytes]:
    """The body, written upstream once; then it is the upstream's to hold, and the read budget
    has it back (an answer may take minutes to begin: a stalled one must not keep it). The next
    held request goes when this one's answer has
    begun, or ORDER_GRACE_S after its body was next_may_go if the answer is slow to begin (a
    completion that is not streamed): the replica has then read this one first. Going at once
    was not enough: a replica reads a new connection's request only on the turn of its loop
    after accepting it, so one sent next on an open connection was read before it (1 in 3 runs)."""
    data, body.data = body.data, b""
    yield data
    del data
    body.release()
    if next_may_go is not None:
        asyncio.get_running_loop().call_later(ORDER_GRACE_S, next_may_go.set)


# ---------------------------------------------------------------------- process edge


class ActivatorServer(uvicorn.Server):
    """uvicorn with the activator's SIGTERM: unready at once, the listener open for
    `drain_listen_seconds`, then closed; uvicorn then waits for every request in progress
    (held ones end by their wait). The metrics port is a second listener that outlives that
    wait by `final_scrape_seconds`: the requests a draining activator still holds end after
    its listener closes, and a scrape must see how (a rollout in the middle of a cold start
    otherwise leaves no trace of its waits)."""

    def __init__(self, config: uvicorn.Config, activator: Activator, metrics: uvicorn.Config | None) -> None:
        super().__init__(config)
        self.activator = activator
        self.metrics = metrics
        self.grpc: GrpcPort | None = None
        self._delay: threading.Timer | None = None
        self._metrics_listener: asyncio.Server | None = None
        # Its own connections: uvicorn's shutdown closes and waits for the main listener's only.
        self._metrics_state = ServerState()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if self.metrics is not None:
            self._metrics_listener = await metrics_port.listen(self.metrics, self._metrics_state)
        await super().startup(sockets)
        settings = self.activator.config
        if settings.grpc_port and not self.should_exit:
            self.grpc = GrpcPort(self.activator, GrpcLimits.of(settings), settings.host, settings.grpc_port)
            await self.grpc.start()
            grace = settings.max_wait_seconds + 20  # every held call ends by its wait
            self.activator.before_shutdown.append(lambda: self._stop_grpc(grace))
        early = signals.take_received()
        if early is not None and not self.should_exit:
            self.handle_exit(early, None)

    async def _stop_grpc(self, grace_s: float) -> None:
        if self.grpc is not None:
            await self.grpc.stop(grace_s)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.grpc is not None:
            self.grpc.close_listener()  # with the HTTP listener; its calls end before the pollers stop
        await super().shutdown(sockets)
        listener, self._metrics_listener = self._metrics_listener, None
        if listener is None:
            return
        linger = self.activator.config.final_scrape_seconds
        if linger > 0 and not self.force_exit:
            log.info("every request answered; metrics answer %.1fs more, for the last scrape", linger)
            await asyncio.sleep(linger)
        listener.close()
        for connection in list(self._metrics_state.connections):
            connection.shutdown()
        await listener.wait_closed()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.activator.draining = True
        delay = self.activator.config.drain_listen_seconds
        if delay > 0 and self._delay is None and not self.should_exit:
            log.info("signal %d: not ready; the listener closes in %.1fs", sig, delay)
            self._delay = threading.Timer(delay, super().handle_exit, args=(sig, frame))
            self._delay.daemon = True
            self._delay.start()
            return
        log.info("signal %d: closing the listener; exiting once no request is held or in flight", sig)
        super().handle_exit(sig, frame)


def kube_api(config: ActivatorConfig) -> KubeApi:
    if not config.kube_api:
        return KubeApi.in_cluster()
    token = TokenFile(Path(config.kube_token_file)) if config.kube_token_file else None
    return KubeApi(config.kube_api, token, Path(config.kube_ca_file) if config.kube_ca_file else None)


def serve(config: ActivatorConfig) -> int:
    """Run until SIGTERM; 0 once every held and in-flight request has ended."""
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    largest, reading, held = config.limits()
    log.info(
        "activator on :%d (bodies up to %d bytes, %d being read at once, %d held at once)",
        config.port,
        largest,
        reading,
        held,
    )
    activator = Activator(config, kube_api(config))
    metrics = None
    if config.metrics_port:
        metrics = uvicorn.Config(
            metrics_port.MetricsExposition(activator.metrics.registry, max_age_s=EXPOSITION_MAX_AGE_S),
            host=config.host,
            port=config.metrics_port,
            log_config=None,
            access_log=False,
            lifespan="off",
            proxy_headers=False,
            timeout_keep_alive=config.keep_alive_timeout_s,
            http=LimitedHttpProtocol.with_limits(ConnectionLimits.of(config, frozenset({"/metrics"}))),
        )
    server = ActivatorServer(
        # Every held request ends by its wait; a stream still relayed then is cut off.
        server_config(activator, config, int(config.max_wait_seconds) + 20, activator.bodies.budget),
        activator,
        metrics,
    )
    signals.remember_stop_signals()
    server.run()
    return 0 if server.started else 1
