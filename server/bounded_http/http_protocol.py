"""Connection limits uvicorn does not have: time for a request's headers and body,
a cap on header bytes and on open connections.

uvicorn closes idle keep-alive connections, but a connection that never sends, or
sends its headers (or body) a byte at a time, holds a socket and a file descriptor
for as long as the client likes; `limit_concurrency` answers 503 only to requests
whose headers are complete. This subclass of uvicorn's httptools protocol arms
timers on the loop (no task per connection) and answers like an HTTP server would:
408 when headers or body take too long, 431 for headers that are too large, 503
when no connection can make room, each followed by closing the connection.

At the connection cap a new connection makes room (`ConnectionTable`): the connection
idle longest between requests is closed first, then one still waiting for its request's
head, taken from the client holding the most of those. Only when every connection has a
request in flight is there none to close: then a few connections beyond the cap may ask
the probe paths alone (the kubelet's liveness and readiness), and anything else gets the
503. 1,024 idle keep-alive connections from one client made every new connection a 503,
the kubelet's probes included, and the pod was restarted.

Header bytes are counted twice, both per request: as they arrive (a head split over
many reads is refused before the parser has gathered it all), and as the parser hands
out the request line and each field (one read may hold the end of one request and the
whole head of the next: a kept-alive connection's second request was not counted at
all, and 300 connections of 10,000 fields each took 97 -> 294 MiB).

Answers are bounded too (`AnswerBudget`): an answer written whole and larger than a socket
takes at once holds its bytes from when it is encoded until the transport's buffer has drained
(or the connection is gone), in the process's request-body budget and within its client's
share of it. One that cannot be held is answered 503 with Retry-After instead, and a client
holding its whole share gets 503 for its next request at once; probes are never refused. A
client that leaves an answer unread is dropped after `write_timeout_s`, and its bytes come back.
Without this, the bound was the connection cap times an answer's size: clients that never read
a large answer took a server past its memory limit. Streamed answers (more to come) are not
held: each part waits for the client to drain the last (uvicorn's flow control), so a
connection holds at most one part.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar

from starlette.types import Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .budgets import CLIENT_GONE, AnswerBudget, ReadBudget

log = logging.getLogger(__name__)

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}
#: Header fields one request may have (Apache's LimitRequestFields). Each is a pair of Python
#: objects until the request ends: 1,000 connections of 60 KB of tiny headers took 1 GiB.
MAX_HEADER_FIELDS = 100
_END = b"\r\n\r\n"
_SLICE = 4 * 1024
#: Requests parsed and waiting behind the one being answered on a connection; the rest of
#: what the client sent stays unparsed until they are answered.
MAX_PIPELINED = 16
_CORK: int | None = getattr(socket, "TCP_CORK", None)  # Linux's
#: Answers up to this size are not held in the budget: a socket's buffer takes most of one at
#: once, and the connection cap bounds what the rest can add up to.
SMALL_ANSWER = 64 * 1024
#: The answer budget of a listener whose process has no request-body budget to share.
OWN_ANSWER_BUDGET = 64 << 20


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float
    body_timeout_s: float
    max_header_bytes: int
    max_connections: int
    #: Paths answered on the few connections beyond the cap (see the module doc).
    probe_paths: frozenset[str] = frozenset()
    #: How long an answer may wait for a client that does not drain it (its buffer full).
    write_timeout_s: float = 30.0

    @property
    def probe_slots(self) -> int:
        return max(4, self.max_connections // 32)

    @classmethod
    def of(cls, settings: ConnectionSettings, probe_paths: frozenset[str]) -> ConnectionLimits:
        """The limits a process's settings name (the model server's, the front's: the same fields)."""
        return cls(
            header_timeout_s=settings.header_timeout_s,
            body_timeout_s=settings.body_timeout_s,
            max_header_bytes=settings.max_header_bytes,
            max_connections=settings.max_connections,
            probe_paths=probe_paths,
            write_timeout_s=settings.write_timeout_s,
        )


class ConnectionSettings(Protocol):
    """What ConnectionLimits.of reads from a process's settings."""

    @property
    def header_timeout_s(self) -> float: ...
    @property
    def body_timeout_s(self) -> float: ...
    @property
    def max_header_bytes(self) -> int: ...
    @property
    def max_connections(self) -> int: ...
    @property
    def write_timeout_s(self) -> float: ...


