"""Faults of the control plane under the running operator, on a real kube-apiserver and etcd.

The API server and etcd restart (an upgrade, a node reboot) while a spec change, a scale-up and a
new service are in flight: the operator reconnects by itself, every change lands, each object
is created once, and a later resync finds nothing left to write. The namespace is this module's
own; the server is the tier's, back up when the test ends.
"""

from __future__ import annotations

import pytest

from tests.reconcile.test_operator_realapi import apply_cr, container, deployment, isvc, namespace, observed, resnet
from tests.tiers import realapi
from tests.tiers.realapi import Operator
from testsupport.envtest import ApiServer
from testsupport.waiting import eventually

pytestmark = [pytest.mark.realapi, pytest.mark.slow, pytest.mark.integration]
operator = realapi.operator_fixture()  # the tier's operator process, not the emulator's

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
    # Nothing written twice (the audit log counts successful writes; the operator creates and
    # updates by server-side apply, a patch): one apply of each Service, NetworkPolicy and PDB
    # (a's, at 3 replicas), and of the Deployments one per change at most (a's first, its spec
    # change, its scale, b's first; a spec change and a scale seen together make one).
    assert writes["services:patch"] == 2 and writes["networkpolicies:patch"] == 2, writes
    assert writes["poddisruptionbudgets:patch"] == 1 and 3 <= writes["deployments:patch"] <= 4, writes

    # Nothing is left half-written: a restarted operator's resync of both writes nothing here.
    logged = len(operator.text())
    with operator.stopped() as code:
        assert code == 0
        before = apiserver.operator_writes(ns)

    # The plain log names no object: each service is known by its generation's resync line.
    generations = {(isvc(apiserver, ns, name) or {})["metadata"]["generation"] for name in ("a", "b")}

    def quiet_resyncs() -> bool:
        text = operator.text()[logged:]
        return all(f"reconciled generation {g}: 0 writes" in text for g in generations)

    eventually(quiet_resyncs, timeout=CONVERGE_S, what=f"resyncs of generations {generations} with 0 writes")
    resync = apiserver.operator_writes(ns) - before
    assert {k: v for k, v in resync.items() if not k.startswith(("events", "inferenceservices"))} == {}, resync
