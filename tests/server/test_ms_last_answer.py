"""The last answer of a kept-alive connection that the server closes after it (a shutdown began
while the answer was under way: SIGTERM, the vLLM front's drain) arrives together with the
connection's end. A client that finds the connection still open once it has read the answer
sends its next request on it, and that request meets a reset: on the real-pods tier a stream
failed so, with no byte read, when the old pod's front closed the connection a moment after the
last chunk of the stream before (its loop busy relaying others)."""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from bounded_http.http_protocol import ConnectionLimits, LimitedHttpProtocol
from testsupport.processes import free_port
from testsupport.waiting import eventually

pytestmark = pytest.mark.skipif(not hasattr(socket, "TCP_CORK"), reason="TCP_CORK is Linux's")

# The loop busy elsewhere between the last write and the close: under the 200 ms for which
# Linux holds corked bytes at most (a loop held longer sends them before the close again).
LOOP_HELD_S = 0.1


class StreamingApp:
    """Streams two chunks; between them the test shuts the server's connections down. Before
    the last chunk it holds the loop for a while after the write, as other connections'
    work does on a busy server."""

    def __init__(self) -> None:
        self.first_sent = threading.Event()
        self.go_on = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.ended: list[BaseException | None] = []  # how each answer's last `send` ended

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        self.loop = asyncio.get_running_loop()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"first\n", "more_body": True})
        self.first_sent.set()
        await self.go_on.wait()
        self.loop.call_soon(time.sleep, LOOP_HELD_S)
        try:
            await send({"type": "http.response.body", "body": b"last\n", "more_body": False})
        except Exception as exc:
            self.ended.append(exc)
            raise
        self.ended.append(None)


@pytest.fixture(params=["asyncio", "uvloop"])  # the image's uvicorn runs on uvloop
def serving(request: pytest.FixtureRequest) -> Iterator[tuple[uvicorn.Server, StreamingApp, int]]:
    app = StreamingApp()
    port = free_port()
    limits = ConnectionLimits(header_timeout_s=5, body_timeout_s=5, max_header_bytes=8192, max_connections=16)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, lifespan="off", log_level="warning", loop=request.param,
        http=LimitedHttpProtocol.with_limits(limits),
    )  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    eventually(lambda: server.started, interval=0.01, what="the server's start")
    yield server, app, port
    server.should_exit = True
    thread.join(10)


def read_answer(conn: socket.socket) -> bytes:
    """Up to the end of a chunked answer, and no further."""
    data = b""
    while not data.endswith(b"0\r\n\r\n"):
        chunk = conn.recv(1)
        assert chunk, data
        data += chunk
    return data


def test_a_connection_shut_down_mid_answer_ends_with_the_answers_last_bytes(
    serving: tuple[uvicorn.Server, StreamingApp, int],
) -> None:
    server, app, port = serving
    with contextlib.closing(socket.create_connection(("127.0.0.1", port), timeout=10)) as conn:
        conn.sendall(b"GET /stream HTTP/1.1\r\nhost: test\r\n\r\n")
        assert app.first_sent.wait(10) and app.loop is not None
        shut_down = threading.Event()

        def shut_down_connections() -> None:  # as the front's drain and uvicorn's SIGTERM do
            for connection in list(server.server_state.connections):
                connection.shutdown()
            app.go_on.set()
            shut_down.set()

        app.loop.call_soon_threadsafe(shut_down_connections)
        assert shut_down.wait(10)
        answer = read_answer(conn)
        assert b"connection: close" not in answer.lower(), "the answer's head was kept alive"
        assert answer.endswith(b"last\n\r\n0\r\n\r\n")
        # The answer is all read: its connection's end must be here already, not a while later.
        readable, _, _ = select.select([conn], [], [], 0)
        assert readable and conn.recv(1) == b"", "the connection was still open after its last answer"


def test_a_client_gone_before_the_last_answer_of_a_closing_connection_costs_no_error(
    serving: tuple[uvicorn.Server, StreamingApp, int],
) -> None:
    """Its client asked to close after the answer, then left in the middle of it: the answer's
    last `send` is dropped as uvicorn drops it, with nothing to cork (uvloop's socket of a
    closed connection has no descriptor: the activator logged "negative file descriptor")."""
    server, app, port = serving
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
    conn.sendall(b"GET /stream HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n")
    assert app.first_sent.wait(10) and app.loop is not None
    conn.close()
    eventually(lambda: not server.server_state.connections, interval=0.01, what="the server seeing the client go")
    app.loop.call_soon_threadsafe(app.go_on.set)
    eventually(lambda: app.ended, interval=0.01, what="the app's end")
    assert app.ended == [None]
