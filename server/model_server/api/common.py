"""What the route modules share: app state (state.py) via dependency injection, the JSON response, and
the OpenAPI description of bodies and error answers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from pydantic import BaseModel
from starlette.responses import Response

from ..jsoncodec import dumps
from ..state import AppState

ModelT = TypeVar("ModelT", bound=BaseModel)


async def get_state(request: Request) -> AppState:
    """Async on purpose: FastAPI runs sync dependencies in a thread pool."""
    state: AppState = request.app.state.server
    return state


State = Annotated[AppState, Depends(get_state)]


#: Request bodies parsed by hand (for speed and 4xx control) but documented in OpenAPI.
BODY_MODELS: list[type[BaseModel]] = []


class ErrorBody(BaseModel):
    """Every error answer: what went wrong, in words that name the problem."""

    error: str


_ERROR_MEANING = {
    400: "Bad input: wrong shape, datatype or value; the message names it.",
    404: "No such model or version.",
    413: "The body is larger than --max-body-bytes, or would need more memory to parse than the parse budget.",
    415: "The Content-Type is not JSON (nor, for v2, application/octet-stream).",
    422: "The body is not a request of this endpoint's schema.",
    429: "The queue is full; retry after Retry-After seconds.",
    503: "Not ready (loading, or shutting down).",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for the error codes a route can answer, all as ErrorBody."""
    return {code: {"model": ErrorBody, "description": _ERROR_MEANING[code]} for code in codes}


INFER_ERRORS = error_responses(400, 404, 413, 415, 422, 429, 503)


def documented_body(model: type[ModelT]) -> dict[str, Any]:
    """`openapi_extra` for a route that reads `model` from the raw body."""
    BODY_MODELS.append(model)
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def json_response(payload: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(dumps(payload), status_code=status, headers=headers, media_type="application/json")
