"""The built-in autoscaler as a kopf daemon: one per InferenceService in `builtin` mode (its
spec.autoscaling's, or a role's of its prefill/decode pair: then one loop per role, autoscaler/pair.py).

A daemon rather than a timer because the interval is per object (`intervalSeconds`). kopf
stops it when the object stops matching `when` (mode switched to hpa/keda, autoscaling
removed), and starts it again when it matches; its in-memory history is then empty and the
policy holds rather than scaling down until it has seen a full window. It ends by itself when
the object is deleted (lifetimes.py: no finalizer holds the object for it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import kopf

from .. import metrics
from ..autoscaler.loop import Autoscaler
from ..autoscaler.pair import PairAutoscaler, builtin_roles
from ..builders.disaggregation import ROLES
from ..models import AutoscalingMode, InferenceServiceSpec
from .daemons import SPEC_RETRY_SECONDS, Daemon, Tick, service_daemon


def builtin_mode(spec: kopf.Spec, **_: Any) -> bool:
    builtin = AutoscalingMode.BUILTIN.value
    pd = spec.get("disaggregation")
    if pd is not None:  # a role's mode defaults to hpa
        return any(((pd.get(role) or {}).get("autoscaling") or {}).get("mode") == builtin for role in ROLES)
    scaling = spec.get("autoscaling") or {}
    return bool(scaling) and scaling.get("mode", builtin) == builtin


def interval_of(spec: InferenceServiceSpec) -> float | None:
    """The shortest interval of the spec's loops on the built-in mode; None: none is."""
    if spec.disaggregation is not None:
        return min((s.interval_seconds for s in builtin_roles(spec).values()), default=None)
    if spec.autoscaling is None or spec.autoscaling.mode != AutoscalingMode.BUILTIN:
        return None
    return spec.autoscaling.interval_seconds


# A failure that escapes a tick restarts the daemon after its backoff (its history is then
# empty, so it holds before it scales down again).
@service_daemon("autoscaler", when=builtin_mode)
@contextlib.asynccontextmanager
async def autoscaler(daemon: Daemon) -> AsyncIterator[Tick]:
    """Run the loop until kopf stops the daemon; an error in one tick never ends it."""
    body, meta = daemon.body, daemon.meta
    arguments = dict(
        api=daemon.memo.api,
        namespace=meta["namespace"],
        name=meta["name"],
        logger=daemon.logger,
        # kopf.event, not kopf.info: the operator posts only warnings from log lines
        # (settings.posting.level), and kopf.info obeys that level too.
        post_event=lambda reason, message: kopf.event(body, type="Normal", reason=reason, message=message),
        policy=daemon.memo.config.credentials,
        activator=daemon.memo.config.activator.enabled,
    )
    # The service's loop, or its pair's: made when the spec first asks for it.
    single: Autoscaler | None = None
    pair: PairAutoscaler | None = None

    async def tick(spec: InferenceServiceSpec) -> float:
        nonlocal single, pair
        interval = interval_of(spec)
        if interval is None:
            return SPEC_RETRY_SECONDS  # kopf is about to stop this daemon
        try:
            if spec.disaggregation is not None:
                pair = pair or PairAutoscaler.of(**arguments)
                return await pair.tick(dict(body), spec)
            single = single or Autoscaler(**arguments)
            return await single.tick(dict(body), spec)
        except asyncio.CancelledError:
            raise
        except Exception:
            daemon.logger.exception("autoscaler tick failed; next attempt in one interval")
            return interval

    try:
        yield tick
    finally:
        if single is not None:
            await single.aclose()
        if pair is not None:
            await pair.aclose()
            pair.forget()
        metrics.forget_service(meta["namespace"], meta["name"])
