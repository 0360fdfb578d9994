"""Tiny HTTP servers on 127.0.0.1 for tests that need a peer speaking plain HTTP."""

from __future__ import annotations

import contextlib
import http.server
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from typing import Self


class QuietHandler(http.server.BaseHTTPRequestHandler):
    """A request handler that answers in one call and keeps the test output clean."""

    def reply(self, body: bytes, content_type: str = "application/json", status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def serving(
    handler: type[http.server.BaseHTTPRequestHandler], tls: ssl.SSLContext | None = None
) -> Iterator[http.server.ThreadingHTTPServer]:
    """Serve `handler` on a free loopback port from a thread until the block ends."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class Exporter:
    """A Prometheus target per path on 127.0.0.1: `page(path, elapsed)` is the exposition text
    a path serves `elapsed` seconds after start (None: no such path, 404); a path in `broken`
    answers 503, as a pod that stopped answering scrapes."""

    def __init__(self, page: Callable[[str, float], str | None]) -> None:
        self.started = time.monotonic()
        self.broken: set[str] = set()
        exporter = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                body = None if self.path in exporter.broken else page(self.path, time.monotonic() - exporter.started)
                if body is None:
                    self.send_error(503 if self.path in exporter.broken else 404)
                    return
                self.reply(body.encode(), "text/plain; version=0.0.4")

        self._serving = serving(Handler)

    def __enter__(self) -> Self:
        server = self._serving.__enter__()
        self.address = f"127.0.0.1:{server.server_address[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        self._serving.__exit__(*exc)
