"""What the model server's reverse proxies share: the vLLM front (front.py) and the
scale-to-zero activator (activator/) each take a request's body whole under one memory budget,
pass it on with the same header rules, and relay the answer as it comes.

The header rules: a connection's own headers (hop-by-hop, and those its `Connection` header
names) never pass either way, nor do the client's claims of who it is: the proxy says who the
client is (the peer of the connection) in a X-Forwarded-For of its own. Errors are written in
OpenAI's shape, which is what the clients of both ports read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol, cast
from urllib.parse import urlsplit

import httptools
import httpx
import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .budgets import ReadBudget, read_body
from .errors import Busy, PayloadTooLarge
from .http_protocol import ConnectionLimits, LimitedHttpProtocol

log = logging.getLogger("bounded_http.proxy")

#: A connection's own headers (RFC 9110 7.6.1) and the proxy's, never passed on either way.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
    }
)
#: Who the client is, as only the proxy may tell the server behind it.
FORWARDED = frozenset({b"forwarded", b"x-forwarded-for", b"x-forwarded-host", b"x-forwarded-proto", b"x-real-ip"})
#: uvicorn writes its own.
RESPONSE_OWN = frozenset({b"date", b"server"})


def request_headers(scope: Scope) -> list[tuple[bytes, bytes]]:
    """The client's headers for the upstream: without hop-by-hop or forwarding ones, then who the
    client really is (the peer of this connection, whatever the client wrote)."""
    named = _connection_named(scope["headers"])
    headers = [
        (name, value)
        for name, value in scope["headers"]
        if name not in HOP_BY_HOP and name not in FORWARDED and name not in named
    ]
    client = scope.get("client")
    if client:
        headers.append((b"x-forwarded-for", client[0].encode("latin-1")))
    headers.append((b"x-forwarded-proto", scope.get("scheme", "http").encode("latin-1")))
    return headers


def response_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The upstream's answer headers for the client, the framing and connection ones left to this server."""
    pairs = list(headers)
    named = _connection_named(pairs)
    return [
        (name, value)
        for name, value in pairs
        if name not in HOP_BY_HOP and name not in RESPONSE_OWN and name not in named
    ]


def _connection_named(headers: Iterable[tuple[bytes, bytes]]) -> frozenset[bytes]:
    """Headers a `Connection` header names: hop-by-hop for that message too."""
    named: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            named.update(part.strip().lower() for part in value.split(b",") if part.strip())
    return frozenset(named)


def error_body(status: int, message: str) -> bytes:
    """OpenAI's error shape: what an OpenAI client expects from this port."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()


async def answer(send: Send, status: int, body: bytes, *, retry_after: bool | int = False) -> None:
    """A whole JSON answer; `retry_after` True (1 s) or the seconds to say."""
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if retry_after:
        headers.append((b"retry-after", b"%d" % max(1, int(retry_after))))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return max(int(value), 0)
            except ValueError:
                return None
    return None


def target(scope: Scope) -> str:
    """The path as the client wrote it (the upstream decodes it once, as it would have), and the query."""
    path: bytes = scope.get("raw_path") or scope["path"].encode()
    query: bytes = scope.get("query_string", b"")
    return (path + (b"?" + query if query else b"")).decode("latin-1")


class ClientGone(Exception):
    """The client left before its body was whole."""


async def chunks(receive: Receive) -> AsyncIterator[bytes]:
    """The request body as the server delivers it; `ClientGone` if the client leaves first."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


@dataclass
class Body:
    """A request's body, read whole, and its share of the read budget until `release`."""

    data: bytes
    _release: Callable[[], None] | None = field(default=None, repr=False)

    def release(self) -> None:
        """Give the budget back: once, when the upstream has the body or never will."""
        release, self._release = self._release, None
        if release is not None:
            release()


@dataclass
class BodyReader:
    """Bodies read whole under one budget (bodies.ReadBudget), each at most `max_body` bytes.
    Raises errors.PayloadTooLarge (before a byte is read if the declared length is over),
    errors.Busy (other bodies hold the budget longer than `wait_s`) or `ClientGone`."""

    max_body: int
    budget: ReadBudget
    wait_s: float

    async def read(self, scope: Scope, receive: Receive, share: ReadBudget | None = None) -> Body:
        """The body whole; with `share` (a tenant's part of the budget), its bytes are taken from
        both, so that one tenant's bodies never hold more than its share."""
        length = content_length(scope)
        if length is not None and length > self.max_body:
            raise PayloadTooLarge(f"request body of {length} bytes exceeds the limit of {self.max_body} bytes")
        claim = self.max_body if length is None else length
        budgets = [(budget, budget.open(claim)) for budget in (share, self.budget) if budget is not None]

        def close() -> None:
            for budget, reader in budgets:
                budget.close(reader)

        async def take(size: int) -> None:
            async with asyncio.timeout(self.wait_s):
                for budget, reader in budgets:
                    await budget.take(reader, size, self.wait_s)

        try:
            data = await read_body(chunks(receive), length, take)
        except PayloadTooLarge as exc:
            close()
            raise PayloadTooLarge(f"{exc} (limit {self.max_body} bytes)") from None
        except TimeoutError:
            close()
            raise Busy() from None
        except BaseException:
            close()
            raise
        return Body(bytes(data), close)


