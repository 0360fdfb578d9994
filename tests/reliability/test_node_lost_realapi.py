"""A model pod's node lost, on a real API server with the controllers that notice it.

kube-controller-manager runs its node lifecycle controller (a short grace period) and its
EndpointSlice controller; the test is the kubelet of two Nodes (it renews their Leases and
posts their status) and plays the ReplicaSet controller and the scheduler (one replica bound to
each node, Running and Ready). When one node's kubelet falls silent, the controller marks the
node `Ready=Unknown` and its pod not ready; the InferenceService's status and a Warning event
then name the node and the replicas on it, and the Service's EndpointSlice keeps only the pod on
the living node. When the node comes back, the status clears.

The module runs an API server of its own (the controllers and the operator act on all of it).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import subprocess
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.reconcile.test_operator_realapi import apply_cr, deployment, isvc, namespace, observed, resnet
from tests.tiers.realapi import Operator, own_apiserver, running_operator
from testsupport.envtest import ApiServer, assets
from testsupport.processes import stop
from testsupport.waiting import eventually

pytestmark = [pytest.mark.realapi, pytest.mark.slow, pytest.mark.integration]

NODES = ("node-a", "node-b")
#: The node lifecycle controller's grace period: a node silent this long is `Ready=Unknown`.
GRACE_S = 8
LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Kubelets:
    """The kubelets of NODES: each renews its node's Lease every second while alive."""

    def __init__(self, server: ApiServer):
        self.server = server
        self.alive = set(NODES)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, daemon=True)

    def register(self) -> None:
        """The Nodes, Ready, and their Leases, as a kubelet's registration makes them."""
        with self.server.client() as client:
            client.post("/api/v1/namespaces", json={"metadata": {"name": "kube-node-lease"}})
            for name in NODES:
                node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"test": "node"}}}
                assert client.post("/api/v1/nodes", json=node).status_code == 201
                self.post_ready(client, name)
                lease = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": name},
                    "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now()},
                }
                assert client.post(LEASES, json=lease).status_code == 201
        self._thread.start()

    @staticmethod
    def post_ready(client: httpx.Client, name: str) -> None:
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
            "lastHeartbeatTime": now()[:19] + "Z",
            "lastTransitionTime": now()[:19] + "Z",
        }
        answer = client.patch(
            f"/api/v1/nodes/{name}/status",
            content=json.dumps({"status": {"conditions": [ready]}}),
            headers={"Content-Type": "application/strategic-merge-patch+json"},
        )
        assert answer.status_code == 200, answer.text

    def _renew(self) -> None:
        with self.server.client() as client:
            while not self._stop.wait(1.0):
                for name in sorted(self.alive):
                    with contextlib.suppress(httpx.HTTPError):
                        client.patch(
                            f"{LEASES}/{name}",
                            content=json.dumps({"spec": {"renewTime": now()}}),
                            headers={"Content-Type": "application/merge-patch+json"},
                        )

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiServer, Kubelets, Operator]]:
    directory = assets()
    assert directory is not None
    if not (directory / "kube-controller-manager").is_file():
        pytest.skip(f"no kube-controller-manager in {directory}")
    with own_apiserver(tmp_path_factory, "envtest-nodes") as (server, work):
        with (work / "controller-manager.log").open("ab") as log:
            manager = subprocess.Popen(
                [
                    str(directory / "kube-controller-manager"),
                    f"--kubeconfig={server.kubeconfig('admin')}",
                    "--controllers=node-lifecycle-controller,endpointslice-controller",
                    "--node-monitor-period=1s",
                    f"--node-monitor-grace-period={GRACE_S}s",
                    "--leader-elect=false",
                    "--secure-port=0",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        kubelets = Kubelets(server)
        try:
            kubelets.register()
            with running_operator(server, work / "operator.log") as operator:
                yield server, kubelets, operator
        finally:
            kubelets.close()
            stop(manager)


def run_pods(server: ApiServer, ns: str, name: str) -> dict[str, str]:
    """What the ReplicaSet controller, the scheduler and the kubelets would do: one pod of the
    Deployment's template on each node, Running and Ready. node → pod IP."""
    template = (deployment(server, ns, name) or {})["spec"]["template"]
    ips = {}
    with server.client() as client:
        for index, node in enumerate(NODES):
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"{name}-{node}", "labels": template["metadata"]["labels"]},
                "spec": {**template["spec"], "nodeName": node},
            }
            answer = client.post(f"/api/v1/namespaces/{ns}/pods", json=pod)
            assert answer.status_code == 201, answer.text
            ips[node] = f"10.244.{index}.10"
            set_pod_ready(client, ns, f"{name}-{node}", pod["spec"], ips[node], True)
    return ips


