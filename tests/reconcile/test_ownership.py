"""Field ownership and drift, on managedFields shaped as a real API server writes them."""

from __future__ import annotations

import copy
import json

import pytest

from inference_operator.builders import Owner, build_all
from inference_operator.models import parse_spec
from inference_operator.ownership import drift, foreign_spec_managers, merge, split
from inference_operator.reconcile import Action, ForeignObjectError, plan_write
from inference_operator.settings import MANAGER
from inference_operator.stages.base import with_hash

UID = "0b7c6c1e-1111-4222-8333-944455556666"
OWNER_REF = "k:" + json.dumps({"uid": UID}, separators=(",", ":"))
SERVER = 'k:{"name":"server"}'


def desired_deployment(**spec: object) -> dict:
    base = {"model": {"uri": "pvc://models/resnet"}, "resources": {"gpu": {"count": 2}}}
    owner = Owner(name="resnet", namespace="ml", uid=UID, spec=parse_spec({**base, **spec}))
    return with_hash(build_all(owner)[0])


def entry(manager: str, fields: dict, operation: str = "Update", subresource: str | None = None) -> dict:
    found = {"manager": manager, "operation": operation, "apiVersion": "apps/v1", "fieldsType": "FieldsV1"}
    if subresource:
        found["subresource"] = subresource
    return {**found, "fieldsV1": fields}


def live_with(desired: dict, *entries: dict) -> dict:
    live = copy.deepcopy(desired)
    live["metadata"]["resourceVersion"] = "7"
    live["metadata"]["managedFields"] = list(entries)
    return live


OURS = entry(
    MANAGER,
    {"f:spec": {"f:template": {"f:spec": {"f:containers": {SERVER: {".": {}, "f:image": {}}}}}}},
    operation="Apply",
)
CONTROLLER_STATUS = entry("kube-controller-manager", {"f:status": {"f:replicas": {}}}, subresource="status")
CONTROLLER_REVISION = entry(
    "kube-controller-manager", {"f:metadata": {"f:annotations": {".": {}, "f:deployment.kubernetes.io/revision": {}}}}
)


def test_an_object_only_we_applied_has_not_drifted() -> None:
    desired = desired_deployment()
    live = live_with(desired, OURS, CONTROLLER_STATUS, CONTROLLER_REVISION)
    assert drift(live, desired, UID, MANAGER) is None
    assert foreign_spec_managers(live, MANAGER) == []
    assert plan_write(desired, live, UID).action == Action.UNCHANGED


def test_an_object_created_by_post_is_taken_over_whole() -> None:
    # What earlier versions left: created by POST, so the client's default manager owns it all.
    desired = desired_deployment()
    legacy = entry(
        "OpenAPI-Generator",
        {
            "f:metadata": {
                "f:annotations": {".": {}, "f:inference.rocm.dev/spec-hash": {}},
                "f:labels": {".": {}, "f:app.kubernetes.io/instance": {}},
                "f:ownerReferences": {".": {}, OWNER_REF: {}},
            },
            "f:spec": {
                "f:replicas": {},
                "f:template": {
                    "f:spec": {
                        "f:containers": {SERVER: {"f:env": {'k:{"name":"ROCR_VISIBLE_DEVICES"}': {".": {}}}}},
                        "f:tolerations": {},
                    }
                },
            },
        },
    )
    live = live_with(desired, legacy, CONTROLLER_STATUS, CONTROLLER_REVISION)
    found = drift(live, desired, UID, MANAGER)
    assert found is not None and found.managers == ("OpenAPI-Generator",)
    ours, *rest = found.managed_fields
    assert (ours["manager"], ours["operation"]) == (MANAGER, "Apply")
    spec = ours["fieldsV1"]["f:spec"]["f:template"]["f:spec"]
    # Fields the spec may later drop (GPU env, tolerations) are now ours, so an apply removes them.
    assert 'k:{"name":"ROCR_VISIBLE_DEVICES"}' in spec["f:containers"][SERVER]["f:env"]
    assert "f:tolerations" in spec
    assert OWNER_REF in ours["fieldsV1"]["f:metadata"]["f:ownerReferences"]
    # What the controllers own stays theirs; the legacy manager keeps only the map markers.
    assert CONTROLLER_STATUS in rest and CONTROLLER_REVISION in rest
    leftover = next(e for e in rest if e["manager"] == "OpenAPI-Generator")
    assert "f:spec" not in leftover["fieldsV1"]
    assert plan_write(desired, live, UID).action == Action.REPAIRED