async def stream(response: httpx.Response, receive: Receive, send: Send) -> bool:
    """The upstream's answer, chunk by chunk as it arrives, until it ends or the client leaves;
    whether it was relayed to its end."""
    start: Message = {
        "type": "http.response.start",
        "status": response.status_code,
        "headers": response_headers(response.headers.raw),
    }

    async def pump() -> None:
        await send(start)
        async for chunk in response.aiter_raw():
            if chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def client_gone() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    relay, watch = asyncio.ensure_future(pump()), asyncio.ensure_future(client_gone())
    try:
        await asyncio.wait({relay, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (relay, watch):
            task.cancel()
        for task in (relay, watch):
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await task
    if relay.done() and not relay.cancelled() and relay.exception() is not None:
        log.warning("the upstream's answer broke off: %s", relay.exception())
        return False
    return relay.done() and not relay.cancelled()


# ---------------------------------------------------------------------- a lean upstream client

#: Of an answer, what is read from the upstream ahead of a client that has not taken it yet.
READ_AHEAD = 256 * 1024
#: An idle connection to the upstream is reused for this long, well within uvicorn's keep-alive
#: (5 s, vLLM's default): one the upstream may be closing is never written to.
IDLE_REUSE_S = 2.0


class UpstreamError(Exception):
    """The upstream could not be reached, or broke off before the end of its answer."""


class UpstreamTimeout(UpstreamError):
    """The upstream did not take the connection or the request in time."""


class UpstreamConnection(asyncio.Protocol):
    """One HTTP/1.1 connection to the upstream, its answers parsed by httptools (uvicorn's own
    parser, in C). A stream's events are relayed as the bytes arrive, not parsed into events:
    whatever one read holds is handed on as one piece, so a busy stream costs one wake-up per
    read rather than per chunk, and reading pauses while `READ_AHEAD` bytes wait for the client."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.complete = False
        self.keep_alive = False
        self._head: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pieces: list[bytes] = []
        self._buffered = 0
        self._error: UpstreamError | None = None
        self.head_only = False  # the answer to a HEAD: its head is all of it
        self._waiter: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None
        self._reading_paused = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's are not asyncio's classes)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._broken(UpstreamError(f"the upstream's answer is not HTTP: {exc}"))
            return
        if self._pieces or self.complete:
            self._wake()
        if self._buffered > READ_AHEAD and not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete:
            self._broken(UpstreamError(f"the upstream closed the connection: {exc or 'end of stream'}"))
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def pause_writing(self) -> None:
        self._drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
        self._drained = None

    # httptools' callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if self.head_only:
            self.complete, self.keep_alive = True, False
        if not self._head.done():
            self._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self.complete:
            return
        self._pieces.append(body)
        self._buffered += len(body)

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()

    # the relay's side

    def _broken(self, error: UpstreamError) -> None:
        if not self._head.done():
            self._head.set_exception(error)
            self._head.exception()  # retrieved: nobody may be waiting for it
        self._error = error
        self._wake()
        if self.transport is not None:
            self.transport.abort()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def write(self, head: bytes, body: bytes) -> None:
        assert self.transport is not None
        self.transport.write(head)
        if body:
            self.transport.write(body)

    async def drain(self) -> None:
        """Until the transport has (nearly) written what it holds."""
        if self._drained is not None:
            await self._drained

    async def head(self) -> None:
        """Until the answer's status and headers are in."""
        await self._head

    async def read(self) -> bytes:
        """What has arrived of the answer's body since the last read, at least one byte; b"" at its end."""
        while not self._pieces:
            if self.complete:
                return b""
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
            self._waiter = None
        pieces, self._pieces, self._buffered = self._pieces, [], 0
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed and not self._pieces

    def close(self) -> None:
        """Closed, the upstream's request with it (vLLM aborts a request whose client left)."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class Upstream:
    """Connections to one upstream on HTTP/1.1 (vLLM's API server on the pod's loopback), kept
    alive and reused one request at a time."""

    def __init__(self, url: str, *, connect_timeout_s: float, write_timeout_s: float, max_idle: int = 64) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.authority = parts.netloc.encode("latin-1")
        self.connect_timeout_s = connect_timeout_s
        self.write_timeout_s = write_timeout_s
        self.max_idle = max_idle
        self._idle: list[UpstreamConnection] = []

    async def _connection(self) -> UpstreamConnection:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            alive = connection.transport is not None and not connection.transport.is_closing()
            if alive and not connection.closed and now - connection.idle_since < IDLE_REUSE_S:
                connection._reset()
                return connection
            connection.close()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, protocol = await loop.create_connection(UpstreamConnection, self.host, self.port)
        except TimeoutError:
            raise UpstreamTimeout("the upstream did not take the connection in time") from None
        except OSError as exc:
            raise UpstreamError(f"the upstream is not answering: {exc}") from None
        return protocol

    async def send(
        self, method: str, target: str, headers: list[tuple[bytes, bytes]], body: Body
    ) -> UpstreamConnection:
        """The request written (its body handed over: the budget has it back once written); the
        connection to read the answer from, and to `release` after."""
        connection = await self._connection()
        lines = [
            b"%s %s HTTP/1.1\r\nhost: %s\r\n" % (method.encode("latin-1"), target.encode("latin-1"), self.authority)
        ]
        lines += [b"%s: %s\r\n" % pair for pair in headers]
        lines.append(b"content-length: %d\r\n\r\n" % len(body.data))
        data, body.data = body.data, b""
        connection.head_only = method == "HEAD"
        try:
            connection.write(b"".join(lines), data)
            del data
            async with asyncio.timeout(self.write_timeout_s):
                await connection.drain()
        except RuntimeError as exc:  # (uvloop's transport, closed meanwhile)
            connection.close()
            raise UpstreamError(f"the upstream closed the connection: {exc}") from None
        except TimeoutError:
            connection.close()
            raise UpstreamTimeout("the upstream did not take the request in time") from None
        finally:
            body.release()
        return connection

    def release(self, connection: UpstreamConnection) -> None:
        """An answer read to its end leaves its connection for the next request; any other is closed."""
        if connection.reusable() and len(self._idle) < self.max_idle:
            connection.idle_since = time.monotonic()
            self._idle.append(connection)
        else:
            connection.close()

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()


async def relay(connection: UpstreamConnection, receive: Receive, send: Send) -> bool:
    """The upstream's answer on `connection`, piece by piece as it arrives, until it ends or the
    client leaves; whether it was relayed to its end. An upstream that breaks off before its
    answer's head is a 503 to retry."""

    async def pump() -> None:
        try:
            await connection.head()
        except UpstreamError as exc:
            log.warning("the upstream broke off before answering: %s", exc)
            body = error_body(503, "the engine is not answering (starting or stopping)")
            await answer(send, 503, body, retry_after=True)
            return
        await send(
            {
                "type": "http.response.start",
                "status": connection.status,
                "headers": response_headers(connection.headers),
            }
        )
        while data := await connection.read():
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def client_gone() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    pumping, watch = asyncio.ensure_future(pump()), asyncio.ensure_future(client_gone())
    try:
        await asyncio.wait({pumping, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (pumping, watch):
            task.cancel()
        for task in (pumping, watch):
            with contextlib.suppress(asyncio.CancelledError, UpstreamError):
                await task
    if pumping.done() and not pumping.cancelled() and pumping.exception() is not None:
        log.warning("the upstream's answer broke off: %s", pumping.exception())
        return False
    return pumping.done() and not pumping.cancelled()


class ListenerConfig(Protocol):
    """What a proxy's listener is configured from (the front's and the activator's configs)."""

    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def log_level(self) -> str: ...
    @property
    def keep_alive_timeout_s(self) -> int: ...
    def connection_limits(self) -> ConnectionLimits: ...


def server_config(
    app: ASGIApp, config: ListenerConfig, graceful_seconds: int, budget: ReadBudget | None = None
) -> uvicorn.Config:
    """uvicorn for a proxy's port: the bounded protocol, no access log, and the connection's
    peer as the client (nobody in front of a proxy is trusted to say who the client is). Whole
    answers waiting for their clients are held in `budget`, the proxy's body budget."""
    return uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level=config.log_level,
        access_log=False,
        lifespan="on",
        proxy_headers=False,
        timeout_keep_alive=config.keep_alive_timeout_s,
        timeout_graceful_shutdown=graceful_seconds,
        http=LimitedHttpProtocol.with_limits(config.connection_limits(), budget),
    )
