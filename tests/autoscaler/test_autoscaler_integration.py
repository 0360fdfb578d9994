"""The built-in autoscaler end to end: real operator, real Prometheus, real model servers.

The operator runs unmodified (kopf, against the emulated API server); Prometheus scrapes
model-server processes on loopback every second; a bounded async client drives them past
the latency target and then stops. Pods are not emulated, so scaling up does not relieve the
servers: the loop must go up to maxReplicas while the breach lasts and come back down only
after the load is gone and the stabilization window has passed, without flapping.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from typing import Self

import pytest

from inference_operator import credentials, settings
from inference_operator.models import Metric
from inference_operator.prometheus import promql
from tests.autoscaler.conftest import (
    Target,
    running_model_servers,
    running_prometheus,
    tiny_mlp,
)
from tests.http_stub import QuietHandler, serving
from testsupport.cluster import Cluster, ReplicaRecorder, captured_operator_logs, wait_for
from testsupport.load import Load
from testsupport.processes import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NAMESPACE = "ml"
NAME = "mlp"
HPAS = "autoscaling/v2/horizontalpodautoscalers"
SCALED_OBJECTS = "keda.sh/v1alpha1/scaledobjects"
DECISION = "autoscaler decision"


def service(autoscaling: dict, replicas: int = 1, name: str = NAME) -> dict:
    return {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "model": {"uri": "pvc://models/mlp", "name": NAME},
            "resources": {"gpu": {"count": 0}, "cpu": "2", "memory": "2Gi"},
            "runtime": {"executionProviders": ["CPUExecutionProvider"]},
            "autoscaling": autoscaling,
        },
    }


def scale_events(cluster: Cluster) -> list[dict]:
    """Events the operator posted about scaling (read from the requests the API server got)."""
    posted = []
    for request in list(cluster.emulator):
        event = request.data if request.url.path.endswith("/events") else None
        if request.method == "POST" and isinstance(event, dict) and event.get("reason") in ("ScaledUp", "ScaledDown"):
            posted.append(event)
    return posted


def test_autoscaler_scales_on_real_prometheus_latency(tmp_path, cluster: Cluster, operator, record_property) -> None:
    target_ms = 20.0
    interval = 1
    window = 10
    stabilization = 8
    autoscaling = {
        "minReplicas": 1,
        "maxReplicas": 3,
        "metric": "latencyP95Ms",
        "target": target_ms,
        "intervalSeconds": interval,
        "windowSeconds": window,
        "scaleDownStabilizationSeconds": stabilization,
        # One replica per 5 s normally; a breach beyond 2x target may add one every tick.
        "scaleUp": {"pods": 1, "percent": 1, "periodSeconds": 5},
        "scaleDown": {"pods": 4, "percent": 100, "periodSeconds": 1},
    }
    model = tiny_mlp(tmp_path / "mlp.onnx")
    with running_model_servers(tmp_path, model, NAME, count=2) as servers:
        targets = [Target(s.address, {"namespace": NAMESPACE, "pod": f"{NAME}-{i}"}) for i, s in enumerate(servers)]
        with running_prometheus(tmp_path, targets) as prom, captured_operator_logs() as logs:
            wait_for(lambda: prom.targets_up() == 2, timeout=20, interval=0.2, message="targets up")
            autoscaling["prometheusUrl"] = prom.url
            assert cluster.apply_cr(service(autoscaling)).status_code in (200, 201)
            # Idle: the loop runs and keeps the one replica.
            idle = wait_for(
                lambda: cluster.autoscaler_status(NAMESPACE, NAME).get("reason"),
                timeout=20,
                message="first autoscaler decision",
            )
            assert "holding 1" in idle
            assert cluster.replicas(NAMESPACE, NAME) == 1

            with ReplicaRecorder(cluster, NAMESPACE, NAME) as recorder:
                load = Load([f"http://{s.address}/infer" for s in servers], concurrency=12, max_seconds=60).start()
                try:
                    wait_for(
                        lambda: (cluster.replicas(NAMESPACE, NAME) or 0) > 1,
                        timeout=30,
                        interval=0.02,
                        message="scale-up under load",
                    )
                    wait_for(
                        lambda: cluster.replicas(NAMESPACE, NAME) == 3,
                        timeout=30,
                        interval=0.05,
                        message="scale-up to maxReplicas",
                    )
                    at_max = logs.count(DECISION)
                    # Keep the breach going for a few more decisions: it must stay at max.
                    wait_for(lambda: logs.count(DECISION) >= at_max + 4, timeout=20, message="decisions at max")
                    loaded_status = cluster.autoscaler_status(NAMESPACE, NAME)
                finally:
                    load.stop()
                load_stopped = time.time()
                wait_for(
                    lambda: cluster.replicas(NAMESPACE, NAME) == 1,
                    timeout=60,
                    interval=0.05,
                    message="scale-down after the load stopped",
                )
                settled = logs.count(DECISION)
                wait_for(lambda: logs.count(DECISION) >= settled + 4, timeout=20, message="decisions after")
            writes = recorder.writes()

            # When did Prometheus first see the breach? Evaluate the loop's own query over time.
            query = promql.metric_query(Metric.LATENCY_P95_MS, NAMESPACE, NAME, window)
            series = prom.query_range(query, load.started_at - 2, writes[0][0] + 1, step=0.25)

    assert load.sent > 100 and load.failed == 0, (load.sent, load.failed)
    ups = [w for w in writes if w[2] > w[1]]
    downs = [w for w in writes if w[2] < w[1]]
    assert [w[1:] for w in ups] == [(1, 2), (2, 3)]
    assert [w[1:] for w in downs] == [(3, 1)]
    assert all(t < load_stopped for t, _, _ in ups)
    assert all(t > load_stopped for t, _, _ in downs)
    # The scale-down waited for the window to drain and then for the stabilization window.
    assert downs[0][0] - load_stopped >= stabilization
    # Flaps: any reversal besides the one up→down turn after the load stopped.
    directions = [1 if after > before else -1 for _, before, after in writes]
    flaps = sum(1 for a, b in itertools.pairwise(directions) if a != b) - 1
    assert flaps == 0

    # What the loop recorded: the latency it acted on, and a Kubernetes event per change.
    assert loaded_status["metric"] == "latencyP95Ms"
    assert loaded_status["latencyP95Ms"] > target_ms
    assert loaded_status["currentValue"] == pytest.approx(loaded_status["latencyP95Ms"], abs=0.05)
    assert loaded_status["desiredReplicas"] == 3
    assert loaded_status["lastScaleTime"]
    events = scale_events(cluster)
    assert [e["reason"] for e in events] == ["ScaledUp", "ScaledUp", "ScaledDown"]
    assert "latencyP95Ms=" in events[0]["message"]

    breach = next((t for t, v in series if v > target_ms), None)
    assert breach is not None, series
    reaction = writes[0][0] - breach
    record_property("reaction_seconds", round(reaction, 2))
    record_property("flaps", flaps)
    # The operator runner swaps sys.stdout while it runs; report on the real one (pytest -s).
    print(
        f"\nautoscaler reaction: breach visible in Prometheus at +{breach - load.started_at:.2f}s "
        f"after load start, first scale write {reaction:.2f}s after the breach "
        f"({writes[0][0] - load.started_at:.2f}s after load start); "
        f"scale writes {[w[1:] for w in writes]}; scale-down {downs[0][0] - load_stopped:.1f}s "
        f"after load stop; flaps {flaps}; requests {load.sent}",
        file=sys.__stdout__,
    )


def test_autoscaler_holds_when_prometheus_is_down(cluster: Cluster, operator) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with captured_operator_logs() as logs:
        cluster.apply_cr(
            service(
                {
                    "minReplicas": 1,
                    "maxReplicas": 5,
                    "target": 50,
                    "prometheusUrl": dead,
                    "intervalSeconds": 1,
                    "scaleDownStabilizationSeconds": 0,
                },
                replicas=4,
            )
        )
        reason = wait_for(
            lambda: cluster.autoscaler_status(NAMESPACE, NAME).get("reason"), timeout=30, message="autoscaler status"
        )
        assert reason.startswith("no data (")
        assert "holding 4" in reason
        seen = logs.count(DECISION)
        wait_for(lambda: logs.count(DECISION) >= seen + 5, timeout=30, message="more decisions")
    assert cluster.replicas(NAMESPACE, NAME) == 4
    assert scale_events(cluster) == []
    assert "currentValue" not in cluster.autoscaler_status(NAMESPACE, NAME)


class FakePrometheus:
    """Answers every query with one value, but only to a client with the right bearer token."""

    def __init__(self, token: str, value: float):
        self.auth_headers: list[str | None] = []
        fake = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                fake.auth_headers.append(self.headers.get("Authorization"))
                if self.headers.get("Authorization") != f"Bearer {token}":
                    self.send_error(401)
                    return
                self.reply(
                    json.dumps(
                        {
                            "status": "success",
                            "data": {
                                "resultType": "vector",
                                "result": [{"metric": {}, "value": [time.time(), str(value)]}],
                            },
                        }
                    ).encode()
                )

        self._serving = serving(Handler)

    def __enter__(self) -> Self:
        server = self._serving.__enter__()
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        self._serving.__exit__(*exc)


@pytest.fixture
def allow_http(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake Prometheus speaks plain http on loopback: the operator, when it starts, must be
    told that is fine."""
    monkeypatch.setenv(settings.PROMETHEUS_ALLOW_HTTP_ENV, "true")


