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
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

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


async def handed_over(body: Body) -> AsyncIterator[bytes]:
    """The body, written upstream once; then it is the upstream's to hold, and the budget has it
    back (a non-streamed completion answers minutes later: its bytes here are long gone by then)."""
    chunk = [body.data]
    body.data = b""
    yield chunk.pop()
    body.release()


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