C = TypeVar("C", bound=Hashable)
State = Literal["waiting", "busy", "idle"]
Admission = Literal["open", "probes only", "refused"]


@dataclass
class ConnectionTable(Generic[C]):
    """One listener's connections by what they are doing, and by client, to choose which to
    close when a new one comes at the cap. Every change is O(1); choosing a waiting one to
    close looks at each client once. `C` is a connection (the protocol), `peer` its client."""

    max_connections: int
    probe_slots: int
    states: dict[C, State] = field(default_factory=dict)
    peers: dict[C, str] = field(default_factory=dict)
    probes: dict[C, None] = field(default_factory=dict)  # beyond the cap: probe paths only
    idle: dict[C, None] = field(default_factory=dict)  # the others, longest idle first
    waiting: dict[str, dict[C, None]] = field(default_factory=dict)  # the others, by client, oldest first

    def admit(self, connection: C, peer: str) -> tuple[Admission, C | None]:
        """Take `connection` in, and which connection to close for it, if any."""
        victim: C | None = None
        if len(self.states) - len(self.probes) >= self.max_connections:
            victim = next(iter(self.idle), None)
            if victim is None:
                victim = _oldest_waiting(self.waiting)
            if victim is None:
                return self._admit_probe(connection, peer)
            self.remove(victim)
        self.peers[connection] = peer
        self.set(connection, "waiting")
        return "open", victim

    def set(self, connection: C, state: State) -> None:
        """`connection` is now `state` (nothing if it has left the table)."""
        if connection not in self.peers:
            return
        self._unindex(connection)
        self.states[connection] = state
        if connection in self.probes:
            return
        if state == "idle":
            self.idle[connection] = None
        elif state == "waiting":
            self.waiting.setdefault(self.peers[connection], {})[connection] = None

    def remove(self, connection: C) -> None:
        self._unindex(connection)
        self.states.pop(connection, None)
        self.probes.pop(connection, None)
        self.peers.pop(connection, None)

    def _admit_probe(self, connection: C, peer: str) -> tuple[Admission, C | None]:
        victim: C | None = None
        if len(self.probes) >= self.probe_slots:
            waiting: dict[str, dict[C, None]] = {}
            for probe in self.probes:  # at most probe_slots of them
                if self.states[probe] != "busy":
                    waiting.setdefault(self.peers[probe], {})[probe] = None
            victim = _oldest_waiting(waiting)
            if victim is None:
                return "refused", None
            self.remove(victim)
        self.probes[connection] = None
        self.peers[connection] = peer
        self.states[connection] = "waiting"
        return "probes only", victim

    def _unindex(self, connection: C) -> None:
        state = self.states.get(connection)
        if connection in self.probes or state is None:
            return
        if state == "idle":
            del self.idle[connection]
        elif state == "waiting":
            peer = self.peers[connection]
            of_peer = self.waiting[peer]
            del of_peer[connection]
            if not of_peer:
                del self.waiting[peer]


