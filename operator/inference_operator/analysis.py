"""The canary's check, read from Prometheus: its latency quantile, 5xx share and request count
over the analysis window, from its own pods only (promql.canary_*). The I/O half of the
analysis; rollout.py judges the numbers."""

from __future__ import annotations

import time

from .autoscaler import promql
from .autoscaler.prometheus import PrometheusClient, PrometheusError, Sample
from .credentials import CredentialPolicy, url_allowed
from .models import DEFAULT_PROMETHEUS_URL, CanarySpec, Engine, InferenceServiceSpec, Metric
from .rollout import Check


class AnalysisRefused(Exception):
    """The analysis may not query its Prometheus (a URL off the operator's allow-list)."""


def prometheus_url(spec: InferenceServiceSpec, canary: CanarySpec) -> str:
    """The analysis' own URL, else the autoscaler's, else the default in-cluster Prometheus."""
    if canary.analysis.prometheus_url:
        return canary.analysis.prometheus_url
    return spec.autoscaling.prometheus_url if spec.autoscaling else DEFAULT_PROMETHEUS_URL


def analysis_metric(spec: InferenceServiceSpec, canary: CanarySpec) -> Metric:
    if canary.analysis.metric is not None:
        return canary.analysis.metric
    return Metric.TTFT_P95_MS if spec.runtime.engine == Engine.VLLM else Metric.LATENCY_P95_MS


def check_allowed(url: str, policy: CredentialPolicy) -> None:
    if not url_allowed(url, policy.allowed_urls):
        raise AnalysisRefused(f"rollout.canary.analysis: {url} is not among the operator's allowed Prometheus URLs")


async def measure(
    client: PrometheusClient, spec: InferenceServiceSpec, canary: CanarySpec, namespace: str, name: str, model: str
) -> Check:
    """The canary's numbers now; a query Prometheus cannot answer gives no number (no verdict)."""
    window = canary.analysis.window_seconds
    engine = spec.runtime.engine
    latency = await _query(
        client, promql.canary_latency_ms(analysis_metric(spec, canary), namespace, model, name, window)
    )
    requests = await _query(client, promql.canary_requests(engine, namespace, model, name, window))
    errors = None
    if engine == Engine.MODEL_SERVER:
        errors = await _query(client, promql.canary_error_ratio(namespace, model, name, window))
    timestamps = [s.timestamp for s in (latency, requests, errors) if s is not None]
    age = time.time() - min(timestamps) if timestamps else float("inf")
    return Check(
        latency_ms=latency.value if latency else None,
        error_ratio=errors.value if errors else None,
        requests=requests.value if requests else None,
        age_seconds=max(0.0, age),
    )


async def _query(client: PrometheusClient, query: str) -> Sample | None:
    try:
        return await client.query(query)
    except PrometheusError:
        return None
