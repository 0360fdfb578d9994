"""The one place where what went wrong becomes an HTTP answer: each `errors.ServerError`'s status
code (errors.status_of), its headers (Retry-After, Connection: close) and the JSON body every
error has, for the inference fast path, the FastAPI routes and the middleware alike."""

from __future__ import annotations

import logging
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import Scope

from ..errors import INTERNAL_ERROR, Overloaded, ServerError, ShuttingDown, status_of
from .common import json_response

log = logging.getLogger(__name__)


def headers_of(exc: ServerError) -> dict[str, str] | None:
    """Retry-After for errors that say when to retry; a draining server also closes the
    connection, so the retry reaches another replica."""
    if isinstance(exc, ShuttingDown):
        return {"Retry-After": str(exc.retry_after_s), "Connection": "close"}
    if isinstance(exc, Overloaded):
        return {"Retry-After": str(exc.retry_after_s)}
    return None


def error_response(exc: ServerError, *, close: bool = False) -> Response:
    """The answer to `exc`; `close` when the connection must not be reused (a body left unread)."""
    headers = headers_of(exc) or {}
    if close:
        headers = {**headers, "Connection": "close"}
    return json_response({"error": str(exc)}, status=status_of(exc), headers=headers or None)


def internal_error_response(scope: Scope, exc: BaseException) -> Response:
    """A 500 that names nothing internal: the detail goes to the log under an id
    the client can quote."""
    request_id = uuid.uuid4().hex[:16]
    log.error(
        "unhandled error in %s %s (request id %s)", scope.get("method"), scope.get("path"), request_id, exc_info=exc
    )
    return json_response(
        {"error": f"internal error (request id {request_id}); the server log has the details"},
        status=INTERNAL_ERROR,
        headers={"X-Request-Id": request_id},
    )


def install_error_handlers(app: FastAPI) -> None:
    """The same answers for errors raised under FastAPI's routes, its own among them (a 405,
    a 422 of its parameter validation), as `{"error": ...}` bodies."""

    @app.exception_handler(ServerError)
    async def server_error(_: Request, exc: ServerError) -> Response:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> Response:
        parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()[:3]]
        return json_response({"error": "invalid request: " + "; ".join(parts)}, status=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> Response:
        return json_response({"error": str(exc.detail)}, status=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> Response:
        return internal_error_response(request.scope, exc)
