"""The adversarial attacks in their HTTP/2 shape, for a gRPC port (testsupport/adversary.py picks
them for a `Target` whose protocol is GRPC): the frames written with h2, as a hostile client
would, not through a gRPC library that plays by the rules.

- pipelined: 50 calls written at once on each connection before any answer is read;
- idle: connections that made one call, then say nothing (no streams, no pings);
- half-open: connections whose streams never send their message (headers, then silence);
- stalled uploads: calls announcing a 60 MiB message that stop after what the window takes;
- huge headers: a call, then a second whose metadata is 10,000 fields (HPACK makes them a few
  bytes each on the wire: the size is only seen once decoded);
- large messages (gRPC only): 100 calls at once, each sending a whole 19 MiB message as fast as
  the server's flow-control windows let it;
- answers nobody reads (gRPC only), for a model whose answers are 64 times its requests: two
  connections of 50 ModelInfer calls each, whose SETTINGS give every stream a window of 0 and
  that never send a WINDOW_UPDATE (zero window), or that open every window as far as HTTP/2
  allows and then never read the socket again (never reading).

The watcher's health check is the protocol's ServerLive over a new connection, read to its
trailers (grpc-status 0 and live = true).
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Protocol

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

# h2 and hpack log every header field at DEBUG: with the root logger at DEBUG (a test before
# may have set it), encoding 300 heads of 10,000 fields took this process 177 s, and the health
# checks it times waited on it, not on the server.
for _name in ("h2", "hpack"):
    logging.getLogger(_name).setLevel(logging.WARNING)

SERVICE = "inference.GRPCInferenceService"
#: ServerLiveResponse{live: true}, framed: not compressed, 2 bytes.
LIVE_ANSWER = b"\x00\x00\x00\x00\x02\x08\x01"
EMPTY_MESSAGE = b"\x00\x00\x00\x00\x00"
MiB = 1 << 20


class Endpoint(Protocol):
    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...


def _headers(method: str, extra: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", f"/{SERVICE}/{method}"),
        (":authority", "adversary"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        *(extra or []),
    ]


def frame(message: bytes, announced: int | None = None) -> bytes:
    """A gRPC message on the wire: not compressed, its length (or the one `announced`), itself."""
    return b"\x00" + (len(message) if announced is None else announced).to_bytes(4, "big") + message


class Client:
    """One HTTP/2 connection written by hand; `close()` drops it (what the attacks hold). `window`:
    the flow-control window it gives each stream of the server's (HTTP/2's default if None); one
    larger than the default opens the connection's own window as far."""

    def __init__(
        self, endpoint: Endpoint, source: str | None = None, timeout: float = 10, window: int | None = None
    ) -> None:
        address = (source, 0) if source else None
        self.sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout, source_address=address)
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.h2.initiate_connection()
        if window is not None:
            self.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
            if window > self.h2.inbound_flow_control_window:
                self.h2.increment_flow_control_window(window - self.h2.inbound_flow_control_window)
        self.ended: set[int] = set()
        self.answering: set[int] = set()  # streams whose answer's headers came
        self.bodies: dict[int, bytes] = {}
        self.status: dict[int, str] = {}
        self.flush()

    def flush(self, wait: bool = True) -> None:
        data = self.h2.data_to_send()
        if not data:
            return
        if wait:
            self.sock.sendall(data)
            return
        self.sock.setblocking(False)
        with contextlib.suppress(BlockingIOError, ConnectionError):
            self.sock.send(data)

    def call(self, method: str, message: bytes = EMPTY_MESSAGE, *, end: bool = True) -> int:
        """Open a stream for `method` and write `message` in frames (ending the stream unless `end`
        is false): within the first window, the server's SETTINGS not yet read."""
        stream = self.h2.get_next_available_stream_id()
        self.h2.send_headers(stream, _headers(method))
        if message:
            size = self.h2.max_outbound_frame_size
            for offset in range(0, len(message), size):
                last = offset + size >= len(message)
                self.h2.send_data(stream, message[offset : offset + size], end_stream=end and last)
        elif end:
            self.h2.end_stream(stream)
        return stream

    def read_until(self, done: Callable[[], bool], timeout: float) -> bool:
        """Read and answer frames until `done()`, the timeout or the connection's end."""
        deadline = time.monotonic() + timeout
        self.sock.setblocking(True)
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except OSError:
                return False
            if not data:
                return done()
            try:
                events = self.h2.receive_data(data)
            except h2.exceptions.ProtocolError:
                return False
            for event in events:
                if isinstance(event, h2.events.DataReceived):
                    self.bodies[event.stream_id] = self.bodies.get(event.stream_id, b"") + event.data
                    self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.TrailersReceived | h2.events.ResponseReceived):
                    if isinstance(event, h2.events.ResponseReceived):
                        self.answering.add(event.stream_id)
                    for name, value in event.headers:
                        if name in ("grpc-status", b"grpc-status"):
                            self.status[event.stream_id] = value if isinstance(value, str) else value.decode()
                elif isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
                    self.ended.add(event.stream_id)
            self.flush()
        return True

    def answers(self, count: int, timeout: float) -> int:
        """How many streams ended with status 0, waiting for up to `count` of them."""
        self.read_until(lambda: len(self.ended) >= count, timeout)
        return sum(1 for stream in self.ended if self.status.get(stream) == "0")

    def close(self) -> None:
        self.sock.close()


