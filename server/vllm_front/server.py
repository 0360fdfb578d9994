"""The front of a vLLM pod: a bounded reverse proxy on the port its Service targets.

vLLM's API server (uvicorn's httptools protocol under FastAPI) bounds neither connections,
header fields nor bodies: 300 connections of 10,000 header fields each grew it 219-347 MiB, and
1,000 uploads stalled after 300 KiB grew it 303-349 MiB. So vLLM listens on loopback only, and
this process is the pod's way in. It serves with the model server's connection limits
(bounded_http/http_protocol.py: header bytes and fields on every request of a connection, header, body and
write timeouts, a connection cap that closes idle connections first and keeps room for probes)
and reads each body under one budget (proxy.BodyReader) before vLLM sees a byte of it. The
answer streams back as vLLM writes it, its bytes relayed as each read brings them, never parsed
into events (proxy.Upstream: a stream's tokens pass at vLLM's pace for little CPU, which the pod
shares with vLLM); a client that goes away closes the upstream request, even before vLLM's answer
has begun, and vLLM stops generating for nobody.

Adapter management (vLLM's /v1/load_lora_adapter and kin) is refused here whoever asks: the
adapters sidecar manages adapters over loopback, straight to vLLM. So are vLLM's scale-out
control endpoints (/inference/..., an abort of any request), on where the router needs their
render twins. vLLM is told the real client
(X-Forwarded-For, replaced, never passed on), so its own guard (adapters_sidecar/guard.py) still sees a
remote client behind this proxy.

It runs in the model server's image as a native sidecar: it starts before vLLM and stops after
it, so a stream vLLM is still finishing at SIGTERM is carried to its end. A sidecar hears of the
pod's deletion only once vLLM has exited, so vLLM's preStop hook tells it first (DRAIN_PATH, from
the pod's loopback): each connection then closes after the answer it carries, and a client that
keeps its connection alive reconnects, to a replica that stays, before vLLM stops taking requests.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote

import httpx
import uvicorn
from starlette.types import Message, Receive, Scope, Send

from adapters_sidecar.guard import is_management
from bounded_http import limits, signals
from bounded_http.budgets import ReadBudget
from bounded_http.errors import Busy, PayloadTooLarge
from bounded_http.http_protocol import ConnectionLimits, LimitedHttpProtocol
from bounded_http.limits import detect_memory_limit
from bounded_http.proxy import (
    Body,
    BodyReader,
    ClientGone,
    Upstream,
    UpstreamError,
    UpstreamTimeout,
    answer,
    error_body,
    relay,
    request_headers,
    server_config,
    target,
)

log = logging.getLogger("vllm_front")

LIVE_PATH = "/health/live"
READY_PATH = "/health/ready"
#: vLLM's own health path: the readiness of the front is vLLM's.
ENGINE_HEALTH_PATH = "/health"
#: Asked by vLLM's preStop hook over the pod's loopback: the pod is going away.
DRAIN_PATH = "/front/drain"
#: Answered at the connection cap too (the kubelet probes the front and, through it, vLLM).
PROBE_PATHS = frozenset({LIVE_PATH, READY_PATH, ENGINE_HEALTH_PATH})
#: Of the front's memory limit, what bodies being read may hold at once.
BODY_BUDGET_SHARE = 3 / 8
MAX_BODY_CEILING = 64 * 1024 * 1024
#: How long a readiness answer from vLLM is reused: probes of three containers every few seconds.
READY_CACHE_S = 1.0
#: How long vLLM may take to read a request's body.
UPSTREAM_WRITE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class FrontConfig(limits.PortLimits):
    """What the front needs: where to listen, where vLLM is, and the limits (PortLimits)."""

    upstream: str
    host: str = "0.0.0.0"
    port: int = 8000
    drain_timeout_s: float = 30.0
    log_level: str = "info"

    def body_limits(self) -> tuple[int, int]:
        """(the largest body, the budget of bodies being read at once), from the memory limit."""
        memory = self.memory_limit_bytes or detect_memory_limit()
        budget = int(memory * BODY_BUDGET_SHARE)
        largest = self.max_body_bytes or min(MAX_BODY_CEILING, budget // 4)
        return largest, max(budget, largest)

    def connection_limits(self) -> ConnectionLimits:
        return ConnectionLimits.of(self, PROBE_PATHS)


# vLLM's scale-out endpoints (--enable-scale-out, on with routing.router: the router reads each
# prompt's tokens from /v1/completions/render and /v1/chat/completions/render) include token-level
# generation and /inference/v1/abort_requests, which ends any client's request by its id. The
# router needs neither: every path under /inference/, and any abort, is refused here.
SCALE_OUT_REFUSED = ("/inference/", "abort")


def is_scale_out_control(path: str) -> bool:
    lowered = path.lower()
    return any(word in lowered for word in SCALE_OUT_REFUSED)


def is_refused_path(path: str) -> bool:
    """Adapter management and vLLM's scale-out control, however the path is encoded (each layer
    of %-encoding undone)."""
    for _ in range(4):
        if is_management(path) or is_scale_out_control(path):
            return True
        decoded = unquote(path)
        if decoded == path:
            return False
        path = decoded
    return True  # encoded deeper than any client needs: refused rather than guessed at


def is_pod_local(scope: Scope) -> bool:
    """The peer is a process of this pod: a Service, another pod or the node never connect from loopback."""
    client = scope.get("client") or ("", 0)
    return client[0] in ("127.0.0.1", "::1")


def closing(send: Send) -> Send:
    """`send` with `connection: close` on the answer's head: the client's next request opens a
    connection of its own."""

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
        await send(message)

    return wrapped


class Front:
    """The ASGI app: probes, refusals, and every other request relayed to vLLM."""

    def __init__(self, config: FrontConfig, client: httpx.AsyncClient | None = None) -> None:
        self.config = config
        max_body, budget = config.body_limits()
        self.bodies = BodyReader(max_body, ReadBudget(budget), config.body_wait_s)
        self._client = client
        self.upstream = Upstream(
            config.upstream, connect_timeout_s=config.connect_timeout_s, write_timeout_s=UPSTREAM_WRITE_TIMEOUT_S
        )
        self._ready_at = -READY_CACHE_S
        self._ready = False
        self._checking: asyncio.Future[None] | None = None
        self.draining = False
        # Set by serve(): every connection closes after its answer under way or awaited...
        self.close_after_answers: Callable[[], None] = lambda: None
        # ... and the idle ones close now too.
        self.close_idle_connections: Callable[[], None] = lambda: None

    @property
    def client(self) -> httpx.AsyncClient:
        """vLLM's health, asked once a second (the relay has connections of its own: `upstream`)."""
        if self._client is None:
            timeout = httpx.Timeout(connect=self.config.connect_timeout_s, read=None, write=30.0, pool=30.0)
            self._client = httpx.AsyncClient(base_url=self.config.upstream, timeout=timeout)
        return self._client

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # websockets are not served here: vLLM's API is plain HTTP
        path = scope["path"]
        if self.draining:
            send = closing(send)
        if path == DRAIN_PATH:
            await self.drain(scope, send)
        elif path == LIVE_PATH:
            await answer(send, 200, b'{"status":"live"}')
        elif path == READY_PATH:
            ready = await self.engine_ready()
            await answer(send, 200 if ready else 503, b'{"ready":%s}' % (b"true" if ready else b"false"))
        elif path == ENGINE_HEALTH_PATH:  # vLLM's, answered from its last check: probes of every client
            if await self.engine_ready():
                await answer(send, 200, b"")
            else:
                await answer(send, 503, error_body(503, "the engine is not healthy"), retry_after=True)
        elif is_refused_path(scope.get("raw_path", b"").decode("latin-1")) or is_refused_path(path):
            message = "adapters are managed by the operator (spec.adapters); vLLM's scale-out control is not served"
            await answer(send, 403, error_body(403, message))
        else:
            await self.relay(scope, receive, send)

    async def drain(self, scope: Scope, send: Send) -> None:
        """The pod is being deleted (vLLM's preStop, before vLLM gets SIGTERM): every connection
        closes after its next answer, new ones after one; vLLM still serves. With `idle=close`
        (the hook's second call, shortly before vLLM stops), the connections idle now close too."""
        if not is_pod_local(scope):
            await answer(send, 403, error_body(403, "only the pod itself may drain its front"))
            return
        if not self.draining:  # (once draining, every `send` here already closes its connection)
            log.info("draining: connections close after their answers")
            self.draining = True
            send = closing(send)
            # Those under way too: kept alive, their clients' next requests would come here again.
            self.close_after_answers()
        if b"idle=close" in scope.get("query_string", b"").split(b"&"):
            log.info("draining: idle connections closed")
            self.close_idle_connections()
        await answer(send, 200, b'{"draining":true}')

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._client is not None:
                    await self._client.aclose()
                self.upstream.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def engine_ready(self) -> bool:
        """vLLM answers its health path: asked at most once a second, by one caller while the
        others wait for that answer (300 clients' /health relayed at once held it 2.4 s)."""
        if time.monotonic() - self._ready_at >= READY_CACHE_S and self._checking is None:
            self._checking = asyncio.ensure_future(self._check_engine())
        if self._checking is not None:
            await asyncio.shield(self._checking)
        return self._ready

    async def _check_engine(self) -> None:
        try:
            response = await self.client.get(ENGINE_HEALTH_PATH, timeout=1.0)
            self._ready = response.status_code == 200
        except httpx.HTTPError:
            self._ready = False
        finally:
            self._ready_at = time.monotonic()
            self._checking = None

    async def relay(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The request to vLLM once its body is whole; vLLM's answer back as it comes. No read
        timeout: a long completion writes nothing until it is done; the client's leaving (or this
        server's write timeout) is what ends a request that waits."""
        body: Body | None = None
        try:
            body = await self.bodies.read(scope, receive)
            connection = await self.upstream.send(scope["method"], target(scope), request_headers(scope), body)
        except PayloadTooLarge as exc:
            await answer(send, 413, error_body(413, str(exc)))
            return
        except Busy:
            await answer(send, 503, error_body(503, "too many request bodies arriving at once"), retry_after=True)
            return
        except ClientGone:
            return
        except UpstreamTimeout:
            await answer(send, 504, error_body(504, "the engine did not accept the request in time"))
            return
        except UpstreamError:
            await answer(
                send, 503, error_body(503, "the engine is not answering (starting or stopping)"), retry_after=True
            )
            return
        finally:
            if body is not None:
                body.release()
        try:
            await relay(connection, receive, send)
        finally:
            self.upstream.release(connection)


# ---------------------------------------------------------------------- process edge


HELP = {"upstream": "vLLM on loopback: http://127.0.0.1:PORT"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per field of FrontConfig, of the field's type."""
    limits.add_config_arguments(parser, FrontConfig, HELP)


def config_from_args(args: argparse.Namespace) -> FrontConfig:
    return limits.config_from_arguments(FrontConfig, args)


def close_after_answers(server: uvicorn.Server) -> None:
    """Every connection closes after its answer under way or awaited; idle ones stay open
    (LimitedHttpProtocol.close_after_answer)."""
    for connection in list(server.server_state.connections):
        if isinstance(connection, LimitedHttpProtocol):
            connection.close_after_answer()


def close_idle_connections(server: uvicorn.Server) -> None:
    """What uvicorn does to its connections at shutdown, with the listener left open: an idle one
    closes, a busy one after its answer, one awaiting its request after answering it
    (LimitedHttpProtocol.shutdown)."""
    for connection in list(server.server_state.connections):
        connection.shutdown()


def serve(config: FrontConfig) -> int:
    """Run until SIGTERM; 0 after the requests in flight are answered."""
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    largest, budget = config.body_limits()
    log.info("front on :%d for %s (bodies up to %d bytes, %d at once)", config.port, config.upstream, largest, budget)
    front = Front(config)
    server = uvicorn.Server(server_config(front, config, int(config.drain_timeout_s), front.bodies.budget))
    front.close_after_answers = lambda: close_after_answers(server)
    front.close_idle_connections = lambda: close_idle_connections(server)
    signals.remember_stop_signals()
    server.run()
    return 0 if server.started else 1
