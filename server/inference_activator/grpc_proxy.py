"""The activator's gRPC port (`--grpc-port`): calls of the Open Inference Protocol over gRPC
(h2c) for a service at zero, held as its HTTP requests are (server.py: the same pools, limits,
fairness and wake), then passed on to the replicas through S-private's `grpc` port, their
metadata and deadline with them, and the answer (message, status, trailing metadata) passed
back as it came.

The call's `:authority` names the service, as Host does over HTTP/1.1, with the same rules
(routes.py, and a short name several namespaces claim goes to the client's own). gRPC's Python
server does not show a handler the `:authority`, so the port is a TCP front: each connection
is spliced to a `grpc.aio` server on loopback, and the client's bytes are read frame by frame
(hyperframe) only until its first header block, whose `:authority` (hpack) is recorded for that
loopback connection before the block goes on; the server finds a call's service from its peer's
port. A gRPC channel names one authority, so every call of a connection goes to the service of
its first. The rest of the connection is relayed unread, at the transport level (a protocol per
side, no task per connection), each side's reading paused while the other's writes are.

Bounds, those of the model server's gRPC port (grpc_server.py): messages up to the largest HTTP
body, 100 streams per connection, `max_connections` calls at once, 4 connections per call slot,
the header block within `header_timeout_s` and `max_header_bytes`, idle connections closed after
`keep_alive_timeout_s`; a message is received only with the largest one reserved in a budget of
its own (GRPC_RECEIVE_SHARE of the memory limit), then counts against the held limits while it
waits. A call that waits past its service's maxWaitSeconds ends UNAVAILABLE; over the limits,
RESOURCE_EXHAUSTED; a client's deadline or cancellation ends its wait and gives its place back.
Calls go on to the replicas at most UPSTREAM_STREAMS at once per upstream, within the streams a
replica's connection takes, however many were held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import grpc
import hpack
from hyperframe.exceptions import HyperframeError
from hyperframe.frame import ContinuationFrame, Frame, HeadersFrame

from bounded_http.grpc_calls import (
    CONNECTIONS_PER_CALL_SLOT,
    LOOKAHEAD_BYTES,
    MAX_MESSAGE_BYTES,
    MAX_STREAMS_PER_CONNECTION,
    PROBE_RECEIVERS,
    PROBES,
    SERVICE,
    CallTable,
    MessageBudget,
    Refused,
    Reservation,
)
from bounded_http.limits import detect_memory_limit

from .config import ActivatorConfig
from .holding import Gate, Refusal, Released
from .routes import Route

log = logging.getLogger("inference_activator.grpc")

#: The calls passed on: the protocol's (KServe's and Triton's `inference.GRPCInferenceService`).
METHODS = ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer")
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#: Bytes a client may send before its first header block beyond the block itself: its SETTINGS,
#: WINDOW_UPDATE and PING frames.
PEEK_SLACK = 64 * 1024
#: Of the memory limit: messages being received at once (HTTP bodies have their own quarter).
GRPC_RECEIVE_SHARE = 1 / 8
#: Calls passed on at once over the one connection to a service's replicas; the rest wait their
#: turn here. A replica's connection takes a bounded number of streams at once (the model
#: server's MAX_STREAMS_PER_CONNECTION, as many HTTP/2 servers'), and gRPC's client core opens
#: streams past it when calls come together (the calls held at zero, released at once on a wake):
#: the replica refuses those (RST_STREAM REFUSED_STREAM, UNAVAILABLE to their clients). Half the
#: limit, because the replica counts a stream until its own call is done, after its answer left.
UPSTREAM_STREAMS = MAX_STREAMS_PER_CONNECTION // 2
#: Metadata the upstream call writes itself (or gRPC refuses from an application).
_NOT_PASSED = frozenset({"user-agent", "te", "content-type", "host", "x-forwarded-for"})
#: An activator's answer to a refused hold, as gRPC says it (413: a message no wait makes room for).
GRPC_STATUS_OF_HTTP = {
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
}


class Holder(Protocol):
    """What the port asks of the activator (server.Activator): routes, gates and the hold."""

    gates: dict[Any, Gate]

    async def route_of(self, host: str, client: str) -> Route | str: ...

    def passes_on_now(self, gate: Gate) -> bool: ...

    async def wait_held(
        self,
        gate: Gate,
        client: str,
        size: int,
        on_held: Callable[[], None],
        gone: Callable[[], Awaitable[None]] | None = None,
    ) -> Released | Refusal: ...


@dataclass(frozen=True)
class GrpcLimits:
    """The port's bounds, from the activator's flags."""

    max_message_bytes: int
    max_answer_bytes: int
    receive_budget_bytes: int
    max_connections: int
    header_timeout_s: float
    body_timeout_s: float
    body_wait_s: float
    keep_alive_timeout_s: int
    max_header_bytes: int
    connect_timeout_s: float

    @classmethod
    def of(cls, config: ActivatorConfig) -> GrpcLimits:
        """The HTTP port's bounds; messages being received in a budget of their own, answers up to
        the bytes of bodies being read at once."""
        memory = config.memory_limit_bytes or detect_memory_limit()
        largest, reading, _ = config.limits()
        return cls(
            max_message_bytes=largest,
            max_answer_bytes=reading,
            receive_budget_bytes=max(largest, int(memory * GRPC_RECEIVE_SHARE)),
            max_connections=config.max_connections,
            header_timeout_s=config.header_timeout_s,
            body_timeout_s=config.body_timeout_s,
            body_wait_s=config.body_wait_s,
            keep_alive_timeout_s=config.keep_alive_timeout_s,
            max_header_bytes=config.max_header_bytes,
            connect_timeout_s=config.connect_timeout_s,
        )

    def server_options(self) -> list[tuple[str, int]]:
        """The loopback server's options: the model server's gRPC port's (grpc_server.server_options)."""
        return [
            ("grpc.max_receive_message_length", min(MAX_MESSAGE_BYTES, self.max_message_bytes)),
            ("grpc.http2.bdp_probe", 0),
            ("grpc.http2.lookahead_bytes", LOOKAHEAD_BYTES),
            ("grpc.max_send_message_length", min(MAX_MESSAGE_BYTES, self.max_answer_bytes)),
            ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
            ("grpc.max_allowed_incoming_connections", self.connections),
            ("grpc.server_handshake_timeout_ms", int(self.header_timeout_s * 1000)),
            ("grpc.max_connection_idle_ms", self.keep_alive_timeout_s * 1000),
            ("grpc.max_metadata_size", self.max_header_bytes),
            ("grpc.absolute_max_metadata_size", self.max_header_bytes),
            ("grpc.so_reuseport", 0),
        ]

    def channel_options(self) -> list[tuple[str, int]]:
        """The upstream channels': the same messages both ways, no retries of their own."""
        return [
            ("grpc.max_send_message_length", min(MAX_MESSAGE_BYTES, self.max_message_bytes)),
            ("grpc.max_receive_message_length", min(MAX_MESSAGE_BYTES, self.max_answer_bytes)),
            ("grpc.enable_retries", 0),
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", 2000),
        ]

    @property
    def connections(self) -> int:
        return CONNECTIONS_PER_CALL_SLOT * self.max_connections


