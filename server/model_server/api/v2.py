"""Open Inference Protocol (KServe v2) REST endpoints for server and model metadata and
readiness, so KServe and Triton clients work unchanged; its inference routes are in routes.py
and its bodies in protocol_v2.py."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from starlette.responses import Response

from .. import __version__
from ..discovery import version_key
from ..errors import ModelNotFound, ServerError
from ..protocol_v2 import EXTENSIONS
from ..repository import ServedVersion
from .common import State, error_responses, json_response

router = APIRouter(prefix="/v2", tags=["v2"])


# --------------------------------------------------------------------------- server


@router.get("")
async def server_metadata() -> Response:
    return json_response({"name": "model-server", "version": __version__, "extensions": EXTENSIONS})


@router.get("/health/live")
async def server_live() -> Response:
    return json_response({"live": True})


@router.get("/health/ready", responses=error_responses(400))
async def server_ready(state: State) -> Response:
    """Per the protocol, a 4xx status means "not ready"."""
    ok, reason = state.readiness()
    body: dict[str, Any] = {"ready": ok}
    if reason:
        body["reason"] = reason
    return json_response(body, status=200 if ok else 400)


# --------------------------------------------------------------------------- model


def _metadata(state: State, served: ServedVersion) -> dict[str, Any]:
    return {
        "name": state.settings.name,
        "versions": sorted(state.repository.served, key=version_key),
        "platform": served.backend.platform,
        "inputs": [s.metadata() for s in served.inputs],
        "outputs": [s.metadata() for s in served.outputs],
    }


@router.get("/models/{name}", responses=error_responses(404, 503))
async def model_metadata(name: str, state: State) -> Response:
    state.dataplane.check_model(name)
    return json_response(_metadata(state, state.repository.resolve(None)))


@router.get("/models/{name}/versions/{version}", responses=error_responses(404, 503))
async def version_metadata(name: str, version: str, state: State) -> Response:
    state.dataplane.check_model(name)
    return json_response(_metadata(state, state.repository.resolve(version)))


def _model_ready(state: State, name: str, version: str | None) -> Response:
    state.dataplane.check_model(name)
    try:
        state.repository.resolve(version)
    except ModelNotFound:
        raise
    except ServerError as exc:
        return json_response({"name": name, "ready": False, "reason": str(exc)}, status=400)
    if state.draining:
        return json_response({"name": name, "ready": False, "reason": "shutting down"}, status=400)
    return json_response({"name": name, "ready": True})


@router.get("/models/{name}/ready", responses=error_responses(400, 404))
async def model_ready(name: str, state: State) -> Response:
    return _model_ready(state, name, None)


@router.get("/models/{name}/versions/{version}/ready", responses=error_responses(400, 404))
async def version_ready(name: str, version: str, state: State) -> Response:
    return _model_ready(state, name, version)
