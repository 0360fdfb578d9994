"""Connection limits uvicorn does not have: time for a request's headers and body,
a cap on header bytes and on open connections.

uvicorn closes idle keep-alive connections, but a connection that never sends, or
sends its headers (or body) a byte at a time, holds a socket and a file descriptor
for as long as the client likes; `limit_concurrency` answers 503 only to requests
whose headers are complete. This subclass of uvicorn's httptools protocol arms
timers on the loop (no task per connection) and answers like an HTTP server would:
408 when headers or body take too long, 431 for headers that are too large, 503
for a connection beyond the cap, each followed by closing the connection.
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
        self._awaiting_headers = True
        self._header_bytes = 0
        self._header_lines = 0
        self._tail = b""  # the last bytes of the headers so far: their end may span two reads

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
        if not self._awaiting_headers:
            super().data_received(data)
            return
        # Counted before the parser sees them, up to the end of the headers if this read has it
        # (what follows is body): the read that completes oversized headers is refused too.
        window = self._tail + data
        end = window.find(_END)
        header_part = len(data) if end < 0 else end + len(_END) - len(self._tail)
        self._header_bytes += header_part
        # Lines, not parsed fields: counted before the parser makes an object of any of them
        # (the request line and the blank line that ends the headers are two of them).
        self._header_lines += window[: len(self._tail) + header_part].count(b"\r\n") - self._tail.count(b"\r\n")
        self._tail = window[-(len(_END) - 1) :]
        if self._header_bytes > self.limits.max_header_bytes:
            self._refuse(431, f"request headers exceed {self.limits.max_header_bytes} bytes")
            return
        if self._header_lines > MAX_HEADER_FIELDS + 2:
            self._refuse(431, f"more than {MAX_HEADER_FIELDS} request header fields")
            return
        super().data_received(data)  # may complete the headers

    # ------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._awaiting_headers = True
        self._arm(self.limits.header_timeout_s, "headers")

    def on_headers_complete(self) -> None:
        self._awaiting_headers = False
        self._header_bytes = self._header_lines = 0
        self._tail = b""
        self._arm(self.limits.body_timeout_s, "body")
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

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
        """Answer `status` unless a response is already under way, then close."""
        self._disarm()
        cycle = self.cycle
        if cycle is None or not cycle.response_started:
            body = b'{"error":"' + message.encode() + b'"}'
            head = [
                b"HTTP/1.1 %d %s" % (status, _REASONS[status]),
                b"content-type: application/json",
                b"content-length: %d" % len(body),
                b"connection: close",
            ]
            if retry_after:
                head.append(b"retry-after: 1")
            self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app's receive says so; its answer, if any, is dropped
            cycle.message_event.set()
        self.transport.close()
