"""The autoscaler's PromQL: quoting, and what each query answers on a real Prometheus.

The semantic test scrapes a synthetic exporter whose counters grow at known rates, so every
query has an exact expected answer: aggregation across pods, per-pod averages, selection by
namespace and model, idle services, services with no series, and services whose scrapes fail.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from inference_operator.models import ENGINES, Engine, Metric
from inference_operator.prometheus import promql
from tests.autoscaler.conftest import Prometheus, scraping_pods
from tests.http_stub import Exporter
from testsupport.cluster import wait_for

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
WINDOW = 5


def test_autoscaler_selector_quotes_label_values() -> None:
    assert promql.selector("ml", "resnet") == '{namespace="ml",model="resnet"}'
    assert promql.selector("ml", 'a"b\\c') == '{namespace="ml",model="a\\"b\\\\c"}'


@pytest.mark.parametrize("metric", list(Metric))
def test_autoscaler_every_metric_has_a_query_selecting_the_service(metric: Metric) -> None:
    query = promql.metric_query(metric, "ml", "resnet", 60)
    # vLLM labels its series with model_name (its served model name).
    label = "model_name" if metric in ENGINES[Engine.VLLM].traits.metrics else "model"
    assert f'{{namespace="ml",{label}="resnet"}}' in query
    assert "[60s]" in query


def exposition(model: str, rps: float, latency_bucket: float, queue: float, gpus: list[float], elapsed: float) -> str:
    """Prometheus text for one pod whose requests all take just under `latency_bucket` seconds."""
    count = rps * elapsed
    lines = [
        f'model_server_queue_depth{{model="{model}"}} {queue}',
        f'model_server_inflight_requests{{model="{model}"}} 0',
        f'model_server_requests_total{{model="{model}",version="1",code="200"}} {count}',
    ]
    for le in BUCKETS:
        lines.append(
            f'model_server_request_duration_seconds_bucket{{le="{le}",model="{model}",version="1"}} '
            f"{count if le >= latency_bucket else 0}"
        )
    total = count * latency_bucket * 0.9
    lines += [
        f'model_server_request_duration_seconds_bucket{{le="+Inf",model="{model}",version="1"}} {count}',
        f'model_server_request_duration_seconds_count{{model="{model}",version="1"}} {count}',
        f'model_server_request_duration_seconds_sum{{model="{model}",version="1"}} {total}',
    ]
    lines += [f'model_server_gpu_utilization_percent{{gpu="{i}"}} {u}' for i, u in enumerate(gpus)]
    return "\n".join(lines) + "\n"


# path → (namespace, pod, exposition arguments)
PODS = {
    # Two pods of ml/resnet: 10 req/s just under 100 ms, 30 req/s just under 50 ms.
    "/pod-a": ("ml", "resnet-a", {"model": "resnet", "rps": 10, "latency_bucket": 0.1, "queue": 2, "gpus": [50]}),
    "/pod-b": ("ml", "resnet-b", {"model": "resnet", "rps": 30, "latency_bucket": 0.05, "queue": 4, "gpus": [60, 80]}),
    # Decoys: the same model in another namespace, another model in the same namespace.
    "/other-ns": (
        "other",
        "resnet-c",
        {"model": "resnet", "rps": 500, "latency_bucket": 5.0, "queue": 90, "gpus": [100]},
    ),
    "/other-model": ("ml", "bert-a", {"model": "bert", "rps": 500, "latency_bucket": 5.0, "queue": 90, "gpus": [100]}),
    # A service that is up but has served nothing since the exporter started.
    "/idle": ("ml", "idle-a", {"model": "idle", "rps": 0, "latency_bucket": 0.1, "queue": 0, "gpus": []}),
    # A service whose scrapes start failing.
    "/flaky": ("ml", "flaky-a", {"model": "flaky", "rps": 5, "latency_bucket": 0.1, "queue": 1, "gpus": []}),
}


def page(path: str, elapsed: float) -> str | None:
    """The exposition each fake pod serves."""
    return exposition(**PODS[path][2], elapsed=elapsed) if path in PODS else None


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory) -> Iterator[tuple[Prometheus, Exporter]]:
    tmp = tmp_path_factory.mktemp("promql")
    with (
        Exporter(page) as exporter,
        scraping_pods(tmp, exporter.address, PODS, "model_server_queue_depth", WINDOW) as prom,
    ):
        yield prom, exporter


@pytest.mark.integration
@pytest.mark.slow
def test_autoscaler_promql_answers_on_real_prometheus(prometheus) -> None:
    prom, _ = prometheus

    def value(metric, model="resnet"):
        return prom.value(promql.metric_query(metric, "ml", model, WINDOW))

    # p95 of the pooled distribution: 40 req/s, 30 under 50 ms and 10 in (75, 100] ms, so the
    # 38th of 40 falls at 75 + 25 * 8/10 = 95 ms. Averaging per-pod p95s would say ~73.
    assert value(Metric.LATENCY_P95_MS) == pytest.approx(95.0, abs=1.0)
    assert value(Metric.LATENCY_P99_MS) == pytest.approx(99.0, abs=1.0)
    assert value(Metric.QUEUE_DEPTH) == pytest.approx(3.0)  # (2 + 4) / 2 pods
    assert value(Metric.RPS) == pytest.approx(20.0, rel=0.05)  # (10 + 30) / 2 pods
    assert value(Metric.GPU_UTILIZATION) == pytest.approx((50 + 60 + 80) / 3)  # per GPU

    # Up but idle: latency is 0, not NaN (which would read as missing data).
    assert value(Metric.LATENCY_P95_MS, "idle") == 0.0
    # Nothing scraped for the model at all: no series, so the autoscaler holds.
    assert value(Metric.LATENCY_P95_MS, "ghost") is None
    assert prom.value(promql.data_age_seconds("ml", "ghost")) is None

    age = prom.value(promql.data_age_seconds("ml", "resnet"))
    assert 0 <= age < 5


@pytest.mark.integration
@pytest.mark.slow
def test_autoscaler_failed_scrapes_leave_no_live_series(prometheus) -> None:
    prom, exporter = prometheus
    age_query = promql.data_age_seconds("ml", "flaky")
    assert prom.value(age_query) is not None
    exporter.broken.add("/flaky")
    # A failed scrape marks the target's series stale: the age query turns empty, while the
    # latency over the window still answers from the old samples (which is why the loop
    # checks the age before trusting the value).
    wait_for(lambda: prom.value(age_query) is None, timeout=15, interval=0.2, message="stale series")
    assert prom.value(promql.metric_query(Metric.LATENCY_P95_MS, "ml", "flaky", WINDOW)) is not None
