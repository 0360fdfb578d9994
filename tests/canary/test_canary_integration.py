"""Canary rollouts end to end: the real operator, real Prometheus, real model servers.

The operator runs unmodified against the emulated API server. The test plays the kubelet: one
model-server process is the stable Deployment's pod and, once the operator creates NAME-canary,
another is the canary's pod, each scraped under the pod name Prometheus would give it. A steady
client keeps both busy the whole time. A candidate that is slower than `maxLatencyMs` is rolled
back by the operator on its own; a healthy one is promoted step by step to the stable Deployment.
Where the real-pods tier runs, it proves both on pods under load (tests/chart/test_real_pods.py),
and these twins skip; the stages of a rollout are also followed step by step against a real API
server (tests/reconcile/test_operator_realapi.py) and as pure decisions (tests/canary/test_rollout_policy.py).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from inference_operator.models import Metric
from inference_operator.prometheus import promql
from tests.autoscaler.conftest import (
    ModelServer,
    Prometheus,
    Target,
    running_model_servers,
    running_prometheus,
    tiny_mlp,
)
from testsupport.cluster import Cluster, condition, wait_for
from testsupport.load import Load

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NAMESPACE = "ml"
NAME = "mlp"
DEPLOYMENTS = "apps/v1/deployments"
STABLE_POD = f"{NAME}-5b7c9d8f6-abcde"
CANARY_POD = f"{NAME}-canary-6c8d9e7f5-fghij"
INTERVAL = 1
# The healthy candidate answers in well under a millisecond, the slow one in ~45 ms a row and
# queues: a wide margin on both sides, since p95 is read from histogram buckets and a busy
# machine stretches the tail (the healthy one's p95 has read 23 ms on a loaded machine: more
# than 5% of its answers waited over 10 ms for a core).
MAX_LATENCY_MS = 50.0
WINDOW = 10


def service(version: str, prometheus_url: str) -> dict:
    return {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {
            "replicas": 1,
            "model": {"uri": "pvc://models/mlp", "name": NAME, "version": version},
            "resources": {"gpu": {"count": 0}, "cpu": "2", "memory": "2Gi"},
            "runtime": {"executionProviders": ["CPUExecutionProvider"]},
            "rollout": {
                "strategy": "canary",
                "canary": {
                    "steps": [10, 50],
                    "stepSeconds": 2,
                    "analysis": {
                        "maxLatencyMs": MAX_LATENCY_MS,
                        "minRequests": 5,
                        "failureLimit": 1,
                        "intervalSeconds": INTERVAL,
                        "windowSeconds": WINDOW,
                        "prometheusUrl": prometheus_url,
                    },
                },
            },
        },
    }


def rollout(cluster: Cluster) -> dict:
    return ((cluster.get_cr(NAMESPACE, NAME) or {}).get("status") or {}).get("rollout") or {}


def model_version(cluster: Cluster, name: str) -> str | None:
    deployment = cluster.get(DEPLOYMENTS, NAMESPACE, name)
    if deployment is None:
        return None
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args[args.index("--model-version") + 1]


@contextlib.contextmanager
def stable_and_canary(tmp_path: Path, canary_model: Path) -> Iterator[tuple[ModelServer, ModelServer, Prometheus]]:
    """The stable pod (a fast model) and the canary pod, scraped by a real Prometheus."""
    fast = tiny_mlp(tmp_path / "fast.onnx", width=64, depth=1)
    (tmp_path / "stable").mkdir()
    (tmp_path / "canary").mkdir()
    with (
        running_model_servers(tmp_path / "stable", fast, NAME, count=1) as (stable,),
        running_model_servers(tmp_path / "canary", canary_model, NAME, count=1) as (canary,),
    ):
        targets = [
            Target(stable.address, {"namespace": NAMESPACE, "pod": STABLE_POD}),
            Target(canary.address, {"namespace": NAMESPACE, "pod": CANARY_POD}),
        ]
        with running_prometheus(tmp_path, targets) as prom:
            wait_for(lambda: prom.targets_up() == 2, timeout=20, interval=0.2, message="targets up")
            yield stable, canary, prom


@contextlib.contextmanager
def stopping(load: Load) -> Iterator[Load]:
    try:
        yield load.start()
    finally:
        load.stop()


def start_canary(cluster: Cluster, prometheus_url: str) -> None:
    """Version 1 as the stable revision, then version 2: a canary of it."""
    assert cluster.apply_cr(service("1", prometheus_url)).status_code in (200, 201)
    wait_for(lambda: rollout(cluster).get("phase") == "Stable", timeout=30, message="the stable revision")
    assert cluster.patch_cr(NAMESPACE, NAME, {"spec": {"model": {"version": "2"}}}).status_code == 200
    wait_for(lambda: rollout(cluster).get("stage") == "canary 10%", timeout=30, message="a canary at 10%")
    assert model_version(cluster, NAME) == "1" and model_version(cluster, f"{NAME}-canary") == "2"


@pytest.mark.proven_on_pods("tests/chart/test_real_pods.py")
def test_a_slow_canary_is_rolled_back_by_itself(tmp_path: Path, cluster: Cluster, operator, record_property) -> None:
    slow = tiny_mlp(tmp_path / "slow.onnx", depth=64)  # ~45 ms a row, and two clients queue on it
    with (
        stable_and_canary(tmp_path, slow) as (stable, canary, prom),
        stopping(Load([f"http://{stable.address}/infer"], concurrency=2, max_seconds=120)) as steady,
    ):
        start_canary(cluster, prom.url)
        # The canary's pod takes traffic once its Deployment exists.
        with stopping(Load([f"http://{canary.address}/infer"], concurrency=2, max_seconds=120)) as to_canary:
            rolled_back = wait_for(
                lambda: (r := rollout(cluster)).get("phase") == "RolledBack" and r,
                timeout=60,
                interval=0.05,
                message="the canary rolled back",
            )
            rolled_back_at = time.time()
            requests_to_canary = to_canary.sent
        wait_for(
            lambda: cluster.get(DEPLOYMENTS, NAMESPACE, f"{NAME}-canary") is None,
            timeout=10,
            message="the canary Deployment removed",
        )
        # The stable arm never ran the candidate, and goes on not running it.
        time.sleep(2 * INTERVAL)
        assert rollout(cluster)["phase"] == "RolledBack" and model_version(cluster, NAME) == "1"
        degraded = wait_for(
            lambda: (c := condition(cluster.get_cr(NAMESPACE, NAME), "Degraded")) and c["status"] == "True" and c,
            timeout=10,
            message="Degraded=RolledBack",
        )
        assert degraded["reason"] == "RolledBack" and "latency" in degraded["message"]
        # When did Prometheus first show the breach? The analysis' own query, over time.
        query = promql.canary_latency_ms(Metric.LATENCY_P95_MS, NAMESPACE, NAME, NAME, WINDOW)
        series = prom.query_range(query, to_canary.started_at - 1, rolled_back_at, step=0.1)
    assert steady.failed == 0 and to_canary.failed == 0, (steady.failures, to_canary.failures)

    assert rolled_back["stage"] == "rolled back" and rolled_back["weight"] == 0
    # At the first step usually; under a loaded machine an early check of the few first answers
    # can pass it and the breach is caught at the second (2 s steps): either way before promotion.
    assert "latency" in rolled_back["message"] and "rolled back at step" in rolled_back["message"]
    assert rolled_back["lastCheck"]["verdict"] == "fail" and rolled_back["lastCheck"]["latencyMs"] > MAX_LATENCY_MS
    breach = next(t for t, v in series if v > MAX_LATENCY_MS)
    reaction = rolled_back_at - breach
    record_property("breach_to_rollback_seconds", round(reaction, 2))
    record_property("requests_to_the_canary", requests_to_canary)
    print(
        f"\ncanary: breach visible in Prometheus {breach - to_canary.started_at:.2f}s after its first request; "
        f"weight 0 (RolledBack) {reaction:.2f}s later (analysis interval {INTERVAL}s); "
        f"{requests_to_canary} requests reached the canary"
    )


@pytest.mark.proven_on_pods("tests/chart/test_real_pods.py")
def test_a_healthy_canary_is_promoted_step_by_step(tmp_path: Path, cluster: Cluster, operator) -> None:
    candidate = tiny_mlp(tmp_path / "candidate.onnx", width=64, depth=1)
    stages: set[str] = set()

    def promoted() -> dict | None:
        state = rollout(cluster)
        stages.add(state.get("stage") or "")
        return state if state.get("phase") == "Promoted" else None

    with (
        stable_and_canary(tmp_path, candidate) as (stable, canary, prom),
        stopping(Load([f"http://{stable.address}/infer"], concurrency=2, max_seconds=120)) as steady,
    ):
        start_canary(cluster, prom.url)
        with stopping(Load([f"http://{canary.address}/infer"], concurrency=2, max_seconds=120)) as to_canary:
            done = wait_for(promoted, timeout=60, interval=0.05, message="the canary promoted")
        wait_for(lambda: model_version(cluster, NAME) == "2", timeout=10, message="the stable Deployment rolled")
        wait_for(
            lambda: cluster.get(DEPLOYMENTS, NAMESPACE, f"{NAME}-canary") is None,
            timeout=10,
            message="the canary Deployment removed",
        )
    assert steady.failed == 0 and to_canary.failed == 0, (steady.failures, to_canary.failures)
    assert {"canary 10%", "canary 50%", "promoted"} <= stages, stages
    assert done["weight"] == 100 and "promoted after 2 steps" in done["message"]
    assert rollout(cluster)["stage"] == "promoted"


def test_a_refused_prometheus_credential_leaves_the_canary_at_its_step_and_says_why(cluster: Cluster, operator) -> None:
    """The analysis queries the autoscaler's Prometheus with the autoscaler's credential, by the
    same rules: an http URL may not have it, so nothing is queried, and the status says why."""
    cluster.add_secret(NAMESPACE, "prom-token", {"token": b"hunter2"}, labels={})
    obj = service("1", "http://127.0.0.1:9")
    del obj["spec"]["rollout"]["canary"]["analysis"]["prometheusUrl"]  # the autoscaler's, then
    obj["spec"]["autoscaling"] = {
        "maxReplicas": 2,
        "target": 1000,
        "prometheusUrl": "http://127.0.0.1:9",
        "prometheusAuth": {"bearerTokenSecret": {"name": "prom-token", "key": "token"}},
    }
    assert cluster.apply_cr(obj).status_code in (200, 201)
    wait_for(lambda: rollout(cluster).get("phase") == "Stable", timeout=30, message="the stable revision")
    assert cluster.patch_cr(NAMESPACE, NAME, {"spec": {"model": {"version": "2"}}}).status_code == 200
    state = wait_for(
        lambda: "not analysed" in (r := rollout(cluster)).get("message", "") and r,
        timeout=30,
        message="the refusal in status.rollout",
    )
    assert state["stage"] == "canary 10%" and "https" in state["message"] and "hunter2" not in str(state)
