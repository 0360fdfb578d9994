"""PromQL for each autoscaling metric, over the pods of one InferenceService.

Pure string builders, shared by the built-in loop and the HPA/KEDA emitters, so every mode
scales on the same numbers. Series are selected by the `namespace` target label Prometheus
adds and the server's own model label (`model` for the model server, `model_name` for vLLM,
whose metrics are read under their own `vllm:*` names). Per-pod metrics are averaged over
scrape targets (`instance`), since HPA's formula wants a per-replica value.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..models import DEFAULT_ENGINE, ENGINES, Engine, Metric

LATENCY_HISTOGRAM = "model_server_request_duration_seconds"
REQUESTS_TOTAL = "model_server_requests_total"
QUEUE_DEPTH = "model_server_queue_depth"
INFLIGHT = "model_server_inflight_requests"
GPU_UTILIZATION = "model_server_gpu_utilization_percent"

# vLLM's metrics (as its OpenAI server exports them, V1 engine; the version tested is
# scripts/setup-vllm.sh's).
VLLM_TTFT = "vllm:time_to_first_token_seconds"
VLLM_ITL = "vllm:inter_token_latency_seconds"
VLLM_E2E = "vllm:e2e_request_latency_seconds"
VLLM_WAITING = "vllm:num_requests_waiting"
VLLM_RUNNING = "vllm:num_requests_running"
VLLM_KV_CACHE = "vllm:kv_cache_usage_perc"
VLLM_MODEL_LABEL = "model_name"


@dataclass(frozen=True)
class EngineSeries:
    """The series of one engine that the engine-independent queries below read."""

    # The label its series name the served model by.
    model_label: str
    # The histogram of its request latency in seconds (vLLM: end to end), for status.
    request_latency: str
    # A counter of the requests it answered (a histogram's `_count`, or a counter).
    answered: str
    # Gauges that add up to the requests it holds now.
    holding: tuple[str, ...]
    # Series exported from the first scrape on, first the one always there: whether, and how
    # recently, the service is scraped at all.
    scraped: tuple[str, ...]
    # Its answers counted by status `code`, for a canary's error ratio; None: it counts none
    # (vLLM), and its canaries are judged on latency alone.
    answers_by_code: str | None = None


SERIES: dict[Engine, EngineSeries] = {
    Engine.MODEL_SERVER: EngineSeries(
        model_label="model",
        request_latency=LATENCY_HISTOGRAM,
        answered=REQUESTS_TOTAL,
        holding=(INFLIGHT,),
        scraped=(QUEUE_DEPTH, REQUESTS_TOTAL),
        answers_by_code=REQUESTS_TOTAL,
    ),
    Engine.VLLM: EngineSeries(
        model_label=VLLM_MODEL_LABEL,
        request_latency=VLLM_E2E,
        answered=f"{VLLM_E2E}_count",
        holding=(VLLM_RUNNING, VLLM_WAITING),
        scraped=(VLLM_WAITING, VLLM_RUNNING),
    ),
}

# Each latency metric: the histogram it is a quantile of, and the quantile.
LATENCIES: dict[Metric, tuple[str, float]] = {
    Metric.LATENCY_P95_MS: (LATENCY_HISTOGRAM, 0.95),
    Metric.LATENCY_P99_MS: (LATENCY_HISTOGRAM, 0.99),
    Metric.TTFT_P95_MS: (VLLM_TTFT, 0.95),
    Metric.ITL_P95_MS: (VLLM_ITL, 0.95),
    Metric.E2E_LATENCY_P95_MS: (VLLM_E2E, 0.95),
}


def exporter(metric: Metric) -> Engine:
    """The engine whose series a metric is read from."""
    return next(engine for engine, traits in ENGINES.items() if metric in traits.metrics)


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def selector(namespace: str, model: str, model_label: str = "model", pods: str | None = None) -> str:
    """The service's series; with `pods`, those of the pods whose name matches it (a role's)."""
    matched = ",pod=~" + _quote(pods) if pods is not None else ""
    return "{namespace=" + _quote(namespace) + "," + model_label + "=" + _quote(model) + matched + "}"


def _engine_selector(engine: Engine, namespace: str, model: str, pods: str | None = None) -> str:
    """The service's series of `engine`, by that engine's model label."""
    return selector(namespace, model, SERIES[engine].model_label, pods)


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


def queue_depth(namespace: str, model: str, window_seconds: int) -> str:
    """Queued requests per pod, averaged over the window (a single gauge reading is noisy)."""
    return _per_pod_mean(QUEUE_DEPTH, selector(namespace, model), window_seconds)


def _per_pod_mean(gauge: str, sel: str, window_seconds: int) -> str:
    """`gauge` summed per pod (scrape target), averaged over the window, then over the pods."""
    return f"avg(sum by (instance) (avg_over_time({gauge}{sel}[{window_seconds}s])))"


def rps(namespace: str, model: str, window_seconds: int) -> str:
    """Requests per second per pod, all response codes (rejections are load too)."""
    sel = selector(namespace, model)
    return f"avg(sum by (instance) (rate({REQUESTS_TOTAL}{sel}[{window_seconds}s])))"


def gpu_utilization(namespace: str, model: str, window_seconds: int) -> str:
    """Mean GPU busy percent over the service's pods' GPUs.

    The GPU gauge carries only a `gpu` label, so it is matched to this service's pods through
    a series that does carry `model`, on the scrape target.
    """
    sel = selector(namespace, model)
    ns = "{namespace=" + _quote(namespace) + "}"
    return (
        f"avg(avg_over_time({GPU_UTILIZATION}{ns}[{window_seconds}s])"
        f" and on (instance) ({QUEUE_DEPTH}{sel} or {INFLIGHT}{sel}))"
    )


def requests_waiting(namespace: str, model: str, window_seconds: int, pods: str | None = None) -> str:
    """Requests queued in vLLM's scheduler per pod (not yet running), averaged over the window."""
    return _per_pod_mean(VLLM_WAITING, selector(namespace, model, VLLM_MODEL_LABEL, pods), window_seconds)


