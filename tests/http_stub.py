"""Tiny HTTP servers on 127.0.0.1 for tests that need a peer speaking plain HTTP."""

from __future__ import annotations

import contextlib
import http.server
import ssl
import threading
from collections.abc import Iterator


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
