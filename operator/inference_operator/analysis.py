"""The canary's check, read from Prometheus: its latency quantile, 5xx share and request count
over the analysis window, from its own pods only (promql.canary_*). The I/O half of the
analysis; rollout.py judges the numbers.

The analysis queries the autoscaler's Prometheus unless it names its own. The autoscaler's
credentials (`autoscaling.prometheusAuth`) go with it only to that same URL, under the same
rules: never to a URL the analysis names, which could be anyone's."""

from __future__ import annotations

import time

from .credentials import check_url, url_allowed
from .models import DEFAULT_PROMETHEUS_URL, ENGINES, CanarySpec, InferenceServiceSpec, Metric, PrometheusAuth
from .prometheus import promql
from .prometheus.client import PrometheusClient, PrometheusError, Sample
from .prometheus.clients import PrometheusClients
from .rollout import Check
from .settings import CredentialPolicy


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
    return ENGINES[spec.runtime.engine].traits.canary_metrics[0]


def check_allowed(url: str, policy: CredentialPolicy) -> None:
    if not url_allowed(url, policy.allowed_urls):
        raise AnalysisRefused(f"rollout.canary.analysis: {url} is not among the operator's allowed Prometheus URLs")


def credentials_for(spec: InferenceServiceSpec, url: str, policy: CredentialPolicy) -> PrometheusAuth | None:
    """The autoscaler's credentials when the analysis queries the autoscaler's own URL (and the
    rules let that URL have them: CredentialsRefused otherwise); None for any other URL."""
    scaling = spec.autoscaling
    if scaling is None or scaling.prometheus_auth is None or url != scaling.prometheus_url:
        return None
    check_url(scaling, policy)
    return scaling.prometheus_auth


async def analysis_client(
    clients: PrometheusClients, spec: InferenceServiceSpec, canary: CanarySpec, policy: CredentialPolicy
) -> PrometheusClient:
    """The client the analysis queries with: AnalysisRefused for a URL off the allow-list,
    CredentialsRefused (or the Secret's own errors, see PrometheusClients.get) for credentials
    the rules refuse."""
    url = prometheus_url(spec, canary)
    check_allowed(url, policy)
    return await clients.get(url, credentials_for(spec, url, policy))


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
    error_query = promql.canary_error_ratio(engine, namespace, model, name, window)
    errors = await _query(client, error_query) if error_query else None
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
