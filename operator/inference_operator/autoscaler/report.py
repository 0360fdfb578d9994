"""What status.autoscaler may keep: the reports of the built-in loops the spec still runs.

A loop writes its report (`ScaleTarget.report`) and nothing else removes it, so without this a
service whose mode moved from builtin to hpa or keda, or a prefill/decode role that left the
built-in loop, would show its last reading for good (`kubectl get ris` prints it). The
reconcile's status write drops what no loop of the new spec writes (pure: the spec and the
status as read).
"""

from __future__ import annotations

from ..jsontypes import JsonObject
from ..models import AutoscalingMode, InferenceServiceSpec
from ..models.status import RoleAutoscalerStatus
from .pair import builtin_roles

# A single loop's report (RoleAutoscalerStatus, by its names in the status), and the pair's:
# its reason and lastScaleTime (the pair's scale to zero), beside each role's report.
SINGLE_KEYS = frozenset(field.alias or name for name, field in RoleAutoscalerStatus.model_fields.items())
PAIR_KEYS = frozenset({"reason", "lastScaleTime"})


def leftover_reports(spec: InferenceServiceSpec, status: JsonObject | None) -> JsonObject:
    """The status changes that remove status.autoscaler's parts no loop of `spec` writes: all of
    it when no loop is on builtin, a role's report once that role is not (or the service is no
    longer a pair), a single loop's readings once the service is a pair. Empty when nothing is
    left over, so a status write that carries it changes nothing twice."""
    written = (status or {}).get("autoscaler")
    if not written:
        return {}
    kept = written_keys(spec)
    if kept is None:
        return {"autoscaler": None}
    gone = [key for key in written if key not in kept]
    return {"autoscaler": dict.fromkeys(gone)} if gone else {}


def written_keys(spec: InferenceServiceSpec) -> frozenset[str] | None:
    """The keys of status.autoscaler the spec's built-in loops write; None: no loop runs."""
    if spec.disaggregation is not None:
        running = frozenset(str(role) for role in builtin_roles(spec))
        return running | PAIR_KEYS if running else None
    if spec.autoscaling is None or spec.autoscaling.mode != AutoscalingMode.BUILTIN:
        return None
    return SINGLE_KEYS
