"""Prometheus metrics. The names and labels are a contract with the operator's
autoscaler and the Grafana dashboard: change them only together with those."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from .gpu import GpuCollector, GpuReader

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)

#: `version` label of requests that failed before a version was chosen.
UNRESOLVED = "unresolved"


@dataclass(slots=True)
class RequestTracker:
    """Filled in while a request is served: the version that served it (by the data plane) and
    the status code it was answered with (by the HTTP layer)."""

    version: str = UNRESOLVED
    code: int = 200


#: Request counts exported at 0 from a version's load: success and the server's own failures.
DECLARED_CODES = (200, 500, 503)


class ServerMetrics:
    """All server metrics, registered on one (injectable) registry."""

    def __init__(self, registry: CollectorRegistry = REGISTRY, *, gpu_reader: GpuReader | None = None) -> None:
        self.registry = registry
        labels = ["model", "version"]
        self.request_duration = Histogram(
            "model_server_request_duration_seconds",
            "Time from request receipt to response for successful inference requests.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.queue_wait = Histogram(
            "model_server_queue_wait_seconds",
            "Time a request waited in the batching queue.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.compute = Histogram(
            "model_server_compute_seconds",
            "Backend time per batch.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.batch_size = Histogram(
            "model_server_batch_size",
            "Rows per backend call.",
            labels,
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.requests = Counter(
            "model_server_requests_total",
            "Inference requests by HTTP status code.",
            [*labels, "code"],
            registry=registry,
        )
        self.inflight = Gauge(
            "model_server_inflight_requests",
            "Inference requests being handled.",
            ["model"],
            registry=registry,
        )
        self.queue_depth = Gauge(
            "model_server_queue_depth",
            "Requests waiting in batching queues.",
            ["model"],
            registry=registry,
        )
        # Labelled children by label values: `labels()` takes a lock and builds a key on
        # every call, a measurable share of a small model's request.
        self._inflight: dict[str, Gauge] = {}
        self._counted: dict[tuple[str, str, int], Counter] = {}
        self._timed: dict[tuple[str, str], Histogram] = {}
        self.gpu_exported = gpu_reader is not None
        if gpu_reader is not None:
            registry.register(GpuCollector(gpu_reader))

    def declare_model(self, model: str) -> None:
        """Export the per-model gauges at 0 before the first request arrives."""
        self.inflight.labels(model)
        self.queue_depth.labels(model)

    def batch_observer(self, model: str, version: str) -> BatchMetrics:
        """The version's batch metrics; its request counts of the codes alerts divide by start at
        0 with it: a series that appears at its first 500 has no earlier sample, so rate() and
        increase() over a burst that fits one scrape interval see nothing (the error-rate alert
        would never fire for it)."""
        for code in DECLARED_CODES:
            key = (model, version, code)
            if key not in self._counted:
                self._counted[key] = self.requests.labels(model, version, str(code))
        return BatchMetrics(self, model, version)

    @contextmanager
    def track(self, model: str) -> Iterator[RequestTracker]:
        """Count one inference request under the code the caller puts in the tracker; latency is
        recorded for successes only so fast rejections do not make the latency look better."""
        tracker = RequestTracker()
        inflight = self._inflight.get(model)
        if inflight is None:
            inflight = self._inflight[model] = self.inflight.labels(model)
        inflight.inc()
        started = time.perf_counter()
        try:
            yield tracker
        finally:
            inflight.dec()
            key = (model, tracker.version, tracker.code)
            counter = self._counted.get(key)
            if counter is None:
                counter = self._counted[key] = self.requests.labels(model, tracker.version, str(tracker.code))
            counter.inc()
            if tracker.code < 400:
                timed = self._timed.get(key[:2])
                if timed is None:
                    timed = self._timed[key[:2]] = self.request_duration.labels(model, tracker.version)
                timed.observe(time.perf_counter() - started)


class BatchMetrics:
    """The batcher's observer, bound to one model version's label values."""

    __slots__ = ("_batch", "_compute", "_depth", "_wait")

    def __init__(self, metrics: ServerMetrics, model: str, version: str) -> None:
        self._wait = metrics.queue_wait.labels(model, version)
        self._compute = metrics.compute.labels(model, version)
        self._batch = metrics.batch_size.labels(model, version)
        self._depth = metrics.queue_depth.labels(model)

    def queued(self, delta: int) -> None:
        self._depth.inc(delta)

    def queue_wait(self, seconds: float) -> None:
        self._wait.observe(seconds)

    def batch(self, rows: int, compute_seconds: float) -> None:
        self._batch.observe(rows)
        self._compute.observe(compute_seconds)
