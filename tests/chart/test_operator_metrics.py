"""The operator's Prometheus metrics: what a handler run, an error and a decision record."""

from __future__ import annotations

import asyncio

import httpx
import kopf
import pytest
from kubernetes.client.exceptions import ApiException

from inference_operator import metrics
from inference_operator.models import SpecError
from testsupport.processes import free_port


def value(metric: str, /, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(metric, labels) or 0.0


def test_a_successful_run_is_counted_and_timed() -> None:
    @metrics.instrumented("t_success")
    def handler(x: int, **_: object) -> int:
        return x * 2

    assert handler(21, logger=None) == 42
    assert handler.__name__ == "handler"  # kopf's handler id stays the function's name
    assert value("inference_operator_reconciles_total", handler="t_success", result="success") == 1
    assert value("inference_operator_reconcile_duration_seconds_count", handler="t_success") == 1


@pytest.mark.parametrize(
    "exc, result, reason",
    [
        (kopf.TemporaryError("API error 409"), "retry", "temporary"),
        (kopf.PermanentError("spec"), "failed", "permanent"),
        (RuntimeError("boom"), "error", "runtime_error"),
        (ApiException(status=503), "error", "api_503"),
    ],
)
def test_errors_are_classified(exc: Exception, result: str, reason: str) -> None:
    handler_name = f"t_{result}_{reason}"

    @metrics.instrumented(handler_name)
    def handler() -> None:
        raise exc

    with pytest.raises(type(exc)):
        handler()
    assert value("inference_operator_reconciles_total", handler=handler_name, result=result) == 1
    assert value("inference_operator_reconcile_errors_total", handler=handler_name, reason=reason) == 1
    assert value("inference_operator_reconciles_total", handler=handler_name, result="success") == 0


def test_the_cause_names_the_reason() -> None:
    @metrics.instrumented("t_causes")
    def handler(which: str) -> None:
        try:
            if which == "api":
                raise ApiException(status=409)
            raise SpecError("spec.model.uri", "bad")
        except ApiException as e:
            raise kopf.TemporaryError("conflict") from e
        except SpecError as e:
            raise kopf.PermanentError("invalid") from e

    for which in ("api", "spec", "spec"):
        with pytest.raises((kopf.TemporaryError, kopf.PermanentError)):
            handler(which)
    assert value("inference_operator_reconcile_errors_total", handler="t_causes", reason="api_409") == 1
    assert value("inference_operator_reconcile_errors_total", handler="t_causes", reason="spec") == 2


def test_async_handlers_are_instrumented_and_cancellation_is_no_error() -> None:
    @metrics.instrumented("t_async")
    async def handler(delay: float) -> str:
        await asyncio.sleep(delay)
        return "done"

    assert asyncio.run(handler(0)) == "done"

    async def cancel() -> None:
        task = asyncio.create_task(handler(10))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel())
    assert value("inference_operator_reconciles_total", handler="t_async", result="success") == 1
    assert value("inference_operator_reconcile_duration_seconds_count", handler="t_async") == 2
    assert (
        sum(
            value("inference_operator_reconciles_total", handler="t_async", result=r)
            for r in ("retry", "failed", "error")
        )
        == 0
    )


def test_autoscaler_decisions_and_forgetting_a_service() -> None:
    common = dict(min_replicas=1, max_replicas=4, metric="latencyP95Ms", target=50.0)
    assert metrics.record_autoscaler_decision("ml", "a", current=2, desired=4, value=80.0, **common) == "up"
    assert metrics.record_autoscaler_decision("ml", "a", current=4, desired=4, value=None, **common) == "hold"
    assert metrics.record_autoscaler_decision("ml", "b", current=3, desired=1, value=5.0, **common) == "down"
    assert value("inference_operator_autoscaler_decisions_total", namespace="ml", name="a", direction="up") == 1
    assert value("inference_operator_autoscaler_decisions_total", namespace="ml", name="a", direction="hold") == 1
    assert value("inference_operator_autoscaler_desired_replicas", namespace="ml", name="a") == 4
    assert value("inference_operator_autoscaler_max_replicas", namespace="ml", name="a") == 4
    # An unreadable metric keeps the last reading.
    assert value("inference_operator_autoscaler_metric_value", namespace="ml", name="a", metric="latencyP95Ms") == 80

    metrics.forget_service("ml", "a")
    assert (
        metrics.REGISTRY.get_sample_value(
            "inference_operator_autoscaler_desired_replicas", {"namespace": "ml", "name": "a"}
        )
        is None
    )
    assert value("inference_operator_autoscaler_desired_replicas", namespace="ml", name="b") == 1


def test_serve_exposes_the_registry_over_http() -> None:
    port = free_port()
    server = metrics.serve(port, "127.0.0.1")
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        server.shutdown()
        server.server_close()
    assert 'inference_operator_build_info{version="' in text
    assert "# TYPE inference_operator_reconciles_total counter" in text
    assert "process_cpu_seconds_total" in text
