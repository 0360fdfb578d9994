"""InferenceService → policy/v1 PodDisruptionBudget, so node drains keep the model serving."""

from __future__ import annotations

from ..jsontypes import JsonObject
from ..kinds import POD_DISRUPTION_BUDGET
from .common import Owner, object_meta, selector_labels
from .deployment import desired_replicas


def needs_pdb(owner: Owner) -> bool:
    """A budget only makes sense with a replica to spare; with one it would block every drain."""
    spec = owner.spec
    floor = desired_replicas(spec)
    if floor is None and spec.autoscaling is not None:
        floor = spec.autoscaling.min_replicas
    return (floor or 0) > 1


def build_pdb(owner: Owner) -> JsonObject:
    return {
        **POD_DISRUPTION_BUDGET.header(),
        "metadata": object_meta(owner),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(owner)},
        },
    }