def test_autoscaler_reads_the_bearer_token_from_a_secret(cluster: Cluster, allow_http: None, operator) -> None:
    with FakePrometheus(token="s3cret", value=5.0) as prom:  # 5 > 4 * target: scale up
        cluster.apply_cr(
            service(
                {
                    "minReplicas": 1,
                    "maxReplicas": 4,
                    "target": 1,
                    "metric": "queueDepth",
                    "prometheusUrl": prom.url,
                    "intervalSeconds": 1,
                    "prometheusAuth": {"bearerTokenSecret": {"name": "prom-token", "key": "token"}},
                },
                replicas=1,
            )
        )
        # Without the Secret the loop cannot ask, so it holds and says why.
        reason = wait_for(
            lambda: cluster.autoscaler_status(NAMESPACE, NAME).get("reason"), timeout=30, message="autoscaler status"
        )
        assert "secret prom-token not found" in reason
        assert cluster.replicas(NAMESPACE, NAME) == 1
        cluster.add_secret(NAMESPACE, "prom-token", {"token": b"s3cret\n"}, labels={credentials.SECRET_LABEL: "true"})
        wait_for(lambda: cluster.replicas(NAMESPACE, NAME) == 4, timeout=30, message="scale-up to max")
    assert "Bearer s3cret" in prom.auth_headers
    assert None not in prom.auth_headers
    status = cluster.autoscaler_status(NAMESPACE, NAME)
    assert status["metric"] == "queueDepth" and status["currentValue"] == 5.0