class UnreadAnswers:
    """Answers handed to the loopback server and not yet written to their client: gRPC reports a
    call done only once its answer has left (or the call has ended), and a client that never
    opens its flow-control window leaves it in the server's memory. They are counted here, at
    most `total` bytes, a connection (a loopback peer: one client connection) at most `share`
    of them; an answer that does not fit is refused, so memory is bounded by the budget, not by
    calls times an answer's size."""

    def __init__(self, total: int, shares: int = 4) -> None:
        self.total = total
        self.share = total // shares
        self.held: dict[str, int] = {}
        self.in_use = 0

    def hold(self, peer: str, size: int) -> Callable[[object], None] | None:
        """Count `size` bytes of `peer`'s answer; the callback that gives them back, or None if
        they do not fit."""
        held = self.held.get(peer, 0)
        if held + size > self.share or self.in_use + size > self.total:
            return None
        self.held[peer] = held + size
        self.in_use += size

        def release(_: object) -> None:
            left = self.held.pop(peer) - size
            if left:
                self.held[peer] = left
            self.in_use -= size

        return release


class NotHttp2(ValueError):
    """A connection that did not begin as gRPC's does (the preface, then frames)."""


def scan(buffer: bytes | bytearray, after_preface: bool, max_header_bytes: int) -> tuple[int, str | None]:
    """How many bytes at the start of what a client sent (`buffer`, the preface first unless
    `after_preface`) may go on before its first header block is whole, and that block's
    `:authority` (or `host`) once it is: then the count runs to the block's end. NotHttp2 for
    anything else than the preface and frames."""
    offset = 0 if after_preface else _preface_end(buffer)
    if offset is None:
        return 0, None
    block, start, end, in_block = b"", offset, offset, False
    while end + 9 <= len(buffer):
        try:
            frame, length = Frame.parse_frame_header(memoryview(bytes(buffer[end : end + 9])))
        except HyperframeError as exc:
            raise NotHttp2(f"a frame that is not one: {exc}") from None
        if end + 9 + length > len(buffer):
            break
        payload = memoryview(bytes(buffer[end + 9 : end + 9 + length]))
        end += 9 + length
        if not in_block and not isinstance(frame, HeadersFrame):
            if isinstance(frame, ContinuationFrame):
                raise NotHttp2("a CONTINUATION frame without its HEADERS")
            start = end  # a frame before the block: it may go on
            continue
        if in_block and not isinstance(frame, ContinuationFrame):
            raise NotHttp2("a header block interrupted")
        in_block = True
        assert isinstance(frame, (HeadersFrame, ContinuationFrame))
        try:
            frame.parse_body(payload)
        except HyperframeError as exc:
            raise NotHttp2(f"a header frame that is not one: {exc}") from None
        block += frame.data
        if len(block) > max_header_bytes:
            raise NotHttp2("a first header block larger than the metadata limit")
        if "END_HEADERS" in frame.flags:
            return end, _authority(block, max_header_bytes)
    return start, None


