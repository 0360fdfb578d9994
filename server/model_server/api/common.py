"""What the route modules share: app state via dependency injection, body
parsing that turns schema errors into 4xx messages, and the inference call."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import numpy as np
import orjson
from fastapi import Depends, Request
from pydantic import BaseModel, ValidationError
from starlette.responses import Response

from ..bodies import BodyDecoder
from ..errors import InvalidInput, ServerError, UnprocessableInput, UnsupportedMediaType
from ..lifecycle import Shutdown
from ..metrics import ServerMetrics
from ..repository import ModelRepository, ServedVersion
from ..settings import ServerSettings
from ..tensors import validate_inputs

ModelT = TypeVar("ModelT", bound=BaseModel)
_MAX_ERRORS = 3


@dataclass
class AppState:
    """Everything a request handler needs, created once per app."""

    settings: ServerSettings
    metrics: ServerMetrics
    repository: ModelRepository
    shutdown: Shutdown
    bodies: BodyDecoder

    @property
    def draining(self) -> bool:
        """Readiness is false (SIGTERM received)."""
        return self.shutdown.draining

    def readiness(self) -> tuple[bool, str | None]:
        if self.draining:
            return False, "shutting down"
        reason = self.repository.not_ready_reason()
        return reason is None, reason


async def get_state(request: Request) -> AppState:
    """Async on purpose: FastAPI runs sync dependencies in a thread pool."""
    return request.app.state.server


State = Annotated[AppState, Depends(get_state)]


#: Media types the JSON bodies may be sent as; a missing Content-Type counts as JSON.
JSON_MEDIA_TYPE = "application/json"
BINARY_MEDIA_TYPE = "application/octet-stream"


def check_content_type(content_type: str | None, *, binary: bool = False) -> None:
    """415 unless the body is declared JSON (`application/json`, `application/*+json`)
    or not declared at all; `binary` also admits the binary tensor extension's type."""
    if not content_type:
        return
    media = content_type.split(";", 1)[0].strip().lower()
    if media == JSON_MEDIA_TYPE or (media.startswith("application/") and media.endswith("+json")):
        return
    if binary and media == BINARY_MEDIA_TYPE:
        return
    allowed = f"{JSON_MEDIA_TYPE} or {BINARY_MEDIA_TYPE}" if binary else JSON_MEDIA_TYPE
    raise UnsupportedMediaType(f"Content-Type '{media}' is not supported here: send {allowed}")


def parse_body(model: type[ModelT], body: bytes | bytearray | memoryview | str) -> ModelT:
    """JSON -> request model, 400/422 on failure. Strict JSON (orjson): NaN and
    Infinity literals, and numbers that overflow a double, are refused."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"request body is not valid JSON{_nan_hint(body)}: {exc}") from None
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        raise describe_validation_error(exc) from None


def _nan_hint(body: bytes | bytearray | memoryview | str) -> str:
    raw = body.encode() if isinstance(body, str) else bytes(body[: 1 << 20])
    if any(word in raw for word in (b"NaN", b"Infinity", b"nan", b"inf")):
        return " (NaN and Infinity are not JSON numbers; send them with the binary tensor extension)"
    return ""


def describe_validation_error(exc: ValidationError) -> ServerError:
    errors = exc.errors(include_url=False)
    for error in errors:
        if error["type"] == "json_invalid":
            message = str(error["msg"]).removeprefix("Invalid JSON: ")
            return InvalidInput(f"request body is not valid JSON: {message}")
    parts = []
    for error in errors[:_MAX_ERRORS]:
        location = ".".join(str(p) for p in error["loc"]) or "body"
        parts.append(f"{location}: {error['msg']}")
    more = f" (and {len(errors) - _MAX_ERRORS} more)" if len(errors) > _MAX_ERRORS else ""
    return UnprocessableInput("invalid request: " + "; ".join(parts) + more)


async def submit(served: ServedVersion, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Validate against the version's signature, then queue for batching."""
    rows = validate_inputs(inputs, served.inputs, batchable=served.backend.batchable)
    return await served.batcher.submit(inputs, rows)


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


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot serialize {type(obj).__name__}")


def dumps(payload: Any) -> bytes:
    """orjson writes numpy arrays natively, far faster than `tolist()` + json."""
    return orjson.dumps(payload, default=_json_default, option=orjson.OPT_SERIALIZE_NUMPY)


def json_response(payload: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(dumps(payload), status_code=status, headers=headers, media_type="application/json")
