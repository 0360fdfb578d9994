"""The engine registry: every engine is one object (`inference_operator.engines.ENGINES`) with its
traits, series, scaling names, image and pod part (`ServingEngine.pod`); what the rules,
queries and builders derive from it holds.
"""

from __future__ import annotations

import itertools

import pytest

from inference_operator.builders import Owner, build_all
from inference_operator.builders.deployment import service_values, shared_pod
from inference_operator.cel_rules import evaluate_rule
from inference_operator.engines.base import Quantile
from inference_operator.models import DEFAULT_ENGINE, ENGINES, Engine, Metric, parse_spec
from inference_operator.models.engines import cel_engine_in
from inference_operator.prometheus import promql
from inference_operator.settings import Images


@pytest.mark.parametrize("engine", list(Engine))
def test_every_engine_has_an_entry_in_every_table(engine: Engine) -> None:
    assert engine in ENGINES and ENGINES[engine].engine == engine
    images = Images({e: f"reg/{e.value}:1" for e in Engine})
    assert images.serving(engine) == f"reg/{engine.value}:1"
    assert Images().serving(engine) == ENGINES[engine].image.default


def test_each_metric_is_exported_by_exactly_one_engine_and_has_a_query() -> None:
    exported = [metric for serving in ENGINES.values() for metric in serving.traits.metrics]
    assert sorted(exported) == sorted(Metric), "a metric no engine exports, or two engines export"
    for engine, serving in ENGINES.items():
        label = serving.series.model_label
        # Each metric it exports is read from its series and named for an HPA.
        assert set(serving.series.metrics) == set(serving.scaling_names) == serving.traits.metrics
        for metric in serving.traits.metrics:
            assert promql.exporter(metric) == engine
            # The query selects the engine's own model label (the GPU gauge carries none itself,
            # and is matched through a series that does).
            assert f'{label}="m"' in promql.metric_query(metric, "ns", "m", 30), metric


@pytest.mark.parametrize("engine", list(Engine))
def test_a_canary_is_judged_on_latencies_its_engine_exports(engine: Engine) -> None:
    serving = ENGINES[engine]
    traits = serving.traits
    assert traits.canary_metrics and set(traits.canary_metrics) <= traits.metrics
    for metric in traits.canary_metrics:
        source = serving.series.metrics[metric]
        assert isinstance(source, Quantile), metric
        query = promql.canary_latency_ms(metric, "ns", "m", "svc", 60)
        assert f'{serving.series.model_label}="m"' in query and source.histogram in query


@pytest.mark.parametrize("engine", list(Engine))
def test_engine_independent_queries_read_only_the_engines_series(engine: Engine) -> None:
    series = ENGINES[engine].series
    others = {
        name for other, o in ENGINES.items() if other != engine for name in (*o.series.holding, o.series.answered)
    }
    others -= {*series.holding, series.answered, *series.scraped}
    queries = [
        promql.recent_requests(engine, "ns", "m", 60),
        promql.data_age_seconds("ns", "m", engine),
        promql.request_latency_ms(engine, "ns", "m", 60),
        promql.canary_requests(engine, "ns", "m", "svc", 60),
    ]
    for query in queries:
        assert f'{series.model_label}="m"' in query
        assert not any(name in query for name in others), query
    assert (promql.canary_error_ratio(engine, "ns", "m", "svc", 60) is None) == (series.answers_by_code is None)


@pytest.mark.parametrize("chosen", [()] + [(e,) for e in Engine] + [tuple(Engine)])
def test_the_cel_test_of_an_engine_set_treats_an_unset_engine_as_the_default(chosen: tuple[Engine, ...]) -> None:
    rule = {"rule": cel_engine_in(chosen, "self.runtime")}
    objects = [({}, DEFAULT_ENGINE), ({"runtime": {}}, DEFAULT_ENGINE)]
    objects += [({"runtime": {"engine": engine.value}}, engine) for engine in Engine]
    for obj, engine in objects:
        assert (evaluate_rule(rule, obj) is None) == (engine in chosen), (rule, obj)


@pytest.mark.parametrize(("engine", "grpc"), list(itertools.product(Engine, [False, True])))
def test_each_engines_pod_carries_what_its_entry_says(engine: Engine, grpc: bool) -> None:
    traits = ENGINES[engine].traits
    serving = ENGINES[engine]
    runtime: dict[str, object] = {"engine": engine.value}
    if grpc and traits.grpc:
        runtime["grpcPort"] = 8081
    spec = parse_spec({"model": {"uri": "pvc://models/m"}, "runtime": runtime})
    owner = Owner("svc", "ns", "uid", spec, Images({e: f"{e.value}:1" for e in Engine}))
    deployment, service = (o for o in build_all(owner) if o["kind"] in {"Deployment", "Service"})
    pod = deployment["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == owner.images.serving(engine)
    assert pod["containers"][0]["name"] == ENGINES[engine].container
    assert pod["terminationGracePeriodSeconds"] == serving.termination_grace_seconds
    sidecars = [c["name"] for c in pod.get("initContainers", []) if c.get("restartPolicy") == "Always"]
    assert sidecars == [c["name"] for c in serving.pod(service_values(owner), shared_pod(owner)).sidecars]
    metrics = next(p for p in service["spec"]["ports"] if p["name"] == "metrics")
    assert metrics["targetPort"] == ("http" if traits.metrics_on_api_port else "metrics")
    scraped = int(deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"])
    assert scraped == (spec.runtime.port if traits.metrics_on_api_port else spec.runtime.metrics_port)
    assert any(p["name"] == "grpc" for p in service["spec"]["ports"]) == (grpc and traits.grpc)