def health_check(endpoint: Endpoint, source: str, timeout: float) -> float | None:
    """Seconds to a complete ServerLive (live, status 0) over a new connection; None if none came."""
    started = time.monotonic()
    try:
        client = Client(endpoint, source, timeout)
    except OSError:
        return None
    try:
        stream = client.call("ServerLive")
        client.flush()
        if not client.read_until(lambda: stream in client.ended, timeout):
            return None
        if client.status.get(stream) != "0" or client.bodies.get(stream) != LIVE_ANSWER:
            return None
    except OSError:
        return None
    finally:
        client.close()
    return time.monotonic() - started


def pipelined(endpoint: Endpoint, scale: int) -> list[Client]:
    """`scale` connections, each writing 50 ServerLive calls at once before reading any answer."""
    clients = [Client(endpoint) for _ in range(scale)]
    for client in clients:
        for _ in range(50):
            client.call("ServerLive")
        client.flush()
    return clients


def idle(endpoint: Endpoint, scale: int) -> list[Client]:
    """`scale` connections, each after one answered call, then silent."""
    clients = []
    for _ in range(scale):
        client = Client(endpoint)
        stream = client.call("ServerLive")
        client.flush()
        client.read_until(lambda c=client, s=stream: s in c.ended, 5)  # type: ignore[misc]
        clients.append(client)
    return clients


#: Streams each half-open connection opens and never sends on: 6,000 calls in all, each one a
#: coroutine in grpc's Python server until the call table ends it. At 10 per connection (20,000)
#: /health took 0.7-1.3 s and the server grew 200-270 MiB: the price of a call there, paid per
#: stream, which no option of grpc's core bounds below its 100 streams per connection.
SILENT_STREAMS = 3


def half_open(endpoint: Endpoint, scale: int) -> list[Client]:
    """`scale` connections, each with SILENT_STREAMS ModelInfer calls whose message never comes."""
    clients = []
    for _ in range(scale):
        client = Client(endpoint)
        for _ in range(SILENT_STREAMS):
            client.call("ModelInfer", b"", end=False)
        client.flush(wait=False)
        clients.append(client)
    return clients


def stalled_uploads(endpoint: Endpoint, scale: int) -> list[Client]:
    """`scale` ModelInfer calls announcing a 60 MiB message and sending 300 KiB of it, as far as the
    server's flow-control window lets them, then nothing."""
    clients = []
    for _ in range(scale):
        client = Client(endpoint)
        stream = client.call("ModelInfer", b"", end=False)
        data = frame(b"\x0a" * (300 * 1024), announced=60 * MiB)
        allowed = min(len(data), client.h2.local_flow_control_window(stream))
        for offset in range(0, allowed, client.h2.max_outbound_frame_size):
            client.h2.send_data(stream, data[offset : min(allowed, offset + client.h2.max_outbound_frame_size)])
        client.flush(wait=False)
        clients.append(client)
    return clients


