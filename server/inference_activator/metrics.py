"""The activator's metrics, in a registry of its own, and the app that exposes them.

A service's series exist while it has a route (and a minute after, while its last requests are
answered); then they are removed, so a cluster's services coming and going at zero do not pile
up series in the activator for ever.
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .routes import ServiceKey

#: How a held request ended.
OUTCOMES = ("served", "timeout", "refused", "gone")
#: From a warm replica's first answer to the longest cold start a request may wait (one hour).
WAIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 90, 120, 180, 240, 300, 450, 600, 900, 1800, 3600)


class ActivatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        labels = ["namespace", "service"]
        self.held = Gauge(
            "activator_held_requests",
            "Requests held until the service has a ready replica.",
            labels,
            registry=self.registry,
        )
        self.wait = Histogram(
            "activator_wait_seconds",
            "How long a request was held, by how its wait ended (served, timeout, refused, gone).",
            [*labels, "outcome"],
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        self.wakes = Counter(
            "activator_wakes",
            "Wake requests sent for the service (its wake annotation patched).",
            labels,
            registry=self.registry,
        )
        self.requests = Counter(
            "activator_requests",
            "Requests for the service, by the status answered.",
            [*labels, "code"],
            registry=self.registry,
        )
        self._codes: dict[ServiceKey, set[str]] = {}

    def routed(self, key: ServiceKey) -> None:
        """Start the service's gauges and counters at 0, so that the first wake or timeout is an
        increase (a series that appears at 1 has none: `increase()` needs a sample before it, and
        the alert on timeouts would miss the first one)."""
        self.held.labels(key.namespace, key.name).set(0)
        self.wakes.labels(key.namespace, key.name)
        for outcome in OUTCOMES:
            self.wait.labels(key.namespace, key.name, outcome)

    def answered(self, key: ServiceKey, code: int) -> None:
        self._codes.setdefault(key, set()).add(str(code))
        self.requests.labels(key.namespace, key.name, str(code)).inc()

    def waited(self, key: ServiceKey, outcome: str, seconds: float) -> None:
        self.wait.labels(key.namespace, key.name, outcome).observe(seconds)

    def forget(self, key: ServiceKey) -> None:
        """Remove every series of the service."""
        with contextlib.suppress(KeyError):
            self.held.remove(key.namespace, key.name)
        with contextlib.suppress(KeyError):
            self.wakes.remove(key.namespace, key.name)
        for outcome in OUTCOMES:
            with contextlib.suppress(KeyError):
                self.wait.remove(key.namespace, key.name, outcome)
        for code in self._codes.pop(key, set()):
            with contextlib.suppress(KeyError):
                self.requests.remove(key.namespace, key.name, code)
