"""Liveness while a large request is parsed: one connection POSTs a body while another
asks /health/live in a loop, for the tests and the benchmark of the model server's body
limits (a parse that blocks the event loop shows as a gap between liveness answers)."""

from __future__ import annotations

import socket
import threading
import time

from testsupport.payloads import http_post


def post_and_watch_liveness(port: int, body: bytes, timeout: float) -> tuple[int, float, list[float]]:
    """POST `body` over a raw socket while another connection asks /health/live in a
    loop. Returns the status, the time from the last byte sent to the answer, and the
    moments (relative to the last byte sent) at which liveness answers arrived before it.
    `timeout` bounds the POST's socket; the watcher's is a quarter of it."""
    answers: list[float] = []
    stop = threading.Event()
    ready = threading.Event()
    origin: list[float] = []

    def watch() -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout / 4) as conn:
            ready.set()
            while not stop.is_set():
                conn.sendall(b"GET /health/live HTTP/1.1\r\nHost: test\r\n\r\n")
                reply = b""
                while not reply.endswith(b'{"live":true}'):
                    reply += conn.recv(4096)
                if origin:
                    answers.append(time.perf_counter() - origin[0])
                time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    ready.wait(10)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(http_post("/v2/models/tiny/infer", body))
        origin.append(time.perf_counter())
        reply = conn.recv(65536)
        elapsed = time.perf_counter() - origin[0]
    stop.set()
    watcher.join(timeout / 4)
    return int(reply.split(b" ", 2)[1]), elapsed, [t for t in answers if t < elapsed]
