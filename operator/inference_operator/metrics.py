"""The operator's own Prometheus metrics: handler runs, their errors and durations, and
what the autoscaler decided.

Everything lives in one `CollectorRegistry` (not prometheus_client's process-global default),
so tests and embedders can read the values without interference; `serve()` exposes it over
HTTP (`inference-operator run --metrics-port`), together with the process and platform
collectors, for the chart's ServiceMonitor and PrometheusRule.

Names follow Prometheus conventions; the dashboards and alerts in
charts/rocm-inference-operator rely on them:

- `inference_operator_reconciles_total{handler,result}`: result is success | retry | failed | error
- `inference_operator_reconcile_errors_total{handler,reason}`: reason e.g. api_409, spec (a
  SpecError behind a PermanentError), temporary, runtime_error
- `inference_operator_reconcile_duration_seconds{handler}` (histogram)
- `inference_operator_autoscaler_decisions_total{namespace,name,direction}`: up | down | hold
- `inference_operator_autoscaler_{desired,current,min,max}_replicas{namespace,name}`
- `inference_operator_autoscaler_metric_value` / `..._target_value` `{namespace,name,metric}`
- `inference_operator_rollouts_total{namespace,name,event}`: canary rollouts started, stepped,
  promoted and rolled_back
- `inference_operator_build_info{version}` (always 1)
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

import kopf
import prometheus_client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from . import __version__

REGISTRY = CollectorRegistry(auto_describe=True)
prometheus_client.ProcessCollector(registry=REGISTRY)
prometheus_client.PlatformCollector(registry=REGISTRY)

RECONCILES = Counter(
    "inference_operator_reconciles_total",
    "Handler runs by handler and outcome (success, retry, failed = permanent, error = unexpected).",
    ["handler", "result"],
    registry=REGISTRY,
)
ERRORS = Counter(
    "inference_operator_reconcile_errors_total",
    "Handler runs that raised, by handler and reason (api_<status>, spec, temporary, ...).",
    ["handler", "reason"],
    registry=REGISTRY,
)
DURATION = Histogram(
    "inference_operator_reconcile_duration_seconds",
    "Wall time of one handler run, including the API calls it makes.",
    ["handler"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    registry=REGISTRY,
)
AUTOSCALER_DECISIONS = Counter(
    "inference_operator_autoscaler_decisions_total",
    "Autoscaler decisions per InferenceService: up, down or hold.",
    ["namespace", "name", "direction"],
    registry=REGISTRY,
)
_SCALE_LABELS = ["namespace", "name"]
AUTOSCALER_DESIRED = Gauge(
    "inference_operator_autoscaler_desired_replicas",
    "Replicas the autoscaler last asked for.",
    _SCALE_LABELS,
    registry=REGISTRY,
)
AUTOSCALER_CURRENT = Gauge(
    "inference_operator_autoscaler_current_replicas",
    "Replicas when the autoscaler last decided.",
    _SCALE_LABELS,
    registry=REGISTRY,
)
AUTOSCALER_MIN = Gauge(
    "inference_operator_autoscaler_min_replicas", "spec.autoscaling.minReplicas.", _SCALE_LABELS, registry=REGISTRY
)
AUTOSCALER_MAX = Gauge(
    "inference_operator_autoscaler_max_replicas", "spec.autoscaling.maxReplicas.", _SCALE_LABELS, registry=REGISTRY
)
AUTOSCALER_VALUE = Gauge(
    "inference_operator_autoscaler_metric_value",
    "The observed value of the scaling metric.",
    [*_SCALE_LABELS, "metric"],
    registry=REGISTRY,
)
AUTOSCALER_TARGET = Gauge(
    "inference_operator_autoscaler_target_value",
    "spec.autoscaling.target for the scaling metric.",
    [*_SCALE_LABELS, "metric"],
    registry=REGISTRY,
)
ROLLOUTS = Counter(
    "inference_operator_rollouts_total",
    "Canary rollout events per InferenceService: started, stepped, promoted, rolled_back.",
    ["namespace", "name", "event"],
    registry=REGISTRY,
)
BUILD_INFO = Gauge(
    "inference_operator_build_info", "The running operator's version (always 1).", ["version"], registry=REGISTRY
)
BUILD_INFO.labels(version=__version__).set(1)

F = TypeVar("F", bound=Callable[..., Any])


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _api_status(exc: BaseException) -> int | None:
    for candidate in (exc, exc.__cause__):
        if isinstance(candidate, ApiException) and candidate.status:
            return int(candidate.status)
    return None


def classify(exc: BaseException) -> tuple[str, str]:
    """(result, reason) for an exception that ended a handler run."""
    status = _api_status(exc)
    if isinstance(exc, kopf.PermanentError):
        result = "failed"
    elif isinstance(exc, kopf.TemporaryError):
        result = "retry"
    else:
        result = "error"
    if status is not None:
        return result, f"api_{status}"
    cause = exc.__cause__
    if isinstance(exc, kopf.PermanentError | kopf.TemporaryError):
        if cause is not None:
            return result, _snake(type(cause).__name__).removesuffix("_error") or "unknown"
        return result, "permanent" if result == "failed" else "temporary"
    return result, _snake(type(exc).__name__)


def _finish(handler: str, started: float, exc: BaseException | None) -> None:
    DURATION.labels(handler=handler).observe(time.perf_counter() - started)
    if exc is None:
        RECONCILES.labels(handler=handler, result="success").inc()
        return
    result, reason = classify(exc)
    RECONCILES.labels(handler=handler, result=result).inc()
    ERRORS.labels(handler=handler, reason=reason).inc()


def instrumented(handler: str) -> Callable[[F], F]:
    """Count and time every run of a (sync or async) kopf handler under the label `handler`.

    Put it *below* the `@kopf.on...` decorators: kopf then registers the wrapper, whose name
    (so kopf's handler id and progress annotations) is that of the wrapped function.
    A cancelled run (operator shutdown) is timed but counted under no result.
    """

    def decorate(fn: F) -> F:
        if asyncio.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    value = await fn(*args, **kwargs)
                except asyncio.CancelledError:
                    DURATION.labels(handler=handler).observe(time.perf_counter() - started)
                    raise
                except Exception as exc:
                    _finish(handler, started, exc)
                    raise
                _finish(handler, started, None)
                return value

            return run_async  # type: ignore[return-value]

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                value = fn(*args, **kwargs)
            except Exception as exc:
                _finish(handler, started, exc)
                raise
            _finish(handler, started, None)
            return value

        return run  # type: ignore[return-value]

    return decorate


def record_autoscaler_decision(
    namespace: str,
    name: str,
    *,
    current: int,
    desired: int,
    min_replicas: int,
    max_replicas: int,
    metric: str,
    value: float | None,
    target: float,
) -> str:
    """Export one autoscaler decision; returns its direction (up, down or hold).

    `value` is None when the metric could not be read (no traffic, Prometheus down): the
    decision is still counted, the value gauge keeps its last reading.
    """
    direction = "up" if desired > current else "down" if desired < current else "hold"
    AUTOSCALER_DECISIONS.labels(namespace=namespace, name=name, direction=direction).inc()
    AUTOSCALER_DESIRED.labels(namespace=namespace, name=name).set(desired)
    AUTOSCALER_CURRENT.labels(namespace=namespace, name=name).set(current)
    AUTOSCALER_MIN.labels(namespace=namespace, name=name).set(min_replicas)
    AUTOSCALER_MAX.labels(namespace=namespace, name=name).set(max_replicas)
    AUTOSCALER_TARGET.labels(namespace=namespace, name=name, metric=metric).set(target)
    if value is not None:
        AUTOSCALER_VALUE.labels(namespace=namespace, name=name, metric=metric).set(value)
    return direction


def forget_service(namespace: str, name: str) -> None:
    """Drop the per-InferenceService series (after it is deleted or stops autoscaling)."""
    for family in (
        AUTOSCALER_DECISIONS,
        AUTOSCALER_DESIRED,
        AUTOSCALER_CURRENT,
        AUTOSCALER_MIN,
        AUTOSCALER_MAX,
        AUTOSCALER_VALUE,
        AUTOSCALER_TARGET,
    ):
        # labels are (namespace, name, ...): remove every child of this service.
        for labels in list(family._metrics):  # noqa: SLF001  (prometheus_client has no public lister)
            if labels[:2] == (namespace, name):
                family.remove(*labels)


def serve(port: int, address: str = "0.0.0.0") -> Any:
    """Start the /metrics HTTP server in a daemon thread; returns prometheus_client's server."""
    server, _thread = prometheus_client.start_http_server(port, addr=address, registry=REGISTRY)
    return server
