"""The inference routes without the framework's per-request machinery.

FastAPI routes a request through its middleware stack, the router's list of routes,
dependency solving and an exception-handling wrapper; for a small model that is most
of the time a request takes on the event loop. The inference POSTs do not need any
of it: their handlers take the app state and the raw request, and parse the body
themselves. So the app answers them here, in front of the framework, with the same
handlers, the same body limit and the same error bodies; every other request (docs,
metadata, health, other methods on these paths) goes through FastAPI unchanged, and
the routes stay registered there, so the OpenAPI document does not change.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from .api.common import AppState, json_response
from .errors import ServerError
from .middleware import internal_error_response, limit_receive, oversized_response

#: A handler: the state, the request and its path parameters -> the response.
Endpoint = Callable[..., Awaitable[Response]]

_PARAM = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True, slots=True)
class FastRoute:
    """A POST route answered in front of the framework; `path` uses `{param}`
    segments as Starlette does (one segment, no slash)."""

    path: str
    endpoint: Endpoint

    def regex(self) -> re.Pattern[str]:
        parts = _PARAM.split(self.path)  # literal, name, literal, name, ..., literal
        return re.compile(
            "".join(re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/]+)" for i, part in enumerate(parts))
        )


class InferenceFastPath:
    """Runs the endpoint of the first of `routes` whose path matches a POST, with the
    body limit and error answers of the full stack; anything else goes to `app`."""

    def __init__(self, app: ASGIApp, state: AppState, routes: list[FastRoute], max_body_bytes: int) -> None:
        self.app = app
        self.state = state
        self.max_body_bytes = max_body_bytes
        self._routes = [(route.regex(), route.endpoint) for route in routes]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            path = scope["path"]
            for regex, endpoint in self._routes:
                match = regex.fullmatch(path)
                if match is not None:
                    await self._serve(endpoint, match.groupdict(), scope, receive, send)
                    return
        await self.app(scope, receive, send)

    async def _serve(
        self, endpoint: Endpoint, params: dict[str, str], scope: Scope, receive: Receive, send: Send
    ) -> None:
        response = oversized_response(scope, self.max_body_bytes)
        if response is None:
            request = Request(scope, limit_receive(receive, self.max_body_bytes))
            try:
                response = await endpoint(self.state, request, **params)
            except ServerError as exc:
                response = json_response({"error": str(exc)}, status=exc.status, headers=exc.headers)
            except Exception as exc:
                response = internal_error_response(scope, exc)
        await response(scope, receive, send)
