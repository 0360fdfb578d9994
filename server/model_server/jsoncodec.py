"""JSON in and out, as both inference protocols need it: the media types a body may be sent
as, strict parsing into a request model with messages that name the problem, fast encoding."""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np
import orjson
from pydantic import BaseModel, ValidationError

from .errors import InvalidInput, ServerError, UnprocessableInput, UnsupportedMediaType

ModelT = TypeVar("ModelT", bound=BaseModel)
_MAX_ERRORS = 3

#: Media types the JSON bodies may be sent as; a missing Content-Type counts as JSON.
JSON_MEDIA_TYPE = "application/json"
BINARY_MEDIA_TYPE = "application/octet-stream"


def check_content_type(content_type: str | None, *, binary: bool = False) -> None:
    """Refuse a body unless declared JSON (`application/json`, `application/*+json`) or not
    declared at all; `binary` also admits the binary tensor extension's type."""
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
    """JSON -> request model. Strict JSON (orjson): NaN and Infinity literals, and numbers
    that overflow a double, are refused."""
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


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot serialize {type(obj).__name__}")


def dumps(payload: Any) -> bytes:
    """orjson writes numpy arrays natively, far faster than `tolist()` + json."""
    return orjson.dumps(payload, default=_json_default, option=orjson.OPT_SERIALIZE_NUMPY)
