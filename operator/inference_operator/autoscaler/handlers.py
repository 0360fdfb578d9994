"""The built-in autoscaler as a kopf daemon: one per InferenceService in `builtin` mode.

A daemon rather than a timer because the interval is per object (`intervalSeconds`). kopf
stops it when the object stops matching `when` (mode switched to hpa/keda, autoscaling
removed), and starts it again when it matches; its in-memory history is then empty and the
policy holds rather than scaling down until it has seen a full window. It ends by itself when
the object is deleted (lifetimes.py: no finalizer holds the object for it).
"""

from __future__ import annotations

import asyncio
from typing import Any

import kopf

from .. import metrics
from ..lifetimes import Lifetime
from ..models import GROUP, PLURAL, VERSION, AutoscalingMode, SpecError, parse_spec
from .loop import Autoscaler

# When the spec cannot be parsed, look again after this long (the reconciler reports why).
RETRY_SECONDS = 15


def builtin_mode(spec: kopf.Spec, **_: Any) -> bool:
    scaling = spec.get("autoscaling") or {}
    builtin = AutoscalingMode.BUILTIN.value
    return bool(scaling) and scaling.get("mode", builtin) == builtin


# A failure that escapes the loop restarts the daemon after `backoff` (its history is then
# empty, so it holds before it scales down again). A stop that arrives mid-tick is honoured
# when the tick ends (`cancellation_backoff`); only a tick stuck past that is cancelled.
@kopf.daemon(
    GROUP,
    VERSION,
    PLURAL,
    id="autoscaler",
    when=builtin_mode,
    cancellation_backoff=5,
    cancellation_timeout=10,
    backoff=RETRY_SECONDS,
)
async def autoscaler(
    stopped: kopf.DaemonStopped, body: kopf.Body, meta: kopf.Meta, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """Run the loop until kopf stops the daemon; an error in one tick never ends it."""
    loop = Autoscaler(
        memo.api,
        meta["namespace"],
        meta["name"],
        logger,
        # kopf.event, not kopf.info: the operator posts only warnings from log lines
        # (settings.posting.level), and kopf.info obeys that level too.
        post_event=lambda reason, message: kopf.event(body, type="Normal", reason=reason, message=message),
        policy=memo.config.credentials,
        activator=memo.config.activator.enabled,
    )
    life = Lifetime(memo, meta["uid"])
    try:
        while life.alive(stopped):
            try:
                spec = parse_spec(dict(body.get("spec") or {}))
            except SpecError as exc:
                logger.info("autoscaler idle: %s", exc)
                delay: float = RETRY_SECONDS
            else:
                if spec.autoscaling is None or spec.autoscaling.mode != AutoscalingMode.BUILTIN:
                    delay = RETRY_SECONDS  # kopf is about to stop this daemon
                else:
                    try:
                        delay = await loop.tick(dict(body), spec)
                    except asyncio.CancelledError:
                        raise
                    except Exception:
                        logger.exception("autoscaler tick failed; next attempt in one interval")
                        delay = spec.autoscaling.interval_seconds
            await life.sleep(stopped, delay)
    finally:
        await loop.aclose()
        metrics.forget_service(meta["namespace"], meta["name"])
