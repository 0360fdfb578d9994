"""What `kubectl get ris` says is true on a real cluster: broken services say why within
seconds (a model that cannot be fetched or loaded, a crash loop, an image that cannot be
pulled, out of memory, no node), status never stays stale, model pods are Guaranteed, a
namespace goes as soon as its pods have stopped, and after `helm uninstall` services can
still be deleted.

Set TIER_STATUS_TRANSCRIPT to a file to keep what `kubectl get ris` and `kubectl describe ris`
printed for each failure."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.autoscaler.conftest import tiny_mlp
from tests.tiers.pods import (
    CHART,
    FIGURES,
    OPERATOR_NAMESPACE,
    ROOT,
    FileServer,
    apply,
    chart_values,
    file_server,
    helm_install,
    kubectl_json,
    namespace,
    pods,
    wait_ready_pods,
)
from testsupport import images
from testsupport.cluster import condition, wait_for
from testsupport.nodecluster import NodeCluster

pytestmark = [pytest.mark.pods, pytest.mark.slow, pytest.mark.timeout(900)]

NS = "broken"
RELEASE = "rio"
SECRET_QUERY = "X-Amz-Signature=s3cr3tsignature&token=tok3n"


@pytest.fixture(scope="module")
def files(node: NodeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FileServer]:
    root = tmp_path_factory.mktemp("files")
    (root / "good").mkdir()
    tiny_mlp(root / "good" / "model.onnx")
    (root / "garbage").mkdir()
    (root / "garbage" / "model.onnx").write_bytes(b"not a model, though it is named like one\n" * 64)
    with file_server(root, node) as server:
        yield server


@pytest.fixture(scope="module")
def release(node: NodeCluster, files: FileServer, tmp_path_factory: pytest.TempPathFactory) -> dict:
    apply(node, namespace(OPERATOR_NAMESPACE), namespace(NS))
    values = chart_values(files.ca.read_text(), prometheus={"allowedUrls": ["http://10.244.0.1:9"]})
    return helm_install(node, RELEASE, values, tmp_path_factory.mktemp("helm"))


def service(name: str, uri: str, ns: str = NS, **spec: object) -> dict:
    body: dict = {
        "model": {"uri": uri},
        "runtime": {
            "image": images.MODEL_SERVER_IMAGE,
            "imagePullPolicy": "Never",
            "executionProviders": ["CPUExecutionProvider"],
        },
        "resources": {"gpu": {"count": 0}, "cpu": "100m", "memory": "512Mi"},
    }
    for key, value in spec.items():
        body[key] = {**body.get(key, {}), **value} if isinstance(value, dict) else value
    return {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": ns},
        "spec": body,
    }


def transcript(text: str) -> None:
    path = os.environ.get("TIER_STATUS_TRANSCRIPT")
    if path:
        with pathlib.Path(path).open("a") as out:
            out.write(text)


def ris(node: NodeCluster, name: str, ns: str = NS) -> dict:
    return kubectl_json(node, "get", "ris", name, "-n", ns)


def test_broken_services_say_why_within_seconds(node: NodeCluster, release: dict, files: FileServer) -> None:
    cases = {
        # name: (the service, the reason, words the message must have)
        "fetch-404": (
            service("fetch-404", f"{files.url}/missing/model.onnx?{SECRET_QUERY}"),
            "ModelFetchFailed",
            "HTTP 404",
        ),
        "not-onnx": (service("not-onnx", f"{files.url}/garbage/model.onnx"), "ModelLoadFailed", "INVALID_PROTOBUF"),
        "too-big": (
            service("too-big", f"{files.url}/good/model.onnx", resources={"cpu": "64"}),
            "Unschedulable",
            "Insufficient cpu",
        ),
        "no-image": (
            service(
                "no-image",
                f"{files.url}/good/model.onnx",
                runtime={"image": "localhost/rocm-inference/no-such-server:1"},
            ),
            "ImagePullBackOff",
            "no-such-server",
        ),
        "tiny-memory": (
            service("tiny-memory", f"{files.url}/good/model.onnx", resources={"memory": "64Mi"}),
            "OOMKilled",
            "64Mi",
        ),
        "bad-flag": (
            service("bad-flag", f"{files.url}/good/model.onnx", runtime={"args": ["--max-versions=-1"]}),
            "CrashLoopBackOff",
            "exited with code 2",
        ),
    }
    applied = time.monotonic()
    apply(node, *(manifest for manifest, _, _ in cases.values()))
    seen: dict[str, float] = {}

    def said() -> bool:
        for name, (_, reason, words) in cases.items():
            degraded = condition(ris(node, name), "Degraded") or {}
            if name not in seen and degraded.get("reason") == reason and words in degraded.get("message", ""):
                seen[name] = time.monotonic() - applied
        return len(seen) == len(cases)

    try:
        wait_for(said, timeout=240, interval=1, message="every broken service's reason in its status")
    finally:
        missing = sorted(set(cases) - set(seen))
        assert not missing, {n: condition(ris(node, n), "Degraded") for n in missing}
    for name, seconds in seen.items():
        FIGURES[f"{name}: applied to Degraded with its reason (s)"] = seconds
    for name, (_, reason, _) in cases.items():
        status = ris(node, name)["status"]
        degraded, ready = condition(status and {"status": status}, "Degraded"), condition({"status": status}, "Ready")
        assert ready is not None and (ready["status"], ready["reason"]) == ("False", reason), ready
        assert degraded is not None and degraded["message"] in ready["message"]
        assert "s3cr3t" not in json.dumps(status) and "tok3n" not in json.dumps(status)
        # Status from the Deployment as its controller last wrote it, never the copy an apply answered.
        progressing = condition({"status": status}, "Progressing") or {}
        assert "observe the new spec" not in progressing.get("message", ""), (name, progressing)
        assert status["replicas"] == 1, (name, status)
        events = kubectl_json(node, "get", "events", "-n", NS, "--field-selector", f"involvedObject.name={name}")
        assert any(e["type"] == "Warning" and e["reason"] == reason for e in events["items"]), name
    table = node.kubectl("get", "ris", "-n", NS).stdout
    transcript(f"$ kubectl get ris -n {NS}\n{table}\n")
    for name in cases:
        described = node.kubectl("describe", "ris", name, "-n", NS).stdout
        transcript(f"$ kubectl describe ris {name} -n {NS}\n{described}\n")


def test_model_pods_are_guaranteed(node: NodeCluster, release: dict) -> None:
    found = pods(node, NS, "app.kubernetes.io/component=predictor")
    assert found
    assert {p["metadata"]["name"]: p["status"].get("qosClass") for p in found} == {
        p["metadata"]["name"]: "Guaranteed" for p in found
    }


def test_a_namespace_goes_once_its_pods_have_stopped(node: NodeCluster, release: dict, files: FileServer) -> None:
    """The namespace controller waits out the pods' longest grace period before it looks again:
    a grace period sized to the server's shutdown, not 60 s it never uses, bounds the deletion."""
    ns = "quick"
    apply(node, namespace(ns), service("pair", f"{files.url}/good/model.onnx", ns=ns, replicas=2))
    wait_ready_pods(node, ns, "app.kubernetes.io/instance=pair", 2, timeout=180)
    (grace,) = {p["spec"]["terminationGracePeriodSeconds"] for p in pods(node, ns, "app.kubernetes.io/instance=pair")}
    started = time.monotonic()
    node.kubectl("delete", "namespace", ns, "--wait=false")
    wait_for(
        lambda: node.kubectl("get", "namespace", ns, check=False).returncode != 0,
        timeout=40,
        interval=0.5,
        message=f"namespace {ns} gone (the pods' grace period is {grace} s)",
    )
    FIGURES["namespace with a 2-replica service deleted (s)"] = time.monotonic() - started


