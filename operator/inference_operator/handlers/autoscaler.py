"""The built-in autoscaler as a kopf daemon: one per InferenceService in `builtin` mode.

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
from ..models import AutoscalingMode, InferenceServiceSpec
from .daemons import SPEC_RETRY_SECONDS, Daemon, Tick, service_daemon


def builtin_mode(spec: kopf.Spec, **_: Any) -> bool:
    scaling = spec.get("autoscaling") or {}
    builtin = AutoscalingMode.BUILTIN.value
    return bool(scaling) and scaling.get("mode", builtin) == builtin


# A failure that escapes a tick restarts the daemon after its backoff (its history is then
# empty, so it holds before it scales down again).
@service_daemon("autoscaler", when=builtin_mode)
@contextlib.asynccontextmanager
async def autoscaler(daemon: Daemon) -> AsyncIterator[Tick]:
    """Run the loop until kopf stops the daemon; an error in one tick never ends it."""
    body, meta = daemon.body, daemon.meta
    loop = Autoscaler(
        daemon.memo.api,
        meta["namespace"],
        meta["name"],
        daemon.logger,
        # kopf.event, not kopf.info: the operator posts only warnings from log lines
        # (settings.posting.level), and kopf.info obeys that level too.
        post_event=lambda reason, message: kopf.event(body, type="Normal", reason=reason, message=message),
        policy=daemon.memo.config.credentials,
        activator=daemon.memo.config.activator.enabled,
    )

    async def tick(spec: InferenceServiceSpec) -> float:
        if spec.autoscaling is None or spec.autoscaling.mode != AutoscalingMode.BUILTIN:
            return SPEC_RETRY_SECONDS  # kopf is about to stop this daemon
        try:
            return await loop.tick(dict(body), spec)
        except asyncio.CancelledError:
            raise
        except Exception:
            daemon.logger.exception("autoscaler tick failed; next attempt in one interval")
            return spec.autoscaling.interval_seconds

    try:
        yield tick
    finally:
        await loop.aclose()
        metrics.forget_service(meta["namespace"], meta["name"])
