"""status.autoscaler keeps only what the spec's built-in loops still write: a mode moved to hpa
or keda, or a prefill/decode role off the built-in loop, takes its last readings away (they
would otherwise stand in `kubectl get ris` for good)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from inference_operator.autoscaler.report import leftover_reports
from inference_operator.models import parse_spec
from testsupport.cluster import Cluster, inference_service, wait_for
from testsupport.crd import apply_defaults, crd_schema
from testsupport.emulator import CR_RESOURCE

SPEC_SCHEMA = crd_schema()["properties"]["spec"]
SCALING = {"maxReplicas": 4, "target": 200, "metric": "ttftP95Ms"}
READING = {"metric": "ttftP95Ms", "currentValue": 180.0, "desiredReplicas": 2, "reason": "within 10% of target"}
PAIR_ZERO = {"reason": "prefill and decode at zero: idle", "lastScaleTime": "2026-12-07T10:00:00Z"}


def single(mode: str) -> dict[str, Any]:
    scaling = SCALING | {"mode": mode}
    return {"model": {"uri": "pvc://models/llm"}, "runtime": {"engine": "vllm"}, "autoscaling": scaling}


def pair(prefill: str, decode: str) -> dict[str, Any]:
    return {
        "model": {"uri": "hf://org/llm@main", "name": "llm"},
        "runtime": {"engine": "vllm"},
        "routing": {"router": {}},
        "disaggregation": {
            "prefill": {"autoscaling": SCALING | {"mode": prefill}},
            "decode": {"autoscaling": SCALING | {"mode": decode, "metric": "itlP95Ms"}},
        },
    }


def leftovers(raw: dict[str, Any], autoscaler: dict[str, Any] | None) -> dict[str, Any]:
    spec = parse_spec(apply_defaults(SPEC_SCHEMA, copy.deepcopy(raw)))
    return leftover_reports(spec, None if autoscaler is None else {"autoscaler": autoscaler})


@pytest.mark.parametrize(
    ("raw", "autoscaler", "changes"),
    [
        (single("builtin"), READING, {}),  # the loop still writes it
        (single("hpa"), READING, {"autoscaler": None}),
        (single("keda"), READING, {"autoscaler": None}),
        ({"model": {"uri": "pvc://models/llm"}}, READING, {"autoscaler": None}),  # autoscaling removed
        (single("hpa"), None, {}),  # nothing written, nothing to remove
        (single("builtin"), READING | {"prefill": READING}, {"autoscaler": {"prefill": None}}),  # was a pair
        (pair("builtin", "builtin"), {"prefill": READING, "decode": READING} | PAIR_ZERO, {}),
        (pair("builtin", "hpa"), {"prefill": READING, "decode": READING} | PAIR_ZERO, {"autoscaler": {"decode": None}}),
        (pair("hpa", "builtin"), {"prefill": READING, "decode": READING}, {"autoscaler": {"prefill": None}}),
        (pair("hpa", "hpa"), {"prefill": READING, "decode": READING}, {"autoscaler": None}),
        # A single loop's readings once the service is a pair; the pair's reason and time stay.
        (
            pair("builtin", "builtin"),
            READING | {"latencyP95Ms": 90.0, "lastScaleTime": "2026-12-07T10:00:00Z"},
            {"autoscaler": dict.fromkeys(["metric", "currentValue", "desiredReplicas", "latencyP95Ms"])},
        ),
    ],
)
def test_only_the_reports_of_loops_the_spec_still_runs_are_kept(
    raw: dict[str, Any], autoscaler: dict[str, Any] | None, changes: dict[str, Any]
) -> None:
    found = leftovers(raw, autoscaler)
    if isinstance(found.get("autoscaler"), dict):
        assert sorted(found["autoscaler"]) == sorted(changes["autoscaler"]), found
        assert all(value is None for value in found["autoscaler"].values())
    else:
        assert found == changes


@pytest.mark.integration
@pytest.mark.parametrize(
    ("before", "after"),
    [
        (single("hpa"), single("hpa") | {"autoscaling": SCALING | {"mode": "hpa", "maxReplicas": 5}}),
        (pair("hpa", "hpa"), pair("keda", "hpa")),
    ],
    ids=["single", "pair"],
)
def test_the_reconcile_of_a_spec_off_the_builtin_loop_removes_its_readings(
    cluster: Cluster, operator: Any, before: dict[str, Any], after: dict[str, Any]
) -> None:
    """The readings a built-in loop left (written here as it writes them) go with the next
    reconcile's status write once no loop of the spec writes them; the rest of the status stays."""
    assert cluster.apply_cr(inference_service("llm", "ml", before)).status_code in (200, 201)
    observed = lambda: ((cluster.get_cr("ml", "llm") or {}).get("status") or {}).get("observedGeneration")  # noqa: E731
    wait_for(lambda: observed() == 1, message="the first reconcile")
    left = {"prefill": READING, "decode": READING} if "disaggregation" in before else READING
    response = cluster.patch(CR_RESOURCE, "ml", "llm", {"status": {"autoscaler": left}}, subresource="status")
    assert response.status_code == 200, response.text
    response = cluster.patch_cr("ml", "llm", {"spec": after})
    assert response.status_code == 200, response.text
    wait_for(lambda: observed() == 2, message="the reconcile of the new spec")
    status = (cluster.get_cr("ml", "llm") or {})["status"]
    assert "autoscaler" not in status, status["autoscaler"]
    assert status["url"] and status["conditions"]
