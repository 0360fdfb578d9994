"""PromQL for each autoscaling metric, over the pods of one InferenceService.

Pure string builders, shared by the built-in loop and the HPA/KEDA emitters, so every mode
scales on the same numbers. Each engine names its series (`engines.base.Series`: the model
label, the histograms and gauges each metric is read from); series are selected by the
`namespace` target label Prometheus adds and the engine's model label. Per-pod metrics are
averaged over scrape targets (`instance`), since HPA's formula wants a per-replica value.
"""

from __future__ import annotations

from ..engines.base import GpuGauge, PodGauge, PodRate, Quantile, Series
from ..models import DEFAULT_ENGINE, ENGINES, Engine, Metric


def _series(engine: Engine) -> Series:
    return ENGINES[engine].series


def exporter(metric: Metric) -> Engine:
    """The engine whose series a metric is read from."""
    return next(engine for engine, serving in ENGINES.items() if metric in serving.traits.metrics)


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def selector(namespace: str, model: str, model_label: str = "model", pods: str | None = None) -> str:
    """The service's series; with `pods`, those of the pods whose name matches it (a role's)."""
    matched = ",pod=~" + _quote(pods) if pods is not None else ""
    return "{namespace=" + _quote(namespace) + "," + model_label + "=" + _quote(model) + matched + "}"


def _engine_selector(engine: Engine, namespace: str, model: str, pods: str | None = None) -> str:
    """The service's series of `engine`, by that engine's model label."""
    return selector(namespace, model, _series(engine).model_label, pods)


def workload_pods(workload: str) -> str:
    """A Deployment's pods by name (WORKLOAD-<template hash>-<suffix>), as the `pod` target label
    of the Prometheus Operator's and most scrape configs gives them."""
    return f"{workload}-[a-z0-9]+-[a-z0-9]+"


def _quantile_ms(histogram: str, quantile: float, sel: str, present: str, window_seconds: int) -> str:
    """A quantile of `histogram` in ms; 0 when the service is up but served nothing in the window.

    histogram_quantile() of all-zero rates is NaN (and the histogram does not exist before the
    first request), which would read as "no data" and hold an idle service at its peak size;
    `>= 0` drops the NaN and the `or` branch answers 0 as long as the always-present gauge
    `present` is scraped at all. No series (nothing scraped) still gives an empty result.
    """
    return (
        f"(histogram_quantile({quantile}, sum by (le) (rate({histogram}_bucket{sel}[{window_seconds}s])))"
        f" * 1000 >= 0) or (sum({present}{sel}) * 0)"
    )


def _per_pod_mean(gauge: str, sel: str, window_seconds: int) -> str:
    """`gauge` summed per pod (scrape target), averaged over the window, then over the pods."""
    return f"avg(sum by (instance) (avg_over_time({gauge}{sel}[{window_seconds}s])))"


def _gpu_mean(source: GpuGauge, namespace: str, sel: str, window_seconds: int) -> str:
    """Mean GPU busy percent over the service's pods' GPUs.

    The GPU gauge carries no model label, so it is matched to this service's pods through
    series that do, on the scrape target.
    """
    ns = "{namespace=" + _quote(namespace) + "}"
    pods = " or ".join(f"{name}{sel}" for name in source.on)
    return f"avg(avg_over_time({source.gauge}{ns}[{window_seconds}s]) and on (instance) ({pods}))"


def metric_query(
    metric: Metric,
    namespace: str,
    model: str,
    window_seconds: int,
    engine: Engine | None = None,
    pods: str | None = None,
) -> str:
    """The scaling metric as `engine` (by default the first that exports it) exports it: a latency
    quantile in ms (0 while idle), a gauge or a rate per pod, or the GPUs' use; with `pods` (a
    regex of pod names), over those pods alone: a disaggregated service's role, whose pods serve
    the same model as the other role's."""
    engine = exporter(metric) if engine is None else engine
    series, sel = _series(engine), _engine_selector(engine, namespace, model, pods)
    source = series.metrics[metric]
    if isinstance(source, Quantile):
        return _quantile_ms(source.histogram, source.quantile, sel, series.scraped[0], window_seconds)
    if isinstance(source, PodGauge):
        mean = _per_pod_mean(source.gauge, sel, window_seconds)
        return mean if source.scale == 1 else f"{source.scale} * {mean}"
    if isinstance(source, PodRate):
        # All response codes: rejections are load too.
        return f"avg(sum by (instance) (rate({source.counter}{sel}[{window_seconds}s])))"
    return _gpu_mean(source, namespace, sel, window_seconds)