def test_autoscaler_modes_switch_between_loop_hpa_and_keda(cluster: Cluster, operator) -> None:
    base = {
        "minReplicas": 2,
        "maxReplicas": 6,
        "target": 50,
        "prometheusUrl": f"http://127.0.0.1:{free_port()}",
        "intervalSeconds": 1,
    }
    with captured_operator_logs() as logs:
        cluster.apply_cr(service(base, replicas=2))
        wait_for(lambda: cluster.autoscaler_status(NAMESPACE, NAME).get("reason"), timeout=30, message="loop running")

        cluster.patch_cr(NAMESPACE, NAME, {"spec": {"autoscaling": {"mode": "hpa"}}})
        hpa = wait_for(lambda: cluster.get(HPAS, NAMESPACE, NAME), timeout=30, message="HPA")
        assert hpa["spec"]["scaleTargetRef"]["name"] == NAME
        assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
        # The built-in loop stops: kopf ends the daemon once the object no longer matches.
        wait_for(lambda: logs.count("Daemon 'autoscaler' has exited"), timeout=30, message="loop stopped")
        quiet = logs.count(DECISION)

        cluster.patch_cr(NAMESPACE, NAME, {"spec": {"autoscaling": {"mode": "keda"}}})
        scaled = wait_for(lambda: cluster.get(SCALED_OBJECTS, NAMESPACE, NAME), timeout=30, message="ScaledObject")
        wait_for(lambda: cluster.get(HPAS, NAMESPACE, NAME) is None, timeout=30, message="HPA deleted")
        assert scaled["spec"]["triggers"][0]["metadata"]["query"] == promql.metric_query(
            Metric.LATENCY_P95_MS, NAMESPACE, NAME, 60
        )
        assert logs.count(DECISION) == quiet

        cluster.patch_cr(NAMESPACE, NAME, {"spec": {"autoscaling": {"mode": "builtin"}}})
        wait_for(
            lambda: cluster.get(SCALED_OBJECTS, NAMESPACE, NAME) is None, timeout=30, message="ScaledObject deleted"
        )
        wait_for(lambda: logs.count(DECISION) > quiet, timeout=30, message="loop back on")
