"""What status.autoscaler may keep: the reports of the built-in loops the spec still runs.

A loop writes its report (`ScaleTarget.report`) and nothing else removes it, so without this a
service whose mode moved from builtin to hpa or keda, or a prefill/decode role that left the
built-in loop, would show its last reading for good (`kubectl get ris` prints it). The
reconcile's status write drops what no loop of the new spec writes (pure: the spec and the
status as read).
"""

from __future__ import annotations

from ..builders.disaggregation import ROLES
from ..jsontypes import JsonObject
from ..models import AutoscalingMode, InferenceServiceSpec
from .pair import builtin_roles

# A single loop's report; the pair's reason and lastScaleTime (its scale to zero) share the names.
PAIR_KEYS = frozenset({"reason", "lastScaleTime"})


def leftover_reports(spec: InferenceServiceSpec, status: JsonObject | None) -> JsonObject:
    """The status changes that remove status.autoscaler's parts no loop of `spec` writes: all of
    it when no loop is on builtin, a role's report once that role is not (or the service is no
    longer a pair), a single loop's readings once the service is a pair. Empty when nothing is
    left over, so a status write that carries it changes nothing twice."""
    written = (status or {}).get("autoscaler")
    if not written:
        return {}
    if spec.disaggregation is None:
        single = spec.autoscaling is not None and spec.autoscaling.mode == AutoscalingMode.BUILTIN
        if not single:
            return {"autoscaler": None}
        gone = [str(role) for role in ROLES if str(role) in written]
    else:
        running = {str(role) for role in builtin_roles(spec)}
        if not running:
            return {"autoscaler": None}
        roles = {str(role) for role in ROLES}
        gone = [key for key in written if key not in running and (key in roles or key not in PAIR_KEYS)]
    return {"autoscaler": dict.fromkeys(gone)} if gone else {}
