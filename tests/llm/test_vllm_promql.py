"""The LLM metrics' PromQL on a real Prometheus, against vLLM's own metric names and labels.

A synthetic exporter plays vLLM pods (`vllm:*` series labelled `model_name` and `engine`, as
vLLM 0.32 exports them) whose histograms grow at known rates, so every query has an exact
answer: pooled quantiles across pods, per-pod averages, percent of KV cache, decoys in other
namespaces and models, and an idle service.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from inference_operator.models import Engine, Metric
from inference_operator.prometheus import promql
from tests.autoscaler.conftest import Prometheus, scraping_pods
from tests.http_stub import Exporter

# vLLM's own bucket bounds for TTFT (a subset) and the request latency.
BUCKETS = (0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
WINDOW = 5


def histogram(name: str, model: str, rate: float, bucket: float, elapsed: float) -> list[str]:
    """A histogram whose observations (`rate` per second) all fall just under `bucket`."""
    count = rate * elapsed
    labels = f'engine="0",model_name="{model}"'
    lines = [f'{name}_bucket{{{labels},le="{le}"}} {count if le >= bucket else 0}' for le in BUCKETS]
    return [
        *lines,
        f'{name}_bucket{{{labels},le="+Inf"}} {count}',
        f"{name}_count{{{labels}}} {count}",
        f"{name}_sum{{{labels}}} {count * bucket * 0.9}",
    ]


def exposition(model: str, rps: float, ttft: float, itl: float, e2e: float, waiting: float, kv: float, t: float) -> str:
    lines = [
        f'vllm:num_requests_waiting{{engine="0",model_name="{model}"}} {waiting}',
        f'vllm:num_requests_running{{engine="0",model_name="{model}"}} 1',
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="{model}"}} {kv}',
        *histogram("vllm:time_to_first_token_seconds", model, rps, ttft, t),
        # 20 output tokens per request: 19 inter-token gaps each.
        *histogram("vllm:inter_token_latency_seconds", model, rps * 19, itl, t),
        *histogram("vllm:e2e_request_latency_seconds", model, rps, e2e, t),
    ]
    return "\n".join(lines) + "\n"


PODS = {
    # Two pods of ml/llama: 3 req/s with TTFT just under 1 s, 1 req/s just under 80 ms.
    "/pod-a": ("ml", "llama-a", dict(model="llama", rps=3, ttft=1.0, itl=0.04, e2e=2.5, waiting=6, kv=0.5)),
    "/pod-b": ("ml", "llama-b", dict(model="llama", rps=1, ttft=0.08, itl=0.02, e2e=1.0, waiting=2, kv=0.3)),
    # Decoys: the same model name in another namespace, another model in the same namespace.
    "/other-ns": ("other", "llama-c", dict(model="llama", rps=50, ttft=10, itl=1, e2e=10, waiting=90, kv=1)),
    "/other-model": ("ml", "mistral-a", dict(model="mistral", rps=50, ttft=10, itl=1, e2e=10, waiting=90, kv=1)),
    # Up, but has served nothing.
    "/idle": ("ml", "idle-a", dict(model="idle", rps=0, ttft=0.1, itl=0.1, e2e=0.1, waiting=0, kv=0)),
}


def page(path: str, elapsed: float) -> str | None:
    """The exposition each fake pod serves."""
    return exposition(**PODS[path][2], t=elapsed) if path in PODS else None


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    tmp = tmp_path_factory.mktemp("vllm-promql")
    with (
        Exporter(page) as exporter,
        scraping_pods(tmp, exporter.address, PODS, "vllm:num_requests_waiting", WINDOW) as prom,
    ):
        yield prom


@pytest.mark.integration
@pytest.mark.slow
def test_vllm_metrics_answer_on_real_prometheus(prometheus: Prometheus) -> None:
    def value(metric: Metric, model: str = "llama") -> float | None:
        return prometheus.value(promql.metric_query(metric, "ml", model, WINDOW))

    # TTFT p95 of the pooled distribution: 4 req/s, 3 in (0.75, 1.0] s and 1 in (0.06, 0.08]:
    # rank 3.8 of 4 falls in the (0.75, 1.0] bucket at 0.75 + 0.25 * (3.8 - 1) / 3 = 0.9833 s.
    # Averaging per-pod p95s instead would say about 0.53 s.
    assert value(Metric.TTFT_P95_MS) == pytest.approx(983.3, abs=2.0)
    # ITL: 57 gaps/s in (0.02, 0.04] and 19 in (0.01, 0.02]: rank 72.2 of 76 → 0.02 + 0.02 * 53.2/57.
    assert value(Metric.ITL_P95_MS) == pytest.approx(38.67, abs=0.3)
    # E2E: 3 in (1.0, 2.5], 1 in (0.75, 1.0]: rank 3.8 → 1.0 + 1.5 * 2.8/3 = 2.4 s.
    assert value(Metric.E2E_LATENCY_P95_MS) == pytest.approx(2400.0, abs=5.0)
    assert value(Metric.REQUESTS_WAITING) == pytest.approx(4.0)  # (6 + 2) / 2 pods
    assert value(Metric.KV_CACHE_USAGE) == pytest.approx(40.0)  # percent: (0.5 + 0.3) / 2

    # Up but idle: latency 0, not NaN (which would read as missing data and hold the service big).
    for metric in (Metric.TTFT_P95_MS, Metric.ITL_P95_MS, Metric.E2E_LATENCY_P95_MS):
        assert value(metric, "idle") == 0.0
    # Not scraped at all: no series, so the autoscaler holds instead of scaling down.
    assert value(Metric.TTFT_P95_MS, "ghost") is None
    assert prometheus.value(promql.data_age_seconds("ml", "ghost", Engine.VLLM)) is None
    age = prometheus.value(promql.data_age_seconds("ml", "llama", Engine.VLLM))
    assert age is not None and 0 <= age < 5
    # The p95 shown next to the scaling metric is vLLM's end-to-end request latency.
    latency = prometheus.value(promql.request_latency_ms(Engine.VLLM, "ml", "llama", WINDOW))
    assert latency == pytest.approx(2400.0, abs=5.0)
