"""LoRA adapters: status.adapters and AdaptersReady kept from what each replica's adapters
sidecar reports (adapter_watch.py asks, adapter_status.py sums up)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import kopf

from .. import adapter_status, adapter_watch
from ..jsontypes import JsonObject
from ..models import InferenceServiceSpec
from ..status import now_iso, set_condition
from .daemons import Daemon, Tick, service_daemon
from .shared import publish

ADAPTER_STATUS_SECONDS = 5.0


def has_adapters(spec: kopf.Spec, **_: Any) -> bool:
    return bool(spec.get("adapters"))


@service_daemon("adapters", when=has_adapters)
@contextlib.asynccontextmanager
async def adapters_status(daemon: Daemon) -> AsyncIterator[Tick]:
    """Keep status.adapters and AdaptersReady up to date from the replicas' sidecars; clear
    both when the spec no longer has adapters (kopf then stops this daemon)."""
    async with adapter_watch.client() as http:
        try:
            yield lambda spec: _report_adapters(daemon, spec, http)
        finally:
            if not daemon.life.gone and not (daemon.body.get("spec") or {}).get("adapters"):
                await asyncio.to_thread(publish, daemon.memo, daemon.ref, _without_adapter_status)


async def _report_adapters(daemon: Daemon, spec: InferenceServiceSpec, http: httpx.AsyncClient) -> float:
    """One look at the replicas' adapters; returns the seconds until the next."""
    if spec.adapters:
        ref = daemon.ref
        owner = daemon.memo.config.owner(ref.name, ref.namespace, daemon.meta["uid"], spec)
        found = await adapter_watch.answers(daemon.memo.api, http, owner)
        entries, ready, reason, message = adapter_status.summarize(spec, found)

        def compute(fresh: JsonObject) -> JsonObject:
            status = fresh.get("status") or {}
            generation = fresh["metadata"].get("generation")
            conditions = set_condition(
                status.get("conditions") or [],
                adapter_status.CONDITION,
                ready,
                reason,
                message,
                now_iso(),
                generation,
            )
            return {"adapters": entries, "conditions": conditions}

        await asyncio.to_thread(publish, daemon.memo, ref, compute)
    return ADAPTER_STATUS_SECONDS


def _without_adapter_status(fresh: JsonObject) -> JsonObject | None:
    status = fresh.get("status") or {}
    conditions = status.get("conditions") or []
    kept = [c for c in conditions if c.get("type") != adapter_status.CONDITION]
    if "adapters" not in status and len(kept) == len(conditions):
        return None
    return {"adapters": None, "conditions": kept}