def huge_headers(endpoint: Endpoint, scale: int) -> list[Client]:
    """`scale` connections, each a call and then a second one whose metadata is 10,000 fields."""
    clients = []
    fields = [("a", "b")] * 10_000
    for _ in range(scale):
        client = Client(endpoint)
        client.call("ServerLive")
        stream = client.h2.get_next_available_stream_id()
        client.h2.send_headers(stream, _headers("ServerLive", fields), end_stream=True)
        client.flush(wait=False)
        clients.append(client)
    return clients


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


#: Each large message: a ModelInferRequest for `tiny` whose one input (1x4 FP32) carries this
#: many raw bytes, under the 20 MiB a server with a 512 MiB memory limit takes (answered
#: INVALID_ARGUMENT once it is all there: the shape needs 16 bytes).
LARGE_MESSAGE_BYTES = 19 * MiB
#: How long the messages are sent before the attack holds what it has (a Python client sends
#: 40-60 MiB/s of them; a server that takes two at a time answers 2-3 a second).
UPLOADS_S = 3.0
_INFER_HEAD = b"\x0a\x04tiny" + b"\x2a\x0d\x0a\x01x\x12\x04FP32\x1a\x02\x01\x04"


class Sender(Client):
    """One connection sending whole ModelInfer messages on its streams, as fast as the server's
    flow-control windows let it, on the thread of its `Pump` (the attack holds the connections
    while they send). `reads` false: once every message is out it reads nothing more, and it never
    acknowledges what it received (what the answerless attacks hold the server to)."""

    def __init__(
        self,
        endpoint: Endpoint,
        messages: list[list[memoryview]],
        pump: Pump,
        *,
        window: int | None = None,
        reads: bool = True,
    ) -> None:
        super().__init__(endpoint, window=window)
        self.parts = {self.call("ModelInfer", b"", end=False): list(parts) for parts in messages}
        self.streams = set(self.parts)
        self.pending = memoryview(self.h2.data_to_send())
        self.reads = reads
        self.done = False
        self.pump = pump

    def step(self) -> None:
        """Read what arrived, then write what the windows allow (without waiting)."""
        with contextlib.suppress(BlockingIOError):
            data = self.sock.recv(65536)
            if not data:
                self.done = True
                return
            for event in self.h2.receive_data(data):
                if isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
                    self.ended.add(event.stream_id)
                    self.parts.pop(event.stream_id, None)
                elif isinstance(event, h2.events.DataReceived) and self.reads:
                    self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        while not self.pending and not self.done:
            stream = next((s for s in self.parts if self.h2.local_flow_control_window(s) > 0), None)
            if stream is None:
                break
            window = min(self.h2.local_flow_control_window(stream), self.h2.max_outbound_frame_size)
            parts = self.parts[stream]
            piece, parts[0] = parts[0][:window], parts[0][window:]
            if not parts[0]:
                parts.pop(0)
            if not parts:
                del self.parts[stream]
            self.h2.send_data(stream, piece, end_stream=not parts)
            self.pending = memoryview(self.h2.data_to_send())
        if self.pending:
            with contextlib.suppress(BlockingIOError):
                self.pending = self.pending[self.sock.send(self.pending) :]
        self.done = self.done or self.streams <= self.ended or (not self.reads and not self.parts and not self.pending)

    def writable(self) -> bool:
        """Whether there is something to write now: bytes framed, or a window open for more."""
        return bool(self.pending) or any(self.h2.local_flow_control_window(s) > 0 for s in self.parts)

    def close(self) -> None:
        self.pump.stop()
        super().close()