def helm_uninstall(node: NodeCluster, work: pathlib.Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.chart.helm_cli", "uninstall", RELEASE,
         "--namespace", OPERATOR_NAMESPACE, "--kubeconfig", str(node.kubeconfig("admin"))],
        cwd=ROOT, capture_output=True, text=True, timeout=180, check=False,
        env={**os.environ, "HELM_CACHE_HOME": str(work), "HELM_CONFIG_HOME": str(work), "HELM_DATA_HOME": str(work)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_after_helm_uninstall_services_with_daemons_can_be_deleted(
    node: NodeCluster, release: dict, files: FileServer, tmp_path: pathlib.Path
) -> None:
    """Last: it uninstalls the operator. A service with a daemon (the built-in autoscaler) must
    not be left holding a finalizer only the operator could remove."""
    ns = "orphan"
    autoscaled = service(
        "scaled",
        f"{files.url}/good/model.onnx",
        ns=ns,
        autoscaling={
            "minReplicas": 1,
            "maxReplicas": 2,
            "metric": "rps",
            "target": 10,
            "prometheusUrl": "http://10.244.0.1:9",
        },
    )
    apply(node, namespace(ns), autoscaled)
    wait_for(lambda: (ris(node, "scaled", ns).get("status") or {}).get("url"), timeout=60, message="reconciled")
    helm_uninstall(node, tmp_path)
    wait_for(
        lambda: not pods(node, OPERATOR_NAMESPACE, f"app.kubernetes.io/instance={RELEASE}"),
        timeout=120,
        message="the operator's pods gone",
    )
    assert CHART.is_dir()
    node.kubectl("delete", "ris", "scaled", "-n", ns, "--wait=false")
    wait_for(
        lambda: node.kubectl("get", "ris", "scaled", "-n", ns, check=False).returncode != 0,
        timeout=30,
        message="the InferenceService gone with no operator running",
    )
    node.kubectl("delete", "namespace", ns, "--wait=false")
    wait_for(
        lambda: node.kubectl("get", "namespace", ns, check=False).returncode != 0,
        timeout=90,
        interval=0.5,
        message=f"namespace {ns} gone",
    )
