"""The activator's narrow right on a real kube-apiserver: its ClusterRole may `patch` every
InferenceService, and the chart's wake-only ValidatingAdmissionPolicy lets its ServiceAccount
change the wake annotation and nothing else. Requests are made as that ServiceAccount
(impersonated by the admin, as the API server authorises and admits them for the account), with
the chart's own ServiceAccount, ClusterRole, binding and policy installed from the rendered chart.
tests/chart/test_admission_policy.py runs the same policy's CEL over a table of writes.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import yaml

from inference_operator.builders.activator import WAKE_ANNOTATION
from tests.chart import helm as h
from tests.chart.conftest import require_helm
from testsupport.envtest import ApiServer
from testsupport.waiting import eventually

pytestmark = [pytest.mark.realapi, pytest.mark.slow, pytest.mark.integration]

CRS = "/apis/inference.rocm.dev/v1alpha1/namespaces/{ns}/inferenceservices"
MERGE = {"Content-Type": "application/merge-patch+json"}
_releases = itertools.count()


@dataclass
class Activator:
    """The installed activator's identity, and a namespace with one InferenceService to wake."""

    user: str
    namespace: str
    name: str

    @property
    def path(self) -> str:
        return CRS.format(ns=self.namespace) + "/" + self.name


def _as(apiserver: ApiServer, user: str) -> httpx.Client:
    client = apiserver.client()
    client.headers["Impersonate-User"] = user
    return client


def _patch(client: httpx.Client, path: str, body: dict[str, Any], dry_run: bool = False) -> httpx.Response:
    return client.patch(path, json=body, headers=MERGE, params={"dryRun": "All"} if dry_run else {})


def _wake(stamp: str) -> dict[str, Any]:
    return {"metadata": {"annotations": {WAKE_ANNOTATION: stamp}}}


@pytest.fixture
def activator(apiserver: ApiServer) -> Iterator[Activator]:
    """The chart's activator objects (default values) applied; its policy in force."""
    require_helm()
    n = next(_releases)
    stamp = int(time.time() * 1000) % 100000
    release, system, ns = f"wake{n}", f"wake{n}-{stamp}-system", f"wake{n}-{stamp}"
    kinds = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy"}
    kinds.add("ValidatingAdmissionPolicyBinding")
    objects = [o for o in h.render(None, namespace=system, release=release) if h.is_activator(o) and o["kind"] in kinds]
    assert sorted(o["kind"] for o in objects) == sorted(kinds)
    (account,) = (o for o in objects if o["kind"] == "ServiceAccount")
    user = f"system:serviceaccount:{system}:{account['metadata']['name']}"
    for namespace in (system, ns):
        apiserver.kubectl("create", "namespace", namespace)
    target = Activator(user=user, namespace=ns, name="llm")
    stored = {
        "apiVersion": "inference.rocm.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {
            "name": target.name,
            "namespace": ns,
            "labels": {"team": "a"},
            "annotations": {"team.example.com/cost-centre": "42"},
        },
        "spec": {
            "model": {"uri": "pvc://models/m"},
            "autoscaling": {"minReplicas": 0, "maxReplicas": 2, "target": 50, "scaleToZero": {}},
        },
    }
    with apiserver.client() as admin:
        assert admin.post(CRS.format(ns=ns), json=stored).status_code == 201
    apiserver.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(objects))
    try:
        # In force when the account may wake (RBAC) and may not write the spec (the policy).
        start = time.monotonic()
        with _as(apiserver, user) as client:
            eventually(
                lambda: (
                    _patch(client, target.path, _wake("2026-12-07T08:00:00Z"), dry_run=True).status_code == 200
                    and _patch(client, target.path, {"spec": {"replicas": 3}}, dry_run=True).status_code == 403
                ),
                interval=0.2,
                what="the activator's RBAC and wake-only policy in force (the API server's informers)",
            )
        print(f"activator RBAC and wake-only policy in force after {time.monotonic() - start:.1f} s")
        yield target
    finally:
        for obj in objects:
            if obj["kind"] != "ServiceAccount":
                apiserver.kubectl("delete", obj["kind"], obj["metadata"]["name"], "--ignore-not-found")


def test_the_activator_may_wake_a_service_and_change_nothing_else(apiserver: ApiServer, activator: Activator) -> None:
    with _as(apiserver, activator.user) as client, apiserver.client() as admin:
        before = admin.get(activator.path).json()

        woken = _patch(client, activator.path, _wake("2026-12-07T09:00:00Z"))
        assert woken.status_code == 200, woken.text
        assert woken.json()["metadata"]["annotations"][WAKE_ANNOTATION] == "2026-12-07T09:00:00Z"

        refused = {
            "spec": ({"spec": {"runtime": {"image": "attacker/steal"}}}, "may not change an InferenceService's spec"),
            "spec with a wake": (
                {"spec": {"replicas": 5}, **_wake("2026-12-07T09:01:00Z")},
                "may not change an InferenceService's spec",
            ),
            "label": ({"metadata": {"labels": {"team": "b"}}}, "may not change an InferenceService's labels"),
            "annotation": (
                {"metadata": {"annotations": {"team.example.com/cost-centre": None}}},
                "annotations other than inference.rocm.dev/wake",
            ),
            "finalizer": ({"metadata": {"finalizers": ["evil/hold"]}}, "finalizers or owners"),
            "not a timestamp": (_wake("x" * 1024), "must be a timestamp"),
        }
        for name, (body, message) in refused.items():
            response = _patch(client, activator.path, body)
            assert response.status_code == 403, (name, response.text)
            assert "ValidatingAdmissionPolicy" in response.json()["message"], (name, response.text)
            assert message in response.json()["message"], (name, response.text)

        after = admin.get(activator.path).json()
        assert after["spec"] == before["spec"]
        assert after["metadata"]["labels"] == before["metadata"]["labels"]
        assert after["metadata"].get("finalizers") is None
        assert after["metadata"]["annotations"] == {
            **before["metadata"]["annotations"],
            WAKE_ANNOTATION: "2026-12-07T09:00:00Z",
        }

        # RBAC gives it patch alone: no delete, no update, no status.
        assert client.delete(activator.path).status_code == 403
        assert client.put(activator.path, json=after).status_code == 403
        assert _patch(client, activator.path + "/status", {"status": {"replicas": 1}}).status_code == 403

        # The policy binds the activator alone: the admin's spec write passes.
        assert _patch(admin, activator.path, {"spec": {"replicas": 1}}).status_code == 200