def request_latency_ms(engine: Engine, namespace: str, model: str, window_seconds: int, pods: str | None = None) -> str:
    """p95 request latency (vLLM: end to end), shown in status next to the scaling metric; with
    `pods`, over those pods alone (a role's)."""
    series, sel = _series(engine), _engine_selector(engine, namespace, model, pods)
    return _quantile_ms(series.request_latency, 0.95, sel, series.scraped[0], window_seconds)


def data_age_seconds(namespace: str, model: str, engine: Engine = DEFAULT_ENGINE, pods: str | None = None) -> str:
    """Seconds since the newest scraped sample of the service's always-present series (with
    `pods`, of those pods': a role's, so a role whose pods are not scraped has no data).

    timestamp() of a plain selector returns the sample's own time; scrapes that fail mark
    series stale, so a dead service answers an empty vector rather than an old age.
    """
    series, sel = _series(engine), _engine_selector(engine, namespace, model, pods)
    return "time() - max(" + " or ".join(f"timestamp({name}{sel})" for name in series.scraped) + ")"


# --- canary analysis: the candidate's pods alone -------------------------------------------------


def canary_pods(name: str) -> str:
    """The canary Deployment's pods by name (NAME-canary-<template hash>-<suffix>), as the `pod`
    target label of the Prometheus Operator's and most scrape configs gives them."""
    return f"{name}-canary-[a-z0-9]+-[a-z0-9]+"


def _canary_selector(namespace: str, model: str, name: str, model_label: str, extra: str = "") -> str:
    pods = ",pod=~" + _quote(canary_pods(name))
    return "{namespace=" + _quote(namespace) + "," + model_label + "=" + _quote(model) + pods + extra + "}"


def canary_latency_ms(metric: Metric, namespace: str, model: str, name: str, window_seconds: int) -> str:
    """The canary's latency quantile in ms (no answer while it has served nothing)."""
    source = _series(exporter(metric)).metrics[metric]
    assert isinstance(source, Quantile), f"{metric} is no latency"
    histogram, quantile = source.histogram, source.quantile
    sel = _canary_selector(namespace, model, name, _series(exporter(metric)).model_label)
    return f"histogram_quantile({quantile}, sum by (le) (rate({histogram}_bucket{sel}[{window_seconds}s]))) * 1000"


def canary_requests(engine: Engine, namespace: str, model: str, name: str, window_seconds: int) -> str:
    """Requests the canary answered in the window (vLLM: requests it finished)."""
    series = _series(engine)
    sel = _canary_selector(namespace, model, name, series.model_label)
    return f"sum(increase({series.answered}{sel}[{window_seconds}s]))"


def canary_error_ratio(engine: Engine, namespace: str, model: str, name: str, window_seconds: int) -> str | None:
    """The share of the canary's answers that were 5xx, 0 when none was; None for an engine that
    counts no answers by code."""
    series = _series(engine)
    if series.answers_by_code is None:
        return None
    errors = _canary_selector(namespace, model, name, series.model_label, ',code=~"5.."')
    every = _canary_selector(namespace, model, name, series.model_label)
    return (
        f"(sum(rate({series.answers_by_code}{errors}[{window_seconds}s])) or vector(0))"
        f" / sum(rate({series.answers_by_code}{every}[{window_seconds}s]))"
    )


def recent_requests(engine: Engine, namespace: str, model: str, window_seconds: int) -> str:
    """Requests the service answered in the window plus those it is answering now (the idle
    rule of scaleToZero). A counter no request has created yet counts 0; the gauges must be
    scraped, so a service Prometheus does not see is never called idle."""
    series, sel = _series(engine), _engine_selector(engine, namespace, model)
    answered = f"(sum(increase({series.answered}{sel}[{window_seconds}s])) or vector(0))"
    return " + ".join([answered, *(f"sum({gauge}{sel})" for gauge in series.holding)])
