"""Traces of the operator's reconciles, exported over OTLP/HTTP to the platform's collector.

Off unless the chart sets `tracing.endpoint` (settings.TracingSettings): the endpoint is the
platform's, never one from an InferenceService, and the operator is the only process that sends
there. Each reconcile of an InferenceService is a `reconcile` span (namespace, name, generation)
with one event per write it made (`Created Deployment demo`: verb, kind, name); a reconcile that
raised carries the error. The batch processor is bounded (`MAX_QUEUED_SPANS`, dropped beyond),
and an export gives up after `EXPORT_TIMEOUT_S`, so a collector that is down costs spans only.

JSON logs (`run --log-format json`) carry `trace_id` and `span_id` when logged inside a span
(`TraceIds`), so a reconcile's log lines and its trace find each other.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from .settings import TracingSettings

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from .reconcile import Change

log = logging.getLogger(__name__)

SERVICE_NAME = "rocm-inference-operator"
MAX_QUEUED_SPANS = 2048
MAX_EXPORT_BATCH = 256
SCHEDULE_DELAY_MS = 1000
EXPORT_TIMEOUT_S = 5.0
SHUTDOWN_TIMEOUT_S = 2.0


class Tracing:
    """The operator's tracer provider, its own (not the process-global one)."""

    def __init__(self, settings: TracingSettings) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        from . import __version__

        self.provider: TracerProvider = TracerProvider(
            resource=Resource.create({"service.name": SERVICE_NAME, "service.version": __version__}),
            sampler=ParentBased(TraceIdRatioBased(settings.sampling_ratio)),
        )
        self.provider.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=settings.endpoint, timeout=EXPORT_TIMEOUT_S),
                max_queue_size=MAX_QUEUED_SPANS,
                max_export_batch_size=MAX_EXPORT_BATCH,
                schedule_delay_millis=SCHEDULE_DELAY_MS,
            )
        )
        self.tracer = self.provider.get_tracer("inference_operator")

    def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Export what is queued for at most `timeout_s`; the exporter's thread is a daemon."""
        stopper = threading.Thread(target=self.provider.shutdown, name="tracing-shutdown", daemon=True)
        stopper.start()
        stopper.join(timeout_s)


def start(settings: TracingSettings) -> Tracing | None:
    """The operator's tracing when the chart gave an endpoint, else None (off)."""
    if not settings.endpoint:
        return None
    log.info("tracing reconciles to %s (sampling %.3g)", settings.endpoint, settings.sampling_ratio)
    return Tracing(settings)


@contextlib.contextmanager
def reconcile_span(tracing: Tracing | None, namespace: str, name: str, generation: object) -> Iterator[None]:
    """The span of one reconcile, current while it runs (nothing when tracing is off)."""
    if tracing is None:
        yield
        return
    attributes: dict[str, Any] = {"k8s.namespace.name": namespace, "inference.service": name}
    if isinstance(generation, int):
        attributes["k8s.object.generation"] = generation
    with tracing.tracer.start_as_current_span("reconcile", kind=trace.SpanKind.INTERNAL, attributes=attributes):
        yield


def record_writes(changes: Iterable[Change]) -> None:
    """An event per write on the current reconcile's span (a no-op outside one)."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    count = 0
    for change in changes:
        count += 1
        attributes = {"k8s.verb": change.action.value, "k8s.kind": change.kind, "k8s.name": change.name}
        span.add_event(f"{change.action.value} {change.kind} {change.name}", attributes)
    span.set_attribute("inference.writes", count)


class TraceIds(logging.Filter):
    """Adds `trace_id` and `span_id` (hex, as W3C and OTLP write them) to a record logged inside
    a span; the JSON formatter writes them as fields."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            record.trace_id = format(context.trace_id, "032x")
            record.span_id = format(context.span_id, "016x")
        return True
