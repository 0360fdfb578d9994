"""Kubernetes probes and the Prometheus scrape endpoint on the main port."""

from __future__ import annotations

from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from ..discovery import version_key
from .common import State, error_responses, json_response

router = APIRouter(tags=["health"])


@router.get("/health/live")
async def live() -> Response:
    """The event loop answers; model state does not matter here."""
    return json_response({"live": True})


@router.get("/health/ready", responses=error_responses(503))
async def ready(state: State) -> Response:
    """Ready only once a version is loaded and warmed up; the reason otherwise."""
    ok, reason = state.readiness()
    repository = state.repository
    served = sorted(repository.served, key=version_key)
    body = {
        "ready": ok,
        "model": state.settings.name,
        "versions": served,
        "latest": served[-1] if served else None,
        # The versions only: the runtime's error text names paths (it is in the log).
        "failed": sorted(repository.failures, key=version_key),
    }
    if reason:
        body["reason"] = reason
    return json_response(body, status=200 if ok else 503)


@router.get("/metrics", include_in_schema=False)
async def metrics(state: State) -> Response:
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
