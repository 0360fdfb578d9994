"""A prefill/decode pair at zero on a real kube-apiserver: the operator (the chart's RBAC, an
activator configured) and the activator's real process.

With disaggregation.scaleToZero and both roles at zero, NAME-prefill, NAME-decode and NAME-router
run no replica, the activator's slice leads NAME-router and the service is Ready (ScaledToZero).
A request for NAME-router's host at the activator is held and wakes the pair: one write of the
InferenceService sets both roles to one (the autoscaler's field manager owns both counts), both
Deployments and the router go 0 -> 1, and the slice stays until all three have a ready pod.

No kubelet or Deployment controller runs here: the test plays them through the status
subresource, and a held request cannot reach a ClusterIP; the real-pods tier is where it would
be answered.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.llm.test_disaggregation_realapi import pd_spec, play_rollout
from tests.reconcile.test_operator_realapi import apply_cr, deployment, isvc, namespace
from tests.scale_to_zero.test_router_zero_realapi import (
    SERVICE_NAME_LABEL,
    in_background,
    operator_with_activator,
    real_activator,
    the_slice,
)
from tests.tiers.realapi import Operator
from testsupport.cluster import condition, wait_for
from testsupport.envtest import SKIP_REASON, ApiServer, assets

pytestmark = [
    pytest.mark.realapi,
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.skipif(assets() is None, reason=SKIP_REASON),
]

NAME = "llm"
WORKLOADS = (f"{NAME}-prefill", f"{NAME}-decode", f"{NAME}-router")
SCALER_MANAGER = "rocm-inference-operator-autoscaler"


def pair_at_zero() -> dict[str, Any]:
    scaling = {
        "mode": "builtin",
        "maxReplicas": 2,
        "intervalSeconds": 600,  # no Prometheus here: the loop stays out of the way
    }
    return pd_spec(
        scaleToZero={"maxWaitSeconds": 300},  # held until the test ends
        prefill={"replicas": 0, "autoscaling": scaling | {"metric": "ttftP95Ms", "target": 500}},
        decode={"replicas": 0, "autoscaling": scaling | {"metric": "itlP95Ms", "target": 50}},
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiServer, Operator]]:
    """An API server of its own (its operator has an activator, the session's has not)."""
    with operator_with_activator(tmp_path_factory, "envtest-pd-zero") as running:
        yield running


def replicas(server: ApiServer, ns: str) -> dict[str, int | None]:
    return {name: ((deployment(server, ns, name) or {}).get("spec") or {}).get("replicas") for name in WORKLOADS}


def role_counts(obj: dict[str, Any]) -> tuple[int, int]:
    pd = obj["spec"]["disaggregation"]
    return pd["prefill"]["replicas"], pd["decode"]["replicas"]


def owned_by_scaler(obj: dict[str, Any]) -> dict[str, Any]:
    """The spec fields the autoscaler's field manager owns."""
    entries = [e for e in obj["metadata"].get("managedFields") or [] if e.get("manager") == SCALER_MANAGER]
    assert len(entries) == 1, entries
    return entries[0]["fieldsV1"]["f:spec"]["f:disaggregation"]


def test_a_held_request_wakes_both_roles_in_one_write_and_the_slice_waits_for_all_three(
    cluster: tuple[ApiServer, Operator], tmp_path: pathlib.Path
) -> None:
    server, operator = cluster
    ns = namespace(server)
    apply_cr(server, ns, NAME, pair_at_zero())

    # At zero: the router's Service leads to the activator; no role nor router runs.
    piece = wait_for(lambda: the_slice(server, ns), timeout=120, message="the activator's slice")
    assert piece["metadata"]["labels"][SERVICE_NAME_LABEL] == f"{NAME}-router", piece["metadata"]["labels"]
    wait_for(lambda: None not in replicas(server, ns).values(), timeout=60, message="the three Deployments")
    assert replicas(server, ns) == dict.fromkeys(WORKLOADS, 0)
    for name in WORKLOADS:
        play_rollout(server, ns, name, 0)
    ready = wait_for(
        lambda: (c := condition(isvc(server, ns, NAME), "Ready")) and c["reason"] == "ScaledToZero" and c,
        timeout=60,
        message="Ready at zero",
    )
    assert ready["status"] == "True", ready
    before = isvc(server, ns, NAME)
    assert role_counts(before) == (0, 0)

    # A request for the router's host at the activator: held, and both roles woken at once.
    with real_activator(server, tmp_path) as url:
        host = f"{NAME}-router.{ns}.svc"
        pending = in_background(
            lambda: httpx.post(f"{url}/v1/completions", headers={"host": host}, json={}, timeout=300)
        )
        woken = wait_for(
            lambda: (obj := isvc(server, ns, NAME)) and role_counts(obj) != (0, 0) and obj,
            timeout=60,
            message="the pair woken by the activator's wake annotation",
        )
        assert "inference.rocm.dev/wake" in woken["metadata"]["annotations"]
        assert role_counts(woken) == (1, 1)  # both in the write that woke the first
        # One spec write for the two roles (each spec change is one generation), owned by the
        # autoscaler's field manager.
        assert woken["metadata"]["generation"] == before["metadata"]["generation"] + 1
        owned = owned_by_scaler(woken)
        assert "f:replicas" in owned["f:prefill"] and "f:replicas" in owned["f:decode"], owned
        assert not pending.done()  # held: no replica yet
        wait_for(
            lambda: replicas(server, ns) == dict.fromkeys(WORKLOADS, 1),
            timeout=60,
            message="both roles' and the router's Deployments at one",
        )

        # The roles are Ready, no router pod yet: NAME-router has no ready endpoint, the slice stays.
        play_rollout(server, ns, f"{NAME}-prefill", 1)
        play_rollout(server, ns, f"{NAME}-decode", 1)
        wait_for(
            lambda: (
                {r["role"]: r["readyReplicas"] for r in isvc(server, ns, NAME)["status"].get("roles", [])}
                == {"prefill": 1, "decode": 1, "router": 0}
            ),
            timeout=60,
            message="the roles' ready counts in status.roles",
        )
        assert the_slice(server, ns) is not None, "the slice went before any router pod was ready"
        assert not pending.done()

        play_rollout(server, ns, f"{NAME}-router", 1)
        wait_for(lambda: the_slice(server, ns) is None, timeout=60, message="the slice removed")
    assert "Traceback" not in operator.text()
