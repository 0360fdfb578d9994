"""The operator's traces and JSON logs: a span per reconcile with the writes it made, sent only to
the collector the chart names; log lines that carry the reconcile's trace id."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kopf.testing import KopfRunner

from inference_operator.config import OperatorConfig
from inference_operator.settings import TRACE_SAMPLE_RATIO_ENV, TRACES_ENDPOINT_ENV, SettingsError, TracingSettings
from tests.chart import helm as h
from testsupport.cluster import DEPLOYMENTS, Cluster, wait_for
from testsupport.otlp import ReceivedSpan, otlp_receiver
from testsupport.processes import stop


def resnet(name: str = "resnet", **runtime: object) -> dict:
    return {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "model": {"uri": "pvc://models/resnet50", "format": "onnx"},
            "runtime": dict(runtime),
            "resources": {"gpu": {"count": 0}, "cpu": "1", "memory": "1Gi"},
        },
    }


def test_tracing_settings_are_off_by_default_and_a_bad_value_names_its_variable():
    assert TracingSettings.from_env({}) == TracingSettings(endpoint="", sampling_ratio=1.0)
    assert TracingSettings.from_env(
        {TRACES_ENDPOINT_ENV: "https://collector:4318/v1/traces", TRACE_SAMPLE_RATIO_ENV: "0.2"}
    ) == TracingSettings("https://collector:4318/v1/traces", 0.2)
    for env, variable in [
        ({TRACES_ENDPOINT_ENV: "grpc://collector:4317"}, TRACES_ENDPOINT_ENV),
        ({TRACES_ENDPOINT_ENV: "http://u:p@collector/v1/traces"}, TRACES_ENDPOINT_ENV),
        ({TRACE_SAMPLE_RATIO_ENV: "2"}, TRACE_SAMPLE_RATIO_ENV),
        ({TRACE_SAMPLE_RATIO_ENV: "nan"}, TRACE_SAMPLE_RATIO_ENV),
        ({TRACE_SAMPLE_RATIO_ENV: "half"}, TRACE_SAMPLE_RATIO_ENV),
    ]:
        with pytest.raises(SettingsError, match=variable):
            TracingSettings.from_env(env)


def operator_container(values: dict | None) -> dict:
    (container,) = h.one(h.render(values), "Deployment", "rio-rocm-inference-operator")["spec"]["template"]["spec"][
        "containers"
    ]
    return container


def test_the_chart_leaves_tracing_off_and_text_logs_by_default(helm):
    container = operator_container(None)
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert OperatorConfig.from_environ(env).tracing == TracingSettings()
    assert "--log-format=text" in container["args"]


def test_chart_values_turn_on_the_operators_traces_and_json_logs(helm):
    endpoint = "http://otel-collector.observability:4318/v1/traces"
    container = operator_container({"tracing": {"endpoint": endpoint, "samplingRatio": 0.25}, "logFormat": "json"})
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert OperatorConfig.from_environ(env).tracing == TracingSettings(endpoint, 0.25)
    assert "--log-format=json" in container["args"]


@pytest.mark.parametrize(
    "values",
    [
        {"tracing": {"endpoint": "collector:4318"}},
        {"tracing": {"endpoint": "http://collector:4318/v1/traces?x=1"}},
        {"tracing": {"samplingRatio": 3}},
        {"logFormat": "yaml"},
    ],
)
def test_the_chart_schema_refuses_bad_tracing_and_log_values(helm, values):
    with pytest.raises(Exception, match="(?i)schema|values"):
        h.render(values)


@pytest.fixture
def traced_operator(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[KopfRunner, object]]:
    """The real operator (kopf run) against the emulated cluster, tracing to a receiver here."""
    with otlp_receiver() as receiver:
        monkeypatch.setenv(TRACES_ENDPOINT_ENV, receiver.url)
        args = ["run", "--all-namespaces", "--standalone", "-m", "inference_operator.handlers"]
        with KopfRunner(args, timeout=60) as runner:
            yield runner, receiver
    assert runner.exit_code == 0, runner.output


def reconciles_of(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.name == "reconcile" and s.attributes.get("inference.service") == name]


@pytest.mark.integration
def test_a_reconcile_is_a_span_with_an_event_per_write(cluster: Cluster, traced_operator):
    _, receiver = traced_operator
    assert cluster.apply_cr(resnet()).status_code in (200, 201)
    wait_for(lambda: cluster.get(DEPLOYMENTS, "ml", "resnet"), message="Deployment")
    spans = receiver.wait_for(lambda got: any(s.events for s in reconciles_of(got, "resnet")))
    (first, *_) = [s for s in reconciles_of(spans, "resnet") if s.events]
    assert first.attributes["k8s.namespace.name"] == "ml" and first.attributes["k8s.object.generation"] == 1
    assert first.resource["service.name"] == "rocm-inference-operator"
    assert first.parent_id == ""  # a reconcile starts its own trace
    events = {(a["k8s.verb"], a["k8s.kind"], a["k8s.name"]) for _, a in first.events}
    assert {("Created", "Deployment", "resnet"), ("Created", "Service", "resnet")} <= events
    assert first.attributes["inference.writes"] == len(first.events)
    assert all(name == f"{a['k8s.verb']} {a['k8s.kind']} {a['k8s.name']}" for name, a in first.events)


AUTHORS_COLLECTOR = "authors-collector.ml.svc"


@pytest.mark.integration
def test_the_operator_never_sends_to_an_endpoint_from_a_cr(
    cluster: Cluster, traced_operator, monkeypatch: pytest.MonkeyPatch
):
    """runtime.tracing goes into the pods only: the operator's own spans go to the chart's collector.
    The CR names its collector as a pod would (a Service's name; runtime.tracing refuses loopback),
    and that name resolves to the receiver here, as the cluster's DNS would resolve it there."""
    _, chart_collector = traced_operator
    resolve = socket.getaddrinfo

    def cluster_dns(host: object, *args: Any, **kwargs: Any) -> Any:
        return resolve("127.0.0.1" if host == AUTHORS_COLLECTOR else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", cluster_dns)
    with otlp_receiver() as authors_collector:
        endpoint = authors_collector.url.replace("127.0.0.1", AUTHORS_COLLECTOR)
        cr = resnet("traced", tracing={"endpoint": endpoint})
        assert cluster.apply_cr(cr).status_code in (200, 201)
        deployment = wait_for(lambda: cluster.get(DEPLOYMENTS, "ml", "traced"), message="Deployment")
        chart_collector.wait_for(lambda got: any(s.events for s in reconciles_of(got, "traced")))
        assert endpoint in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        assert authors_collector.exports == 0


@pytest.mark.slow
@pytest.mark.integration
def test_json_log_lines_of_a_traced_reconcile_carry_its_trace_id(cluster: Cluster, tmp_path: Path):
    with otlp_receiver() as receiver:
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), TRACES_ENDPOINT_ENV: receiver.url}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        log = tmp_path / "operator.log"
        command = [sys.executable, "-m", "inference_operator", "run", "-A", "--metrics-port=0", "--log-format=json"]
        with log.open("wb") as out:
            process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
            try:
                assert cluster.apply_cr(resnet()).status_code in (200, 201)
                spans = receiver.wait_for(lambda got: any(s.events for s in reconciles_of(got, "resnet")), 60)
                traced = {s.trace_id: s for s in reconciles_of(spans, "resnet") if s.events}
                wait_for(lambda: "reconciled generation" in log.read_text(), timeout=30, message="reconcile log")
            finally:
                assert stop(process) == 0, log.read_text()[-3000:]
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line one JSON object
    reconciled = [r for r in records if r["message"].startswith("reconciled generation")]
    assert reconciled and all(r.get("trace_id") in traced for r in reconciled), reconciled
    span = traced[reconciled[0]["trace_id"]]
    assert reconciled[0]["span_id"] == span.span_id
    assert any("trace_id" not in r for r in records)  # lines outside a reconcile carry none