def test_a_hand_edit_is_drift_and_is_named() -> None:
    desired = desired_deployment()
    set_image = entry(
        "kubectl-set", {"f:spec": {"f:template": {"f:spec": {"f:containers": {SERVER: {"f:image": {}}}}}}}
    )
    privileged = entry(
        "kubectl-edit",
        {"f:spec": {"f:template": {"f:spec": {"f:containers": {SERVER: {"f:securityContext": {"f:privileged": {}}}}}}}},
    )
    live = live_with(desired, OURS, set_image, privileged)
    assert foreign_spec_managers(live, MANAGER) == ["kubectl-edit", "kubectl-set"]
    found = drift(live, desired, UID, MANAGER)
    assert found is not None and found.describe() == "fields changed by kubectl-edit, kubectl-set"
    container = found.managed_fields[0]["fieldsV1"]["f:spec"]["f:template"]["f:spec"]["f:containers"][SERVER]
    assert "f:privileged" in container["f:securityContext"] and "f:image" in container
    assert [e["manager"] for e in found.managed_fields] == [MANAGER]


@pytest.mark.parametrize(
    ("autoscaling", "drifted"),
    [
        ({"mode": "hpa", "minReplicas": 1, "maxReplicas": 4, "target": 50}, False),  # the HPA owns replicas
        (None, True),  # `kubectl scale` on a fixed-size service is undone
    ],
)
def test_replicas_scaled_by_others_are_drift_only_when_we_own_the_count(
    autoscaling: dict | None, drifted: bool
) -> None:
    desired = desired_deployment(autoscaling=autoscaling) if autoscaling else desired_deployment()
    scaled = entry("kube-controller-manager", {"f:spec": {"f:replicas": {}}}, subresource="scale")
    live = live_with(desired, OURS, scaled)
    assert (drift(live, desired, UID, MANAGER) is not None) == drifted


def test_rollout_restart_and_foreign_labels_are_left_alone() -> None:
    desired = desired_deployment()
    restart = entry(
        "kubectl-rollout",
        {"f:spec": {"f:template": {"f:metadata": {"f:annotations": {"f:kubectl.kubernetes.io/restartedAt": {}}}}}},
    )
    team_label = entry("kubectl-label", {"f:metadata": {"f:labels": {"f:team": {}}}})
    live = live_with(desired, OURS, restart, team_label)
    assert drift(live, desired, UID, MANAGER) is None


def test_a_changed_label_value_is_repaired_and_a_foreign_object_refused() -> None:
    desired = desired_deployment()
    live = live_with(desired, OURS)
    live["metadata"]["labels"]["app.kubernetes.io/instance"] = "other"
    assert plan_write(desired, live, UID).action == Action.REPAIRED
    live["metadata"]["ownerReferences"] = []
    with pytest.raises(ForeignObjectError):
        plan_write(desired, live, UID)


def test_split_and_merge_are_inverse() -> None:
    fields = {"f:a": {"f:b": {}, "f:c": {"f:d": {}}}, "f:e": {}}
    kept, moved = split(fields, lambda path: path[-1] in ("f:b", "f:e"))
    assert kept == {"f:a": {"f:b": {}}, "f:e": {}}
    assert moved == {"f:a": {"f:c": {"f:d": {}}}}
    assert merge(kept, moved) == fields
