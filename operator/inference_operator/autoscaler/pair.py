"""A prefill/decode pair (spec.disaggregation), `PairAutoscaler`: each role in mode builtin has an
`Autoscaler` of its own (its history, its interval, its metric read from its own pods), and one
role scaling up moves nothing of the other's. Scale to zero (disaggregation.scaleToZero) is the
pair's: a request needs a pod of each role, so one role at zero would leave every request failing
while the other idles. Neither role's loop goes to zero by itself; once both roles' loops hold
their counts and the service has answered no request for idleSeconds (its requests counted over both
roles' pods: every request the router places passes a pod of each, and one held at the activator
is waiting, not answered, until the pair is woken), one merge patch takes both roles to zero. The
router follows (builders/router.py), the activator holds the requests at NAME-router, and its wake
sets both roles to one in one patch (scale_to_zero.py). status.autoscaler.reason says why the pair
is at zero.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kubernetes.client.exceptions import ApiException

from .. import metrics
from ..builders.activator import ready_on_path
from ..builders.common import Role
from ..builders.disaggregation import ROLES, pair_scale_to_zero, replicas_patch, role_part, role_replicas
from ..jsontypes import JsonObject
from ..models import AutoscalingMode, AutoscalingSpec, InferenceServiceSpec
from ..prometheus import promql
from ..reasons import Reason
from ..settings import SCALER_MANAGER
from ..status import now_iso, status_changes
from .loop import Autoscaler, IdleWatch
from .policy import Decision


def builtin_roles(spec: InferenceServiceSpec) -> dict[Role, AutoscalingSpec]:
    """The roles on the built-in loop, with their autoscaling."""
    found: dict[Role, AutoscalingSpec] = {}
    for role in ROLES:
        scaling = role_part(spec, role).autoscaling
        if scaling is not None and scaling.mode == AutoscalingMode.BUILTIN:
            found[role] = scaling
    return found


def pair_moving(loops: dict[Role, Autoscaler]) -> bool:
    """Whether a role's last decision changed its count: more is not idle, and after less the
    next body may predate that write (a role's loop reading its old count there could write it
    back over the pair's zero). The pair goes to zero from a tick where both roles hold."""
    return any(loop.last is not None and loop.last[1].replicas != loop.last[0] for loop in loops.values())


class PairAutoscaler:
    """One service's pair: a loop per role on the built-in loop, and the pair's idleness."""

    def __init__(self, loops: dict[Role, Autoscaler]):
        """`loops`: an `Autoscaler` for each role (`role=`), of one service."""
        first = loops[Role.PREFILL]
        self.api = first.api
        self.namespace = first.namespace
        self.name = first.name
        self.logger = first.logger
        self.post_event = first.post_event
        self.clock = first.clock
        self.loops = loops
        self.due: dict[Role, float] = {}
        self.idle = IdleWatch(first.idle.wall_clock, first.idle.activator)

    @classmethod
    def of(cls, **arguments: Any) -> PairAutoscaler:
        """The pair from `Autoscaler`'s arguments, a loop for each role."""
        return cls({role: Autoscaler(**arguments, role=role) for role in ROLES})

    async def aclose(self) -> None:
        for loop in self.loops.values():
            await loop.aclose()

    def forget(self) -> None:
        for loop in self.loops.values():
            metrics.forget_service(self.namespace, loop.target.label)

    async def tick(self, body: JsonObject, spec: InferenceServiceSpec) -> float:
        """Each role's loop that is due, then the pair's scale to zero; the seconds until the
        next role is due."""
        roles = builtin_roles(spec)
        for role in set(self.due) - set(roles):
            del self.due[role]
        for role in roles:
            if self.clock() >= self.due.get(role, 0.0):
                self.due[role] = self.clock() + await self.loops[role].tick(body, spec)
        zero = pair_scale_to_zero(spec)
        if zero is not None and set(roles) == set(ROLES):
            await self._zero(body, spec, roles[Role.PREFILL], zero.idle_seconds)
        return max(0.0, min(self.due.values(), default=self.clock() + 15.0) - self.clock())

    async def _zero(self, body: JsonObject, spec: InferenceServiceSpec, scaling: AutoscalingSpec, idle: int) -> None:
        """Both roles to zero, in one write, once the pair is idle (`IdleWatch`)."""
        counts = {role: self.loops[role].now(n, body) for role, n in role_replicas(spec).items()}
        current = min(counts.values())
        self.idle.seen(current == 0)
        if current > 0:
            await self._serving(body)
        if current == 0 or pair_moving(self.loops) or not self.idle.activator:
            return
        query = promql.recent_requests(spec.runtime.engine, self.namespace, spec.model.name or self.name, idle)
        requests = await self.loops[Role.PREFILL].requests(scaling, query)
        ready = ready_on_path(body.get("status") or {})
        decision = self.idle.decide(body, idle, ready, requests, current)
        if decision is None:
            return
        await self._write_zero(body, counts, decision)

    async def _serving(self, body: JsonObject) -> None:
        """The pair serves: the reason it was at zero goes (each role's own reason stays)."""
        if "reason" not in ((body.get("status") or {}).get("autoscaler") or {}):
            return

        def changes(fresh: JsonObject) -> JsonObject:
            written = (fresh.get("status") or {}).get("autoscaler") or {}
            return {"autoscaler": {"reason": None}} if "reason" in written else {}

        try:
            await asyncio.to_thread(self.api.update_status, self.loops[Role.PREFILL].ref, changes)
        except ApiException as exc:
            self.logger.warning("pair's status not written: API error %s", exc.status)

    async def _write_zero(self, body: JsonObject, counts: dict[Role, int], decision: Decision) -> None:
        patch = replicas_patch(dict.fromkeys(ROLES, 0))
        try:
            await asyncio.to_thread(self.api.patch, self.loops[Role.PREFILL].ref, patch, None, SCALER_MANAGER)
        except ApiException as exc:
            self.logger.warning("pair to zero not written: API error %s %s", exc.status, exc.reason)
            return
        generation = (body.get("metadata") or {}).get("generation") or 0
        for loop in self.loops.values():
            loop.pending(generation, 0)
        before = ", ".join(f"{role} {n}" for role, n in counts.items())
        reason = f"prefill and decode at zero: {decision.reason}"
        self.post_event(Reason.SCALED_DOWN, f"replicas {before} -> 0: {decision.reason}")
        self.logger.info("autoscaler decision (pair): %s -> 0 | %s", before, decision.reason)
        wanted: JsonObject = {"reason": reason, "lastScaleTime": now_iso()}

        def changes(fresh: JsonObject) -> JsonObject:
            written = (fresh.get("status") or {}).get("autoscaler") or {}
            found = status_changes({k: written.get(k) for k in wanted}, wanted)
            return {"autoscaler": found} if found else {}

        try:
            await asyncio.to_thread(self.api.update_status, self.loops[Role.PREFILL].ref, changes)
        except ApiException as exc:
            self.logger.warning("pair's status not written: API error %s", exc.status)
