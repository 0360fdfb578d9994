"""Request body limit as plain ASGI middleware (no per-request task overhead)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .api.common import json_response
from .errors import PayloadTooLarge


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
        limit = self.max_bytes
        for key, value in scope["headers"]:
            if key == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    length = -1
                if length > limit:
                    response = json_response(
                        {
                            "error": f"request body of {length} bytes exceeds the limit of {limit} "
                            "bytes (max-body-bytes)"
                        },
                        status=413,
                        headers={"Connection": "close"},
                    )
                    await response(scope, receive, send)
                    return
                break
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes (max-body-bytes)")
            return message

        await self.app(scope, limited_receive, send)
