"""Request body limit and error containment as plain ASGI middleware (no
per-request task overhead)."""

from __future__ import annotations

from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .api.errors import error_response, internal_error_response
from .errors import PayloadTooLarge


class ContainErrors:
    """Turn an unexpected exception into that 500 here, so it is not re-raised to
    the server, which would log it again and drop the keep-alive connection."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except ClientDisconnect:
            return  # nobody to answer (a slow body cut off by the server, or a client gone)
        except Exception as exc:
            if started:  # too late for a status: let the server close the connection
                raise
            await internal_error_response(scope, exc)(scope, receive, send)


def oversized_response(scope: Scope, limit: int) -> Response | None:
    """The 413 for a request whose Content-Length exceeds `limit`, else None."""
    for key, value in scope["headers"]:
        if key == b"content-length":
            try:
                length = int(value)
            except ValueError:
                length = -1
            if length > limit:
                message = f"request body of {length} bytes exceeds the limit of {limit} bytes (max-body-bytes)"
                return error_response(PayloadTooLarge(message), close=True)
            return None
    return None


def limit_receive(receive: Receive, limit: int) -> Receive:
    """`receive` that raises `PayloadTooLarge` once the body read so far exceeds `limit`
    (a chunked body has no Content-Length to check first)."""
    seen = 0

    async def limited_receive() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes (max-body-bytes)")
        return message

    return limited_receive


class BodySizeLimit:
    """413 before reading a body whose Content-Length is too large; for chunked
    bodies, `PayloadTooLarge` is raised from `receive` once the limit is crossed."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        response = oversized_response(scope, self.max_bytes)
        if response is not None:
            await response(scope, receive, send)
            return
        await self.app(scope, limit_receive(receive, self.max_bytes), send)