def _oldest_waiting(waiting: dict[str, dict[C, None]]) -> C | None:
    """The oldest waiting connection of the client with the most waiting connections."""
    if not waiting:
        return None
    busiest: dict[C, None] = max(waiting.values(), key=len)
    return next(iter(busiest))


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with `ConnectionLimits` (see the module doc)."""

    limits: ConnectionLimits
    table: ConnectionTable[LimitedHttpProtocol]
    answers: AnswerBudget

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._probes_only = False  # beyond the cap: only a probe path is answered
        self._head_started = False  # a request's head has begun and is not complete
        self._timer: asyncio.TimerHandle | None = None
        self._awaiting_headers = True  # the bytes that come next are a request's head
        self._header_bytes = 0  # of the head being received, counted as it arrives
        self._tail = b""  # the last bytes of the head so far: its end may span two reads
        self._parsed_bytes = 0  # of the head being parsed, counted as the parser hands it out
        self._parsed_fields = 0
        self._refused = False  # answered and closing: whatever the parser still has is dropped
        self._unparsed = b""  # read, not parsed from `_unparsed_at` on: MAX_PIPELINED requests are waiting
        self._unparsed_at = 0
        self._owed_refusal: tuple[int, str, bool] | None = None  # to send once earlier answers are out
        self._write_timer: asyncio.TimerHandle | None = None  # armed while the client reads nothing
        self._close_after_answer = False  # awaiting its request when told to close (`shutdown`, `close_after_answer`)
        self._unsent = 0  # bytes of answers held, written and not yet drained
        self._app = self.app
        self.app = self._app_ending_with_the_connection

    @classmethod
    def with_limits(cls, limits: ConnectionLimits, budget: ReadBudget | None = None) -> type[LimitedHttpProtocol]:
        """The class to hand to `uvicorn.Config(http=...)`: one per listener, with its table.
        Its answers are held in `budget`, the process's request-body budget (the same object for
        every listener of the process), or in one of their own without it."""
        table: ConnectionTable[LimitedHttpProtocol] = ConnectionTable(limits.max_connections, limits.probe_slots)
        answers = AnswerBudget(budget if budget is not None else ReadBudget(OWN_ANSWER_BUDGET))
        return type(cls.__name__, (cls,), {"limits": limits, "table": table, "answers": answers})

    # ------------------------------------------------------------------ connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        admission, victim = self.table.admit(self, self.client[0] if self.client else "")
        if victim is not None:
            victim._make_room()
        if admission == "refused":
            log.debug("connection from %s refused: every connection busy", self.client)
            self._refuse(503, "too many open connections; retry shortly", retry_after=True)
            return
        self._probes_only = admission == "probes only"
        self._arm(self.limits.header_timeout_s, "headers")

    @property
    def awaiting_request(self) -> bool:
        """New, or its next request's head begun: closing it now may leave that request in its
        socket, unread, and reset the client's connection. Idle (kept alive, nothing of a next
        request read) and busy connections are not."""
        return self.table.states.get(self) == "waiting"

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown (SIGTERM, the listener closed), and the vLLM front's closing
        of idle connections: an idle connection closes now, a busy one after its answer, as in
        uvicorn. One awaiting its request closes after answering it instead: closed now, the
        request its client has sent or is sending meets a reset (a stream failed so on the tier,
        a client whose new connection endpoints still led to the stopping pod). The header timeout
        still closes one that sends nothing."""
        if self.awaiting_request:
            self._close_after_answer = True
            return
        super().shutdown()

    def close_after_answer(self) -> None:
        """Close once the answer under way, or the one to the request awaited, is out. An idle
        connection stays: its client may be sending its next request right now (the vLLM
        front's drain closes those later, with `shutdown`)."""
        state = self.table.states.get(self)
        if state == "busy" and self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False  # uvicorn closes it after the answer, corked (see below)
        elif state == "waiting":
            self._close_after_answer = True

    async def _app_ending_with_the_connection(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app, with the connection's end sent with the last bytes of an answer it closes after.
        An answer begun kept-alive and closed after (a shutdown came while it was under way) has no
        `connection: close` to tell its client; once the loop gets to the close, the client may
        already have read the answer and sent its next request on the connection, which then meets
        a reset (a stream failed so on the tier, on a busy front). Corked, the last bytes leave
        only with the close, so the client reads them with the connection's end and opens a new
        one (unless the loop takes over 200 ms to get to the close: Linux's most for a cork).
        The scope says how to ask whether the client has gone (`bodies.CLIENT_GONE`): an answer
        nobody will read is not worth making."""
        cycle = getattr(send, "__self__", None)  # uvicorn's RequestResponseCycle of this request
        start: Message | None = None  # held until the body shows whether the answer can be kept

        async def send_answer(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            last = not message.get("more_body", False)
            if start is not None:
                head, start = start, None
                size = len(message.get("body", b""))
                if last and size > SMALL_ANSWER:
                    await self._send_held(send, head, message, size, cycle)
                    return
                await send(head)
            if last and cycle is not None and not cycle.keep_alive:
                self._cork()
            await send(message)

        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        extensions = scope.get("extensions")
        if extensions is None:
            scope["extensions"] = {CLIENT_GONE: self.transport.is_closing}
        else:
            extensions[CLIENT_GONE] = self.transport.is_closing
        await self._app(scope, receive, send_answer)

    async def _send_held(self, send: Send, head: Message, body: Message, size: int, cycle: Any) -> None:
        """A whole answer of `size` bytes written with its bytes held in the answer budget until
        the transport has drained them; a 503 in its place if they cannot be held now."""
        client = self.client[0] if self.client else ""
        if not self.answers.hold(client, size):
            log.debug("answer of %d bytes to %s refused: the answer budget is taken", size, client)
            message = (
                f"the server holds as many answers not yet read as it may ({self.answers.budget.total} bytes, "
                f"{self.answers.per_client} per client); retry shortly"
            )
            if size > self.answers.per_client:
                message = f"an answer of {size} bytes exceeds the {self.answers.per_client} one client may be sent"
            refusal = b'{"error":"' + message.encode() + b'"}'
            headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(refusal))]
            await send({"type": "http.response.start", "status": 503, "headers": [*headers, (b"retry-after", b"1")]})
            await send({"type": "http.response.body", "body": refusal})
            return
        try:
            await send(head)
            if cycle is not None and not cycle.keep_alive:
                self._cork()
            await send(body)
        finally:
            transport = self.transport
            if transport.is_closing() or not transport.get_write_buffer_size():
                self.answers.release(client, size)
            else:
                self._unsent += size
                # What the socket did not take may be below the high-water mark (a kernel send
                # buffer grown to megabytes takes nearly all of an answer): then nothing would say
                # when it drains, nor arm the write timeout. From here any byte left pauses, so
                # the drain gives the bytes back and a client that reads nothing is dropped.
                transport.set_write_buffer_limits(high=0)

    def _drained(self) -> None:
        """The transport has (nearly) emptied its buffer, or is gone: the answers it held are out."""
        unsent, self._unsent = self._unsent, 0
        self.answers.release(self.client[0] if self.client else "", unsent)

    def _cork(self) -> None:
        """Hold what is written next until the close: Linux sends it with the FIN. Nothing for a
        connection already closing (its client gone: uvloop's socket then has no descriptor)."""
        if _CORK is None or self.transport.is_closing():
            return
        sock = self.transport.get_extra_info("socket")
        if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return
        try:
            sock.setsockopt(socket.IPPROTO_TCP, _CORK, 1)
        except (OSError, ValueError):  # closed meanwhile: nothing is left to send on it
            return

    def connection_lost(self, exc: Exception | None) -> None:
        self.table.remove(self)
        self._disarm()
        self._disarm_write()
        if self._unsent:
            self._drained()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        """The client's buffer is full: it has that long to read some of it. A client that reads
        nothing held its connection, its slot and the answer's producer forever (an upstream
        stream on the vLLM front, a batch's output here)."""
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.limits.write_timeout_s, self._unread)

    def resume_writing(self) -> None:
        self._disarm_write()
        if self._unsent:
            self._drained()
        super().resume_writing()

    def _disarm_write(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _unread(self) -> None:
        self._write_timer = None
        log.debug("connection from %s: answer unread for %gs", self.client, self.limits.write_timeout_s)
        self.transport.abort()  # nothing more can be written to it: no answer to send

    def _make_room(self) -> None:
        """Closed for a new connection at the cap: an idle one at once, as its keep-alive
        timeout would; one waiting for its request's head with a 503."""
        log.debug("connection from %s closed to make room for a new one", self.client)
        if self._awaiting_headers and not self._head_started and self._timer is None:
            self._refused = True
            self.transport.close()
        else:
            self._refuse(503, "too many open connections; retry shortly", retry_after=True)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self.table.states.get(self) == "idle":
            self.table.set(self, "waiting")
        if not self._awaiting_headers:
            self._feed(data)
            return
        if self._timer is None:  # the first bytes after a kept-alive connection's idle time
            self._arm(self.limits.header_timeout_s, "headers")
        # Counted before the parser sees them, up to the end of the head if this read has it
        # (what follows is body, or the next request, which the parser's callbacks count).
        window = self._tail + data
        end = window.find(_END)
        self._header_bytes += len(data) if end < 0 else end + len(_END) - len(self._tail)
        self._tail = window[-(len(_END) - 1) :]
        if self._header_bytes > self.limits.max_header_bytes:
            self._refuse(431, f"request headers exceed {self.limits.max_header_bytes} bytes")
            return
        self._feed(data)  # may complete the head, and parse more requests

    def _feed(self, data: bytes) -> None:
        """Hand `data` to the parser a slice at a time: once a request in it is refused, the rest
        is dropped unparsed (10,000 fields parsed only to be dropped held the loop 5 ms); once
        `MAX_PIPELINED` requests wait behind the one being answered, the rest waits unparsed,
        reading paused (a read of 1,578 pipelined requests was 1,578 requests in memory at once:
        300 such connections, +113 MiB in 3 s and /health/live unanswered)."""
        if self._unparsed:  # arrived before reading paused: after what waits
            data, self._unparsed = self._unparsed[self._unparsed_at :] + data, b""
        self._feed_from(data, 0)

    def _feed_from(self, data: bytes, at: int) -> None:
        view = memoryview(data)
        for start in range(at, len(data), _SLICE):
            if self._refused or self.transport.is_closing():
                return
            if len(self.pipeline) >= MAX_PIPELINED:
                self._unparsed, self._unparsed_at = data, start  # no copy: a pipelined read is parsed in steps
                self.flow.pause_reading()
                return
            super().data_received(view[start : start + _SLICE])  # type: ignore[arg-type]

    # ------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        if self._refused:
            return
        super().on_message_begin()
        self._awaiting_headers = self._head_started = True
        self._parsed_bytes = self._parsed_fields = 0
        if self._timer is None:
            self._arm(self.limits.header_timeout_s, "headers")

    def on_url(self, url: bytes) -> None:
        if not self._refused and self._within_limits(len(url), 0):
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._refused and self._within_limits(len(name) + len(value) + 4, 1):
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._head_started = False
        if self._probes_only and self.url.split(b"?", 1)[0].decode("latin-1") not in self.limits.probe_paths:
            self._refuse(503, "too many open connections; retry shortly", retry_after=True)
            return
        if (
            self.answers.held
            and self.answers.spent(self.client[0] if self.client else "")
            and self.url.split(b"?", 1)[0].decode("latin-1") not in self.limits.probe_paths
        ):
            self._refuse(503, "this client's answers not yet read take its share; retry shortly", retry_after=True)
            return
        self.table.set(self, "busy")
        self._awaiting_headers = False
        self._header_bytes = 0
        self._tail = b""
        self._arm(self.limits.body_timeout_s, "body")
        super().on_headers_complete()
        if self._probes_only or self._close_after_answer:
            self.cycle.keep_alive = False  # its slot is for the next probe; or shutting down

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        self._disarm()
        self._awaiting_headers = True
        super().on_message_complete()

    def _within_limits(self, size: int, fields: int) -> bool:
        """Count part of a parsed head; refuse the request (431) once it is over a limit."""
        self._parsed_bytes += size
        self._parsed_fields += fields
        if self._parsed_bytes > self.limits.max_header_bytes:
            self._refuse(431, f"request headers exceed {self.limits.max_header_bytes} bytes")
        elif self._parsed_fields > MAX_HEADER_FIELDS:
            self._refuse(431, f"more than {MAX_HEADER_FIELDS} request header fields")
        return not self._refused

    # ------------------------------------------------------------------ timers

    def _arm(self, seconds: float, part: str) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, self._timed_out, part, seconds)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self, part: str, seconds: float) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        log.debug("connection from %s: request %s not received within %gs", self.client, part, seconds)
        self._refuse(408, f"request {part} not received within {seconds:g}s")

    def _refuse(self, status: int, message: str, *, retry_after: bool = False) -> None:
        """Answer `status` and close. A refused head is a request of its own: while an earlier
        request's answer is still to come, reading stops and the refusal follows that answer."""
        self._disarm()
        self._refused = True
        cycle = self.cycle
        if self._awaiting_headers and cycle is not None and not cycle.response_complete:
            self._owed_refusal = (status, message, retry_after)
            self.flow.pause_reading()
            return
        if cycle is None or cycle.response_complete or not cycle.response_started:
            self.transport.write(_refusal(status, message, retry_after))
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app's receive says so; its answer, if any, is dropped
            cycle.message_event.set()
        self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._unparsed and not self.transport.is_closing():
            data, self._unparsed = self._unparsed, b""
            self._feed_from(data, self._unparsed_at)  # pauses reading again if the pipeline fills again
        if self.transport.is_closing() or self.pipeline or not self.cycle.response_complete:
            return
        refusal = self._owed_refusal
        if refusal is not None:
            self._owed_refusal = None
            self.transport.write(_refusal(*refusal))
            self.transport.close()
        else:
            self.table.set(self, "waiting" if self._head_started else "idle")


def _refusal(status: int, message: str, retry_after: bool) -> bytes:
    body = b'{"error":"' + message.encode() + b'"}'
    head = [
        b"HTTP/1.1 %d %s" % (status, _REASONS[status]),
        b"content-type: application/json",
        b"content-length: %d" % len(body),
        b"connection: close",
    ]
    if retry_after:
        head.append(b"retry-after: 1")
    return b"\r\n".join(head) + b"\r\n\r\n" + body