def _preface_end(buffer: bytes | bytearray) -> int | None:
    """Where the connection preface ends in `buffer`, None while it is not whole yet;
    NotHttp2 when `buffer` does not begin with it."""
    if len(buffer) < len(PREFACE):
        if not PREFACE.startswith(bytes(buffer)):
            raise NotHttp2("not the HTTP/2 connection preface")
        return None
    if bytes(buffer[: len(PREFACE)]) != PREFACE:
        raise NotHttp2("not the HTTP/2 connection preface")
    return len(PREFACE)


def _authority(block: bytes, max_header_bytes: int) -> str:
    """The `:authority` (or `host`) of a whole header block, "" when it names neither."""
    try:
        headers = hpack.Decoder(max_header_list_size=max_header_bytes).decode(block, raw=True)
    except hpack.HPACKError as exc:
        raise NotHttp2(f"a header block that does not decode: {exc}") from None
    found = {bytes(name): bytes(value) for name, value in headers}
    authority = found.get(b":authority") or found.get(b"host") or b""
    return authority.decode("latin-1")[:255]


@dataclass
class Peer:
    """A client connection as the loopback server sees it: who the client is, which service."""

    client: str
    authority: str = ""


@dataclass
class GrpcPort:
    """The front listener, the loopback gRPC server behind it, and the upstream channels."""

    holder: Holder
    limits: GrpcLimits
    host: str
    port: int
    peers: dict[int, Peer] = field(default_factory=dict)  # by the loopback connection's port
    channels: dict[str, grpc.aio.Channel] = field(default_factory=dict)
    streams: dict[str, asyncio.Semaphore] = field(default_factory=dict)  # by upstream, as channels
    _server: grpc.aio.Server | None = None
    _listener: asyncio.Server | None = None
    inner_port: int = 0
    connections: set[_Front] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.calls = CallTable(self.limits.max_connections)
        self.unread = UnreadAnswers(self.limits.receive_budget_bytes)
        self.probe_receivers = CallTable(PROBE_RECEIVERS, probe_slots=0)
        self.messages = MessageBudget(
            self.limits.receive_budget_bytes, self.limits.max_message_bytes, self.limits.body_wait_s
        )

    async def start(self) -> int:
        """Listen on `port` (0: a free one); the port bound."""
        server = grpc.aio.server(options=self.limits.server_options())
        handlers: dict[str, grpc.RpcMethodHandler[bytes, bytes]] = {
            name: grpc.stream_unary_rpc_method_handler(self._method(f"/{SERVICE}/{name}", name in PROBES))
            for name in METHODS
        }
        server.add_registered_method_handlers(SERVICE, handlers)
        self.inner_port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self._server = server
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(lambda: _Front(self), self.host, self.port)
        self.port = self._listener.sockets[0].getsockname()[1]
        log.info("gRPC on :%d", self.port)
        return self.port

    def close_listener(self) -> None:
        """No new connections (SIGTERM, when the HTTP listener closes); calls in progress go on."""
        if self._listener is not None:
            self._listener.close()

    async def stop(self, grace_s: float) -> None:
        """Calls in progress get `grace_s` to end (held ones end by their wait); then all is closed."""
        self.close_listener()
        if self._server is not None:
            await self._server.stop(grace_s)
        for connection in list(self.connections):
            connection.close()
        for channel in self.channels.values():
            await channel.close()
        self.channels.clear()
        self.streams.clear()

    # ------------------------------------------------------------------ the front

    # ------------------------------------------------------------------ the calls

    def _method(
        self, method: str, probe: bool
    ) -> Callable[[AsyncIterator[bytes], grpc.aio.ServicerContext[bytes, bytes]], Awaitable[bytes]]:
        async def call(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
            outcome = await self._serve(method, probe, context)
            if isinstance(outcome, _Failure):
                if outcome.trailing:
                    context.set_trailing_metadata(outcome.trailing)
                await context.abort(outcome.code, outcome.details)
                raise AssertionError("abort raises")
            return outcome

        return call

    async def _serve(
        self, method: str, probe: bool, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> bytes | _Failure:
        peer = self.peers.get(_peer_port(context.peer()))
        if peer is None:
            return _Failure(grpc.StatusCode.UNAVAILABLE, "the call's connection is gone")
        found = await self.holder.route_of(peer.authority, peer.client)
        if isinstance(found, str):
            return _Failure(grpc.StatusCode.NOT_FOUND, found)
        upstream = found.grpc_upstream
        if upstream is None:
            message = f"service {found.key} has no port named grpc on {found.key.name}-private"
            return _Failure(grpc.StatusCode.UNIMPLEMENTED, message)
        try:
            entry = self.calls.enter(probe)
        except Refused as exc:
            return _Failure(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        reservation: Reservation | None = None
        try:
            if probe:
                raw = await self._receive_probe(context)
            else:
                reservation = await self.messages.reserve()
                raw = await self._receive(context)
                reservation.keep(len(raw))
            entry.waiting = False
            gate = self.holder.gates.get(found.key)
            if gate is None:
                return _Failure(grpc.StatusCode.UNAVAILABLE, f"service {found.key} is no longer routed here")
            if not self.holder.passes_on_now(gate):
                on_held = reservation.release if reservation is not None else _nothing
                waited = await self.holder.wait_held(gate, peer.client, len(raw), on_held)
                if isinstance(waited, Refusal):
                    code = GRPC_STATUS_OF_HTTP.get(waited.status, grpc.StatusCode.UNAVAILABLE)
                    return _Failure(code, waited.message)
                upstream = gate.route.grpc_upstream or upstream
                waited.next_may_go.set()  # calls need no order among themselves: the next goes now
            return await self._forward(upstream, method, raw, peer.client, context)
        except Refused as exc:
            return _Failure(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except _Ended as exc:
            return exc.failure
        finally:
            self.calls.leave(entry)
            if reservation is not None:
                reservation.release()

    async def _receive_probe(self, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        """A probe's message (empty, or a model's name), beside the budget: at PROBE_RECEIVERS,
        the newcomer ends the probe receiving longest, as the model server's port does."""
        receiver = self.probe_receivers.enter(probe=False)
        try:
            return await self._receive(context)
        finally:
            self.probe_receivers.leave(receiver)

    async def _receive(self, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        timeout = self.limits.body_timeout_s
        try:
            async with asyncio.timeout(timeout):
                raw = await context.read()
        except TimeoutError:
            message = f"the request message did not arrive within {timeout:g} s"
            raise _Ended(grpc.StatusCode.DEADLINE_EXCEEDED, message) from None
        if not isinstance(raw, bytes):  # grpc.aio.EOF
            raise _Ended(grpc.StatusCode.INVALID_ARGUMENT, "the call ended without its request message")
        return raw

    async def _forward(
        self, upstream: str, method: str, raw: bytes, client: str, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> bytes | _Failure:
        """The call to the replicas with the client's metadata and what is left of its deadline;
        their answer, status and trailing metadata as they came."""
        channel = self._channel(upstream)
        streams = self.streams.setdefault(upstream, asyncio.Semaphore(UPSTREAM_STREAMS))
        metadata = _passed_metadata(context.invocation_metadata() or (), client)
        async with streams:  # a client's deadline or cancellation ends this wait too
            timeout = _timeout(context.time_remaining())
            multi: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(method)
            call = multi(raw, metadata=metadata, timeout=timeout, wait_for_ready=False)
            try:
                answer = await call
            except grpc.aio.AioRpcError as exc:
                return _Failure(exc.code(), exc.details() or "", tuple(exc.trailing_metadata() or ()))
            except asyncio.CancelledError:
                call.cancel()
                raise
            initial = await call.initial_metadata()
            trailing = await call.trailing_metadata()
        if initial:
            await context.send_initial_metadata(tuple(initial))
        if trailing:
            context.set_trailing_metadata(tuple(trailing))
        assert isinstance(answer, bytes)
        release = self.unread.hold(context.peer(), len(answer))
        if release is None:
            return _Failure(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"answers not yet read by their clients hold the activator's {self.unread.total >> 20} MiB for them "
                f"(a connection at most {self.unread.share >> 20} MiB); read them, then call again",
            )
        context.add_done_callback(cast(Any, release))  # the stubs type the callback as a class of theirs
        return answer

    def _channel(self, upstream: str) -> grpc.aio.Channel:
        """The channel to `upstream`, opened on its first call and kept."""
        channel = self.channels.get(upstream)
        if channel is None:
            channel = self.channels[upstream] = grpc.aio.insecure_channel(
                upstream, options=self.limits.channel_options()
            )
        return channel


def _passed_metadata(invocation: Iterable[tuple[str, Any]], client: str) -> list[tuple[str, Any]]:
    """The client's metadata the replicas may see (no pseudo-headers, no `grpc-` keys, none
    of `_NOT_PASSED`), and the client's address as `x-forwarded-for`."""
    metadata = [
        (key, value)
        for key, value in invocation
        if key not in _NOT_PASSED and not key.startswith(":") and not key.startswith("grpc-")
    ]
    metadata.append(("x-forwarded-for", client))
    return metadata


def _timeout(remaining: float | None) -> float | None:
    """What is left of the client's deadline as the upstream call's timeout; None when there
    is none or it lies beyond 10**8 s."""
    return remaining if remaining is not None and remaining < 10**8 else None


@dataclass(frozen=True)
class _Failure:
    code: grpc.StatusCode
    details: str
    trailing: tuple[Any, ...] = ()


class _Ended(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.failure = _Failure(code, details)


def _nothing() -> None:
    return None


def _peer_port(peer: str) -> int:
    """`ipv4:127.0.0.1:54321` -> 54321 (0 if it is not such)."""
    with contextlib.suppress(ValueError):
        return int(peer.rsplit(":", 1)[1])
    return 0


class _Front(asyncio.Protocol):
    """One client connection: its first bytes kept until its first header block is whole (its
    authority recorded), then every byte relayed to its loopback connection as it comes, and
    back; each side's reading paused while the other's writing is."""

    def __init__(self, port: GrpcPort) -> None:
        self.port = port
        self.client = ""
        self.transport: asyncio.Transport | None = None
        self.inner: asyncio.Transport | None = None
        self.key = 0
        self.pending = bytearray()
        self.after_preface = False
        self.authority: str | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        if len(self.port.connections) >= self.port.limits.connections:
            transport.abort()  # as gRPC refuses past max_allowed_incoming_connections
            self.closed = True
            return
        self.port.connections.add(self)
        peername = transport.get_extra_info("peername")
        self.client = str(peername[0]) if peername else ""
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.port.limits.header_timeout_s, self.close)
        connecting = loop.create_connection(lambda: _Back(self), "127.0.0.1", self.port.inner_port)
        asyncio.ensure_future(connecting).add_done_callback(self._connected)

    def _connected(self, done: asyncio.Future[tuple[asyncio.Transport, _Back]]) -> None:
        if done.cancelled() or done.exception() is not None:
            self.close()
            return
        inner, _ = done.result()
        if self.closed:
            inner.abort()
            return
        self.inner = inner
        self.key = int(inner.get_extra_info("sockname")[1])
        self.port.peers[self.key] = Peer(self.client)
        self._forward()

    def data_received(self, data: bytes) -> None:
        if self.authority is not None and self.inner is not None:
            self.inner.write(data)
            return
        self.pending += data
        if len(self.pending) > self.port.limits.max_header_bytes + PEEK_SLACK:
            self.close()  # no header block within the bytes a client may send before one
            return
        self._forward()

    def _forward(self) -> None:
        """What may go on of the bytes kept; the authority recorded before its block goes."""
        if self.inner is None or self.authority is not None:
            return
        try:
            count, authority = scan(self.pending, self.after_preface, self.port.limits.max_header_bytes)
        except NotHttp2 as exc:
            log.debug("gRPC connection from %s closed: %s", self.client, exc)
            self.close()
            return
        if count:
            self.after_preface = True
        if authority is not None:
            self.authority = self.port.peers[self.key].authority = authority
            if self.timer is not None:
                self.timer.cancel()
        self.inner.write(bytes(self.pending[:count]))
        del self.pending[:count]
        if authority is not None:
            self.inner.write(bytes(self.pending))
            self.pending = bytearray()

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_reading()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.port.connections.discard(self)
        self.port.peers.pop(self.key, None)
        if self.timer is not None:
            self.timer.cancel()
        for transport in (self.transport, self.inner):
            if transport is not None:
                transport.abort()


class _Back(asyncio.Protocol):
    """The loopback connection of a `_Front`: the gRPC server's bytes back to the client."""

    def __init__(self, front: _Front) -> None:
        self.front = front

    def data_received(self, data: bytes) -> None:
        if self.front.transport is not None:
            self.front.transport.write(data)

    def pause_writing(self) -> None:
        if self.front.transport is not None:
            self.front.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.front.transport is not None:
            self.front.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.front.close()
