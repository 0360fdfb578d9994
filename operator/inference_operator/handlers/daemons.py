"""What every InferenceService daemon does around its own work, written once.

A daemon (the autoscaler, the canary analysis, the adapters' status) is registered with the same
kopf settings, holds its clients for its whole life, reads the spec afresh before each tick (an
invalid one is the reconcile handler's to report: the daemon waits and reads it again), and ends
when kopf stops it or its object is deleted (lifetimes.py: no finalizer holds the object for it).
A feature gives only what it holds and its tick; `service_daemon` does the rest.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import kopf

from ..k8s import Ref
from ..kinds import INFERENCE_SERVICE
from ..lifetimes import Lifetime
from ..models import InferenceServiceSpec, SpecError, parse_spec

# An invalid spec is read again after this long; also kopf's backoff before it restarts a
# daemon whose loop failed (its in-memory state, such as the autoscaler's history, is then empty).
SPEC_RETRY_SECONDS = 15.0

# One tick of a daemon's work, on the spec as it is now; returns the seconds until the next.
Tick = Callable[[InferenceServiceSpec], Awaitable[float]]


@dataclass(frozen=True)
class Daemon:
    """One daemon of one InferenceService: what kopf gave it and how long it lives."""

    body: kopf.Body
    meta: kopf.Meta
    memo: kopf.Memo
    logger: kopf.Logger
    life: Lifetime

    @property
    def ref(self) -> Ref:
        return Ref.to(INFERENCE_SERVICE, self.meta["namespace"], self.meta["name"])


# What a feature gives: given its daemon, hold what it needs (clients) for the daemon's life and
# yield its tick; what it releases after the yield runs however the daemon ends.
Work = Callable[[Daemon], AbstractAsyncContextManager[Tick]]


def service_daemon(
    daemon_id: str, when: Callable[..., bool], registry: kopf.OperatorRegistry | None = None
) -> Callable[[Work], Callable[..., Awaitable[None]]]:
    """Register `work` as a kopf daemon of every InferenceService that `when` selects (in kopf's
    default registry unless `registry` is given).

    kopf stops the daemon when its object stops matching `when`, and starts it again when it
    matches. A stop that arrives mid-tick is honoured when the tick ends (`cancellation_backoff`);
    only a tick stuck past that is cancelled.
    """

    def register(work: Work) -> Callable[..., Awaitable[None]]:
        async def run(
            stopped: kopf.DaemonStopped,
            body: kopf.Body,
            meta: kopf.Meta,
            memo: kopf.Memo,
            logger: kopf.Logger,
            **_: Any,
        ) -> None:
            daemon = Daemon(body, meta, memo, logger, Lifetime(memo, meta["uid"]))
            async with work(daemon) as tick:
                while daemon.life.alive(stopped):
                    try:
                        spec = parse_spec(dict(body.get("spec") or {}))
                    except SpecError as exc:
                        logger.info("%s idle: %s", daemon_id, exc)
                        delay = SPEC_RETRY_SECONDS
                    else:
                        delay = await tick(spec)
                    await daemon.life.sleep(stopped, delay)

        run.__name__, run.__qualname__, run.__doc__ = work.__name__, work.__qualname__, work.__doc__
        run.__module__ = work.__module__
        kopf.daemon(
            INFERENCE_SERVICE.group,
            INFERENCE_SERVICE.version,
            INFERENCE_SERVICE.plural,
            id=daemon_id,
            when=when,
            cancellation_backoff=5,
            cancellation_timeout=10,
            backoff=SPEC_RETRY_SECONDS,
            registry=registry,
        )(run)
        return run

    return register
