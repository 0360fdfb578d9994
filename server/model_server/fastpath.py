"""The inference routes without the framework's per-request machinery.

FastAPI routes a request through its middleware stack, the router's list of routes,
dependency solving and an exception-handling wrapper; for a small model that is most
of the time a request takes on the event loop. The inference POSTs do not need any
of it: their handlers take the app state and the raw request, and parse the body
themselves. So the app answers them here, in front of the framework, from the same route
table (api/routes.py), with the same body limit and the same error answers (api/errors.py);
every other request (docs, metadata, health, other methods on these paths) goes through
FastAPI unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from .api.errors import internal_error_response
from .middleware import limit_receive, oversized_response

_PARAM = re.compile(r"\{(\w+)\}")

#: What the fast path runs for a matching request: the request and its path parameters.
Endpoint = Callable[[Request, dict[str, str]], Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class FastRoute:
    """A POST route answered in front of the framework; `path` uses `{param}` segments as
    Starlette does (one segment, no slash). app.py makes one per route of api/routes.py."""

    path: str
    endpoint: Endpoint

    def regex(self) -> re.Pattern[str]:
        parts = _PARAM.split(self.path)  # literal, name, literal, name, ..., literal
        return re.compile(
            "".join(re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/]+)" for i, part in enumerate(parts))
        )


class InferenceFastPath:
    """Serves a POST matching one of `routes` in front of the framework, with the body limit
    and error answers of the full stack; anything else goes to `app`."""

    def __init__(self, app: ASGIApp, routes: Sequence[FastRoute], max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.routes = tuple(routes)
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
                response = await endpoint(request, params)
            except Exception as exc:
                response = internal_error_response(scope, exc)
        await response(scope, receive, send)
