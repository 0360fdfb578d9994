"""An OTLP/HTTP trace receiver in the test process: what a collector's `otlp` receiver takes on
`/v1/traces` (protobuf, optionally gzip), decoded with opentelemetry-proto into plain spans.

`mode` makes it a collector in trouble: "ok" answers at once, "hang" reads each export and never
answers (a collector that is up but stuck), "refuse" closes the listening socket (down)."""

from __future__ import annotations

import contextlib
import gzip
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from testsupport.waiting import eventually


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    resource: dict[str, Any]
    status_code: int


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, which) if which else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


def decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope in resource_spans.scope_spans:
            for span in scope.spans:
                spans.append(
                    ReceivedSpan(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        kind=span.kind,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes=_attributes(span.attributes),
                        events=[(e.name, _attributes(e.attributes)) for e in span.events],
                        resource=resource,
                        status_code=span.status.code,
                    )
                )
    return spans


@dataclass
class Receiver:
    url: str
    spans: list[ReceivedSpan] = field(default_factory=list)
    exports: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def named(self, name: str) -> list[ReceivedSpan]:
        with self.lock:
            return [s for s in self.spans if s.name == name]

    def wait_for(self, condition: Callable[[list[ReceivedSpan]], bool], timeout: float = 30) -> list[ReceivedSpan]:
        """Until `condition(spans so far)` holds; the spans then."""

        def arrived() -> tuple[list[ReceivedSpan]] | None:
            with self.lock:
                spans = list(self.spans)
            return (spans,) if condition(spans) else None  # a tuple: no spans may be what is awaited

        (found,) = eventually(arrived, timeout=timeout, interval=0.02, what="the spans expected")
        return found


@contextlib.contextmanager
def otlp_receiver(mode: str = "ok", host: str = "127.0.0.1") -> Iterator[Receiver]:
    """A receiver on a free port of `host` (loopback, or the real-pods tier's bridge address, where
    its pods reach it); its URL is the traces endpoint (`.../v1/traces`)."""
    release = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if mode == "hang":
                release.wait(60)
                return
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            spans = decode(body) if self.path == "/v1/traces" else []
            with receiver.lock:
                receiver.spans.extend(spans)
                receiver.exports += 1
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200 if self.path == "/v1/traces" else 404)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, 0), Handler)
    server.daemon_threads = True
    receiver = Receiver(f"http://{host}:{server.server_address[1]}/v1/traces")
    if mode == "refuse":
        server.server_close()  # the port answers nothing: connections are refused
        yield receiver
        return
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        release.set()
        server.shutdown()
        server.server_close()
