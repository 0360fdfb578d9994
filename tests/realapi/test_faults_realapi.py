"""Faults of the control plane under the running operator, on a real kube-apiserver and etcd.

The API server and etcd restart (an upgrade, a node reboot) while a spec change, a scale-up and a
new service are in flight: the operator reconnects by itself, every change lands, each object
is created once, and a later resync finds nothing left to write. The namespace is this module's
own; the server is the tier's, back up when the test ends.
"""

from __future__ import annotations

import pytest

from testsupport.envtest import ApiServer
from testsupport.waiting import eventually

from .conftest import Operator
from .test_operator_realapi import apply_cr, container, deployment, namespace, observed, resnet

pytestmark = [pytest.mark.slow, pytest.mark.integration]

#: A control plane's restart on a loaded machine, and the operator's watch coming back after it.
CONVERGE_S = 240


def converged(server: ApiServer, ns: str) -> bool:
    a, b = deployment(server, ns, "a"), deployment(server, ns, "b")
    return bool(
        a
        and b
        and container(a)["resources"]["limits"].get("amd.com/gpu") == "2"
        and a["spec"]["replicas"] == 3
        and observed(server, ns, "a")
        and observed(server, ns, "b")
    )


def test_changes_in_flight_survive_an_api_server_restart(apiserver: ApiServer, operator: Operator) -> None:
    ns = namespace(apiserver)
    apply_cr(apiserver, ns, "a", resnet(gpus=1))
    eventually(lambda: observed(apiserver, ns, "a"), timeout=CONVERGE_S, what="a's first reconcile")

    # Three changes, and the control plane goes away before the operator can have applied them.
    apply_cr(apiserver, ns, "a", resnet(gpus=2))
    apiserver.kubectl("-n", ns, "scale", "inferenceservice/a", "--replicas=3")
    apply_cr(apiserver, ns, "b", resnet(gpus=1))
    apiserver.restart(down_s=3)

    eventually(lambda: converged(apiserver, ns), timeout=CONVERGE_S, what="every change after the restart")
    assert operator.process is not None and operator.process.poll() is None, operator.text()[-3000:]
    writes = apiserver.operator_writes(ns)
    # Each object is made once (the audit log counts successful writes: a create retried across
    # the restart would be a second one), and the spec change and the scale were applied.
    creations = {k: v for k, v in writes.items() if k.endswith(":create") and not k.startswith("events")}
    assert creations.get("deployments:create") == 2 and all(n <= 2 for n in creations.values()), writes

    # Nothing is left half-written: a restarted operator's resync of both writes nothing here.
    assert operator.stop() == 0
    logged = len(operator.text())
    before = apiserver.operator_writes(ns)
    operator.start()

    def quiet_resyncs() -> int:
        lines = operator.text()[logged:].splitlines()
        return sum(f"[{ns}/" in line and "reconciled generation" in line and ": 0 writes" in line for line in lines)

    eventually(lambda: quiet_resyncs() >= 2, timeout=CONVERGE_S, what="both services resynced with 0 writes")
    resync = apiserver.operator_writes(ns) - before
    assert {k: v for k, v in resync.items() if not k.startswith(("events", "inferenceservices"))} == {}, resync
