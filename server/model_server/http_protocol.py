"""Connection limits uvicorn does not have: time for a request's headers and body,
a cap on header bytes and on open connections.

uvicorn closes idle keep-alive connections, but a connection that never sends, or
sends its headers (or body) a byte at a time, holds a socket and a file descriptor
for as long as the client likes; `limit_concurrency` answers 503 only to requests
whose headers are complete. This subclass of uvicorn's httptools protocol arms
timers on the loop (no task per connection) and answers like an HTTP server would:
408 when headers or body take too long, 431 for headers that are too large, 503
for a connection beyond the cap, each followed by closing the connection.

Header bytes are counted twice, both per request: as they arrive (a head split over
many reads is refused before the parser has gathered it all), and as the parser hands
out the request line and each field (one read may hold the end of one request and the
whole head of the next: a kept-alive connection's second request was not counted at
all, and 300 connections of 10,000 fields each took 97 -> 294 MiB).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}
#: Header fields one request may have (Apache's LimitRequestFields). Each is a pair of Python
#: objects until the request ends: 1,000 connections of 60 KB of tiny headers took 1 GiB.
MAX_HEADER_FIELDS = 100
_END = b"\r\n\r\n"


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float
    body_timeout_s: float
    max_header_bytes: int
    max_connections: int


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with `ConnectionLimits` (see the module doc)."""

    limits: ConnectionLimits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._awaiting_headers = True  # the bytes that come next are a request's head
        self._header_bytes = 0  # of the head being received, counted as it arrives
        self._tail = b""  # the last bytes of the head so far: its end may span two reads
        self._parsed_bytes = 0  # of the head being parsed, counted as the parser hands it out
        self._parsed_fields = 0
        self._refused = False  # answered and closing: whatever the parser still has is dropped
        self._owed_refusal: tuple[int, str, bool] | None = None  # to send once earlier answers are out

    @classmethod
    def with_limits(cls, limits: ConnectionLimits) -> type[LimitedHttpProtocol]:
        """The class to hand to `uvicorn.Config(http=...)`."""
        return type(cls.__name__, (cls,), {"limits": limits})

    # ------------------------------------------------------------------ connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            log.debug("connection from %s refused: %d open", self.client, len(self.connections))
            self._refuse(503, "too many open connections; retry shortly", retry_after=True)
            return
        self._arm(self.limits.header_timeout_s, "headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if not self._awaiting_headers:
            super().data_received(data)
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
        super().data_received(data)  # may complete the head, and parse more requests

    # ------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        if self._refused:
            return
        super().on_message_begin()
        self._awaiting_headers = True
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
        self._awaiting_headers = False
        self._header_bytes = 0
        self._tail = b""
        self._arm(self.limits.body_timeout_s, "body")
        super().on_headers_complete()

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
        refusal = self._owed_refusal
        if (
            refusal is not None
            and not self.transport.is_closing()
            and not self.pipeline
            and self.cycle.response_complete
        ):
            self._owed_refusal = None
            self.transport.write(_refusal(*refusal))
            self.transport.close()


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
