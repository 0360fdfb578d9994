"""spec.adapters through the real operator: the ConfigMap follows the spec without touching the
pod template, and status.adapters and AdaptersReady follow what each replica's sidecar says."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest

from adapters_sidecar.desired import digest
from inference_operator.handlers import adapters as adapter_handlers
from tests.http_stub import QuietHandler, serving
from testsupport.cluster import Cluster, condition, inference_service, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NAMESPACE = "ml"
NAME = "llama"
LABELS = {
    "app.kubernetes.io/name": "model-server",
    "app.kubernetes.io/instance": NAME,
    "app.kubernetes.io/component": "predictor",
}


class Sidecars:
    """What every replica's sidecar answers (the pods share 127.0.0.1 here; None: a 503)."""

    def __init__(self) -> None:
        self.answer: object = None
        self.asked: list[str] = []
        self.lock = threading.Lock()


@pytest.fixture
def sidecars() -> Iterator[tuple[Sidecars, int]]:
    state = Sidecars()

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            with state.lock:
                state.asked.append(self.path)
                answer = state.answer
            if answer is None:
                self.reply(b"{}", status=503)
            else:
                self.reply(json.dumps(answer).encode())

    with serving(Handler) as server:
        yield state, server.server_address[1]


def service(port: int, adapters: list[dict]) -> dict:
    spec = {
        "model": {"uri": "pvc://models/llama", "name": "llama"},
        "runtime": {"engine": "vllm", "metricsPort": port},
        "adapters": adapters,
    }
    return inference_service(NAME, NAMESPACE, spec)


def add_pod(cluster: Cluster, name: str, **status: object) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": LABELS},
        "spec": {"containers": [{"name": "vllm", "image": "vllm"}]},
    }
    assert cluster.request("POST", f"/api/v1/namespaces/{NAMESPACE}/pods", pod, "application/json").is_success
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/status"
    assert cluster.request("PATCH", path, {"status": status}).is_success


def reconciled(cluster: Cluster) -> dict:
    """The service once the reconcile of its current generation wrote all it writes (it records
    observedGeneration last): its ConfigMap and Deployment are then the ones that spec asks for."""

    def done() -> dict | None:
        isvc = cluster.get_cr(NAMESPACE, NAME) or {}
        generation = (isvc.get("metadata") or {}).get("generation")
        return isvc if generation and (isvc.get("status") or {}).get("observedGeneration") == generation else None

    return wait_for(done, timeout=30, message="the current generation reconciled")


def adapters_condition(cluster: Cluster) -> dict | None:
    return condition(cluster.get_cr(NAMESPACE, NAME), "AdaptersReady")


def entry(name: str, uri: str, state: str, reason: str | None = None) -> dict:
    """One adapter as the sidecar reports it (model_server.adapters: its digest, not its uri)."""
    return {"name": name, "digest": digest(uri), "state": state, **({"reason": reason} if reason else {})}


SQL = {"name": "sql", "uri": "hf://org/sql-lora"}
CHAT = {"name": "chat", "uri": "hf://org/chat-lora"}


def test_adapters_status_follows_the_replicas_sidecars(
    cluster: Cluster, operator, sidecars: tuple[Sidecars, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    state, port = sidecars
    monkeypatch.setattr(adapter_handlers, "ADAPTER_STATUS_SECONDS", 0.2)
    assert cluster.apply_cr(service(port, [SQL])).status_code in (200, 201)
    # Read once the reconcile has written both (the ConfigMap is applied before the Deployment).
    reconciled(cluster)
    config_map = cluster.get("v1/configmaps", NAMESPACE, NAME)
    assert config_map is not None and json.loads(config_map["data"]["adapters.json"]) == {"adapters": [SQL]}
    deployment = cluster.get("apps/v1/deployments", NAMESPACE, NAME)
    assert deployment is not None
    template = deployment["spec"]["template"]

    # Two running replicas and one on the node's network (never asked: its IP is the node's).
    add_pod(cluster, "llama-a", phase="Running", podIP="127.0.0.1", hostIP="10.0.0.9")
    add_pod(cluster, "llama-b", phase="Running", podIP="127.0.0.1", hostIP="10.0.0.9")
    add_pod(cluster, "llama-host", phase="Running", podIP="127.0.0.1", hostIP="127.0.0.1")
    add_pod(cluster, "llama-pending", phase="Pending")
    state.answer = {"adapters": [entry("sql", SQL["uri"], "Loading")]}
    loading = cluster.wait_condition(NAMESPACE, NAME, "AdaptersReady", "False", "Loading")
    assert "sql" in loading["message"]
    # Both replicas counted (the pods were added one after the other: a read may have seen one).
    (sql,) = wait_for(
        lambda: [a for a in cluster.get_cr(NAMESPACE, NAME)["status"]["adapters"] if a["replicas"] == 2],
        timeout=30,
        message="both replicas counted",
    )
    assert sql["state"] == "Loading" and sql["readyReplicas"] == 0
    assert [p["pod"] for p in sql["pods"]] == ["llama-a", "llama-b"]
    assert set(state.asked) == {"/adapters"}

    state.answer = {"adapters": [entry("sql", SQL["uri"], "Ready")]}
    cluster.wait_condition(NAMESPACE, NAME, "AdaptersReady", "True", "Loaded")

    # A second adapter: the ConfigMap changes, the pods' template does not (no restart).
    assert cluster.patch_cr(NAMESPACE, NAME, {"spec": {"adapters": [SQL, CHAT]}}).is_success
    reconciled(cluster)  # of the new generation: every object it writes is written
    config_map = cluster.get("v1/configmaps", NAMESPACE, NAME)
    assert config_map is not None and json.loads(config_map["data"]["adapters.json"]) == {"adapters": [SQL, CHAT]}
    deployment = cluster.get("apps/v1/deployments", NAMESPACE, NAME)
    assert deployment is not None and deployment["spec"]["template"] == template
    # One replica cannot load it; a hostile reason is cut short, and the other keeps serving.
    failed = {"adapters": [entry("sql", SQL["uri"], "Ready"), entry("chat", CHAT["uri"], "Failed", "x" * 5000)]}
    state.answer = failed
    failure = cluster.wait_condition(NAMESPACE, NAME, "AdaptersReady", "False", "AdapterFailed")
    assert failure["message"].startswith("chat on llama-a: xxx") and len(failure["message"]) <= 300
    states = {a["name"]: a["state"] for a in cluster.get_cr(NAMESPACE, NAME)["status"]["adapters"]}
    assert states == {"sql": "Ready", "chat": "Failed"}

    # No adapters any more: the ConfigMap stays for vLLM's LoRA slots only if runtime.lora says so;
    # status.adapters and the condition go.
    assert cluster.patch_cr(NAMESPACE, NAME, {"spec": {"adapters": []}}).is_success
    wait_for(
        lambda: (
            "adapters" not in (cluster.get_cr(NAMESPACE, NAME).get("status") or {})
            and adapters_condition(cluster) is None
        ),
        timeout=30,
        message="adapter status cleared",
    )
    wait_for(lambda: cluster.get("v1/configmaps", NAMESPACE, NAME) is None, timeout=30, message="ConfigMap pruned")