def set_pod_ready(client: httpx.Client, ns: str, name: str, spec: dict, ip: str, ready: bool) -> None:
    """The pod's status as its kubelet posts it: Running, its containers ready."""
    status = "True" if ready else "False"
    containers = [
        {
            "name": c["name"],
            "ready": ready,
            "restartCount": 0,
            "image": c["image"],
            "imageID": "",
            "started": True,
            "state": {"running": {"startedAt": now()[:19] + "Z"}},
        }
        for c in spec["containers"]
    ]
    body = {
        "status": {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "hostIP": "192.0.2.1",
            "conditions": [
                {"type": kind, "status": status if kind in ("Ready", "ContainersReady") else "True"}
                for kind in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
            "containerStatuses": containers,
        }
    }
    answer = client.patch(
        f"/api/v1/namespaces/{ns}/pods/{name}/status",
        content=json.dumps(body),
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert answer.status_code == 200, answer.text


def ready_addresses(server: ApiServer, ns: str, service: str) -> set[str]:
    """The addresses the Service's EndpointSlices offer as ready (where requests go)."""
    with server.client() as client:
        slices = client.get(
            f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
            params={"labelSelector": f"kubernetes.io/service-name={service}"},
        ).json()["items"]
    return {
        address
        for s in slices
        for endpoint in s.get("endpoints") or []
        if (endpoint.get("conditions") or {}).get("ready")
        for address in endpoint["addresses"]
    }


def degraded(server: ApiServer, ns: str, name: str) -> dict:
    conditions = ((isvc(server, ns, name) or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "Degraded"), {})


def service_events(server: ApiServer, ns: str, reason: str) -> list[dict]:
    items = json.loads(server.kubectl("get", "events", "-n", ns, "-o", "json").stdout)["items"]
    return [e for e in items if e["reason"] == reason and e["involvedObject"]["kind"] == "InferenceService"]


def test_a_lost_node_is_named_in_the_status_and_its_replica_leaves_the_endpoints(
    cluster: tuple[ApiServer, Kubelets, Operator],
) -> None:
    server, kubelets, _ = cluster
    ns = namespace(server)
    apply_cr(server, ns, "a", resnet(gpus=1, replicas=2))
    eventually(lambda: observed(server, ns, "a") and deployment(server, ns, "a"), timeout=120, what="a reconciled")
    ips = run_pods(server, ns, "a")
    eventually(lambda: ready_addresses(server, ns, "a") == set(ips.values()), timeout=60, what="both pods ready")
    assert degraded(server, ns, "a").get("reason") != "NodeNotReady"

    kubelets.alive.discard("node-b")  # node-b's kubelet falls silent
    silent = time.monotonic()

    def said() -> bool:
        condition = degraded(server, ns, "a")
        return condition.get("status") == "True" and condition.get("reason") == "NodeNotReady"

    eventually(said, timeout=GRACE_S + 90, what="Degraded=NodeNotReady")
    print(f"node-b silent to Degraded=NodeNotReady: {time.monotonic() - silent:.1f}s (grace {GRACE_S}s)")  # noqa: T201
    message = degraded(server, ns, "a")["message"]
    assert "node node-b is not ready, Ready=Unknown" in message and "1 of 2 replicas on it" in message, message
    assert "node-a" not in message
    eventually(lambda: service_events(server, ns, "NodeNotReady"), timeout=30, what="a NodeNotReady event")
    assert "node node-b" in service_events(server, ns, "NodeNotReady")[0]["message"]
    # Requests go only to the replica on the living node.
    eventually(lambda: ready_addresses(server, ns, "a") == {ips["node-a"]}, timeout=60, what="node-b's pod out")

    # node-b's kubelet is back: its node Ready, its pod Ready again (as a kubelet reposts them).
    kubelets.alive.add("node-b")
    with server.client() as client:
        Kubelets.post_ready(client, "node-b")
        pod = client.get(f"/api/v1/namespaces/{ns}/pods/a-node-b").json()
        set_pod_ready(client, ns, "a-node-b", pod["spec"], ips["node-b"], True)
    eventually(lambda: degraded(server, ns, "a").get("reason") != "NodeNotReady", timeout=60, what="the status clear")
    eventually(lambda: ready_addresses(server, ns, "a") == set(ips.values()), timeout=60, what="both pods ready again")