def kv_cache_usage(namespace: str, model: str, window_seconds: int, pods: str | None = None) -> str:
    """KV-cache use in percent (vLLM exports a 0..1 fraction), averaged over pods and window."""
    return "100 * " + _per_pod_mean(VLLM_KV_CACHE, selector(namespace, model, VLLM_MODEL_LABEL, pods), window_seconds)


def metric_query(metric: Metric, namespace: str, model: str, window_seconds: int, pods: str | None = None) -> str:
    """The metric over the service's pods, or, with `pods` (a regex of pod names), over those
    alone: a disaggregated service's role, whose pods serve the same model as the other role's."""
    if metric in LATENCIES:
        histogram, quantile = LATENCIES[metric]
        engine = exporter(metric)
        sel = _engine_selector(engine, namespace, model, pods)
        return _quantile_ms(histogram, quantile, sel, SERIES[engine].scraped[0], window_seconds)
    if metric == Metric.REQUESTS_WAITING:
        return requests_waiting(namespace, model, window_seconds, pods)
    if metric == Metric.KV_CACHE_USAGE:
        return kv_cache_usage(namespace, model, window_seconds, pods)
    if pods is not None:
        raise ValueError(f"metric {metric!r} is not read per role")
    if metric == Metric.QUEUE_DEPTH:
        return queue_depth(namespace, model, window_seconds)
    if metric == Metric.RPS:
        return rps(namespace, model, window_seconds)
    if metric == Metric.GPU_UTILIZATION:
        return gpu_utilization(namespace, model, window_seconds)
    raise ValueError(f"no query for metric {metric!r}")


def request_latency_ms(engine: Engine, namespace: str, model: str, window_seconds: int) -> str:
    """p95 request latency (vLLM: end to end), shown in status next to the scaling metric."""
    series, sel = SERIES[engine], _engine_selector(engine, namespace, model)
    return _quantile_ms(series.request_latency, 0.95, sel, series.scraped[0], window_seconds)


def data_age_seconds(namespace: str, model: str, engine: Engine = DEFAULT_ENGINE) -> str:
    """Seconds since the newest scraped sample of the service's always-present series.

    timestamp() of a plain selector returns the sample's own time; scrapes that fail mark
    series stale, so a dead service answers an empty vector rather than an old age.
    """
    series, sel = SERIES[engine], _engine_selector(engine, namespace, model)
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
    histogram, quantile = LATENCIES[metric]
    sel = _canary_selector(namespace, model, name, SERIES[exporter(metric)].model_label)
    return f"histogram_quantile({quantile}, sum by (le) (rate({histogram}_bucket{sel}[{window_seconds}s]))) * 1000"


def canary_requests(engine: Engine, namespace: str, model: str, name: str, window_seconds: int) -> str:
    """Requests the canary answered in the window (vLLM: requests it finished)."""
    series = SERIES[engine]
    sel = _canary_selector(namespace, model, name, series.model_label)
    return f"sum(increase({series.answered}{sel}[{window_seconds}s]))"


def canary_error_ratio(engine: Engine, namespace: str, model: str, name: str, window_seconds: int) -> str | None:
    """The share of the canary's answers that were 5xx, 0 when none was; None for an engine that
    counts no answers by code."""
    series = SERIES[engine]
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
    series, sel = SERIES[engine], _engine_selector(engine, namespace, model)
    answered = f"(sum(increase({series.answered}{sel}[{window_seconds}s])) or vector(0))"
    return " + ".join([answered, *(f"sum({gauge}{sel})" for gauge in series.holding)])