class Pump:
    """The thread that drives every `Upload` until each is answered or the attack lets go."""

    def __init__(self) -> None:
        self.uploads: list[Sender] = []
        self._stop = threading.Event()
        self.finished = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="adversary-uploads")

    def start(self) -> None:
        for upload in self.uploads:
            upload.sock.setblocking(False)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(10)

    def _run(self) -> None:
        with selectors.DefaultSelector() as selector:
            while not self._stop.is_set():
                live = [upload for upload in self.uploads if not upload.done]
                if not live:
                    self.finished.set()
                    return
                for upload in live:
                    selector.register(
                        upload.sock,
                        selectors.EVENT_READ | (selectors.EVENT_WRITE if upload.writable() else 0),
                        upload,
                    )
                ready = selector.select(0.05)
                for key in list(selector.get_map().values()):
                    selector.unregister(key.fileobj)
                for key, _ in ready:
                    try:
                        key.data.step()
                    except (OSError, h2.exceptions.ProtocolError):
                        key.data.done = True


def large_messages(endpoint: Endpoint, scale: int) -> list[Client]:
    """`scale` connections, each a ModelInfer call sending a whole LARGE_MESSAGE_BYTES message at
    once, as fast as the server takes it: the server must not hold them all at the same time."""
    zeros = memoryview(bytes(LARGE_MESSAGE_BYTES))
    message = _INFER_HEAD + b"\x3a" + _varint(len(zeros))
    parts = [memoryview(frame(message, announced=len(message) + len(zeros))), zeros]
    pump = Pump()
    pump.uploads = [Sender(endpoint, [parts], pump) for _ in range(scale)]
    pump.start()
    pump.finished.wait(UPLOADS_S)
    return list(pump.uploads)


def infer_message(rows: int) -> bytes:
    """A ModelInferRequest for `tiny`, its input x FP32 [rows, 4] of zeros in raw_input_contents."""
    shape = _varint(rows) + _varint(4)
    tensor = b"\x0a\x01x\x12\x04FP32\x1a" + _varint(len(shape)) + shape
    return b"\x0a\x04tiny\x2a" + _varint(len(tensor)) + tensor + b"\x3a" + _varint(16 * rows) + bytes(16 * rows)


#: Rows of each answerless call's input: a 64 KiB message, answered with 4 MiB by a model whose
#: answers are 64 times its requests (x[N, 4] @ W[4, 256]); under the largest answer a server
#: with a 512 MiB memory limit makes, so that its answers are held, not refused.
ANSWERLESS_ROWS = 4096
#: Calls each answerless connection opens at once.
ANSWERLESS_CALLS = 50
#: The largest window HTTP/2 allows.
MAX_WINDOW = (1 << 31) - 1


def _answerless(endpoint: Endpoint, scale: int, window: int) -> list[Client]:
    message = memoryview(frame(infer_message(ANSWERLESS_ROWS)))
    pump = Pump()
    pump.uploads = [
        Sender(endpoint, [[message]] * ANSWERLESS_CALLS, pump, window=window, reads=False) for _ in range(scale)
    ]
    pump.start()
    pump.finished.wait(UPLOADS_S)
    return list(pump.uploads)


def zero_window(endpoint: Endpoint, scale: int) -> list[Client]:
    """`scale` connections whose SETTINGS give each stream a window of 0 and that never send a
    WINDOW_UPDATE, each sending ANSWERLESS_CALLS ModelInfer calls whose answers can never leave."""
    return _answerless(endpoint, scale, 0)


def never_reading(endpoint: Endpoint, scale: int) -> list[Client]:
    """`scale` connections opening every window as far as HTTP/2 allows, each sending
    ANSWERLESS_CALLS ModelInfer calls and then never reading again: the answers fill the socket
    buffers, and the rest waits in the server."""
    return _answerless(endpoint, scale, MAX_WINDOW)


ATTACKS: dict[str, tuple[Callable[[Endpoint, int], list[Client]], int]] = {
    "pipelined": (pipelined, 20),
    "idle": (idle, 2_000),
    "half-open": (half_open, 2_000),
    "stalled uploads": (stalled_uploads, 1_000),
    "huge headers": (huge_headers, 300),
    "large messages": (large_messages, 100),
    "zero window": (zero_window, 2),
    "never reading": (never_reading, 2),
}
