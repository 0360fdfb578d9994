"""Traces of inference requests with OpenTelemetry, exported over OTLP/HTTP; off by default.

When `--otlp-traces-endpoint` is set, each inference request gets a server span, continued from
the caller's W3C `traceparent` when it sends one, with child spans for the stages it went
through: `decode` (the body parsed), `queue_wait` (queued until the batcher took it: behind a
busy runtime, or waiting for company), `batch_formation` (its rows stacked with the rest of the
batch), `runtime` (the backend call of that batch) and `encode` (the answer written). Requests
that shared a batch keep their own traces; their batch spans carry the same
`inference.batch.id`, with the batch's rows and requests.

Spans leave through a bounded batch processor on its own thread: a queue of at most
`MAX_QUEUED_SPANS`, exports of at most `MAX_EXPORT_BATCH`, each given up after
`EXPORT_TIMEOUT_S`. While that queue is full (a slow or absent collector) new requests are not
traced at all, rather than traced and their spans dropped one by one at the queue (which the
SDK logs for every span): a collector in trouble costs traces, not requests.

With tracing off nothing here runs on the request path: the routes are bound without it
(api/routes.py), `current()` is None, and the OpenTelemetry SDK is never imported.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence, Sized
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger(__name__)

SERVICE_NAME = "model-server"
INSTRUMENTATION = "model_server"
# The batch processor's bounds: spans queued at most, per export, and how long one export may take.
MAX_QUEUED_SPANS = 2048
MAX_EXPORT_BATCH = 512
SCHEDULE_DELAY_MS = 500
EXPORT_TIMEOUT_S = 5.0
# How long a stopping server waits for the last spans to leave (a stuck collector cannot hold it).
SHUTDOWN_TIMEOUT_S = 2.0
# Spans one traced request makes: its own and its stages'.
SPANS_PER_REQUEST = 6

_NULL_STAGE = contextlib.nullcontext()


@dataclass(slots=True)
class RequestTrace:
    """One sampled request's span, and the moments the batcher saw it (wall clock, ns)."""

    tracer: Tracer
    span: Span
    context: Context
    enqueued_ns: int = 0
    taken_ns: int = 0

    def stage(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """A child span around a stage that runs in the request's own task."""
        return self.tracer.start_as_current_span(name, context=self.context)

    def record(self, name: str, start_ns: int, end_ns: int, attributes: Mapping[str, Any]) -> None:
        """A child span for a stage timed elsewhere (in the batcher's task or thread)."""
        span = self.tracer.start_span(name, context=self.context, start_time=start_ns, attributes=attributes)
        span.end(end_time=end_ns)


_CURRENT: ContextVar[RequestTrace | None] = ContextVar("model_server_request_trace", default=None)


def current() -> RequestTrace | None:
    """The request being traced in this task, if any (None whenever tracing is off)."""
    return _CURRENT.get()


def stage(name: str) -> contextlib.AbstractContextManager[Any]:
    """A child span of the current request's span, or nothing when it is not traced."""
    trace = _CURRENT.get()
    return _NULL_STAGE if trace is None else trace.stage(name)


def mark_enqueued(trace: RequestTrace) -> None:
    trace.enqueued_ns = time.time_ns()


def mark_taken(trace: RequestTrace) -> None:
    trace.taken_ns = time.time_ns()


def record_batch(
    traces: Sequence[RequestTrace], batch_id: str, rows: int, padded_rows: int, started_ns: int, ended_ns: int
) -> None:
    """The queue wait, batch formation and runtime spans of every traced request of one batch."""
    attributes = {
        "inference.batch.id": batch_id,
        "inference.batch.rows": rows,
        "inference.batch.padded_rows": padded_rows,
        "inference.batch.requests": len(traces),
    }
    for trace in traces:
        taken = trace.taken_ns or started_ns
        trace.record("queue_wait", trace.enqueued_ns or taken, taken, {"inference.batch.id": batch_id})
        trace.record("batch_formation", taken, started_ns, attributes)
        trace.record("runtime", started_ns, ended_ns, attributes)


class Tracing:
    """The server's tracer: OTLP/HTTP to `endpoint`, a trace begun here sampled at `ratio`
    (a caller's sampled flag decides for the traces it continues)."""

    def __init__(
        self,
        endpoint: str,
        ratio: float,
        *,
        model: str,
        max_queue: int = MAX_QUEUED_SPANS,
        max_export_batch: int = MAX_EXPORT_BATCH,
        schedule_delay_ms: int = SCHEDULE_DELAY_MS,
        export_timeout_s: float = EXPORT_TIMEOUT_S,
    ) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.endpoint = endpoint
        self.provider: TracerProvider = TracerProvider(
            resource=Resource.create({"service.name": SERVICE_NAME, "inference.model": model}),
            sampler=ParentBased(TraceIdRatioBased(ratio)),
        )
        self.processor = BatchSpanProcessor(
            OTLPSpanExporter(endpoint=endpoint, timeout=export_timeout_s),
            max_queue_size=max_queue,
            max_export_batch_size=min(max_export_batch, max_queue),
            schedule_delay_millis=schedule_delay_ms,
            export_timeout_millis=export_timeout_s * 1000,
        )
        self.provider.add_span_processor(self.processor)
        self.tracer: Tracer = self.provider.get_tracer(INSTRUMENTATION)
        # The processor's queue (a bounded deque), when this SDK version keeps one where 1.3x does.
        self._queue: Sized | None = getattr(getattr(self.processor, "_batch_processor", None), "_queue", None)
        self._max_queue = max_queue
        self._active = 0  # traced requests in progress: the spans they will still add
        self._propagator = TraceContextTextMapPropagator()

    @contextlib.contextmanager
    def request(self, route: str, headers: Mapping[str, str], model: str) -> Iterator[RequestTrace | None]:
        """The server span of one inference request, current for the stages under it; None
        inside when the trace is not sampled (the stages then do nothing either)."""
        from opentelemetry.trace import SpanKind, set_span_in_context

        if self.backlogged():
            yield None
            return
        parent = self._propagator.extract(headers)
        attributes = {"http.request.method": "POST", "http.route": route, "inference.model": model}
        with self.tracer.start_as_current_span(
            f"POST {route}", context=parent, kind=SpanKind.SERVER, attributes=attributes
        ) as span:
            if not span.is_recording():
                yield None
                return
            trace = RequestTrace(self.tracer, span, set_span_in_context(span))
            token = _CURRENT.set(trace)
            self._active += 1
            try:
                yield trace
            finally:
                self._active -= 1
                _CURRENT.reset(token)

    def answered(self, trace: RequestTrace | None, status: int) -> None:
        """Record the HTTP status; a 5xx marks the span as an error, as HTTP semantics say."""
        if trace is None:
            return
        from opentelemetry.trace import Status, StatusCode

        trace.span.set_attribute("http.response.status_code", status)
        if status >= 500:
            trace.span.set_status(Status(StatusCode.ERROR))

    def queued(self) -> int:
        """Spans waiting for export now (at most `max_queue`; 0 where the SDK keeps no queue we
        can see): the SDK exposes its length only to a meter, so it is read here."""
        return len(self._queue) if self._queue is not None else 0

    def backlogged(self) -> bool:
        """The export queue has no room for the spans of the traced requests in progress and one
        more: the collector is behind. (Called on the event loop only, as `request` is.)"""
        if self._queue is None:
            return False
        return len(self._queue) + (self._active + 1) * SPANS_PER_REQUEST > self._max_queue

    def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Export what is queued for at most `timeout_s`; the exporter's thread is a daemon."""
        stopper = threading.Thread(target=self.provider.shutdown, name="tracing-shutdown", daemon=True)
        stopper.start()
        stopper.join(timeout_s)


def from_settings(endpoint: str | None, ratio: float, model: str) -> Tracing | None:
    """The server's tracer when an endpoint is configured, else None (tracing off)."""
    if not endpoint:
        return None
    log.info("tracing to %s (sampling %.3g of new traces)", endpoint, ratio)
    return Tracing(endpoint, ratio, model=model)


class TraceIds(logging.Filter):
    """Adds `trace_id` and `span_id` (hex, as OTLP and W3C write them) to a record logged
    under an active span, so a JSON log line can be found from its trace and back."""

    def filter(self, record: logging.LogRecord) -> bool:
        from opentelemetry.trace import get_current_span

        context = get_current_span().get_span_context()
        if context.is_valid:
            record.trace_id = format(context.trace_id, "032x")
            record.span_id = format(context.span_id, "016x")
        return True
