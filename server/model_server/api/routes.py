"""The inference routes, in one table: each is registered once, here, and served by both front
ends, the fast path in front of FastAPI (fastpath.py) and FastAPI itself (for requests the fast
path passes on, and for the OpenAPI document).

A route turns the HTTP request into the data plane's arguments (body, media type, the binary
extension's header length, path parameters) and the data plane's answer or error back into an
HTTP response; the request metrics count it under the status it was answered with.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from bounded_http.budgets import CLIENT_GONE

from ..bodies import RequestBody
from ..errors import CLIENT_CLOSED, INTERNAL_ERROR, ClientClosed, ServerError, status_of
from ..metrics import RequestTracker
from ..protocol_simple import SimpleRequest, SimpleResponse
from ..protocol_v2 import Answer, InferenceRequest
from ..state import AppState
from .common import INFER_ERRORS, documented_body
from .errors import error_response

#: The binary tensor extension's header: how many bytes of the body are its JSON header.
HEADER_LENGTH = "inference-header-content-length"

#: A route's call into the data plane: the state, the request, its path parameters, the tracker.
Call = Callable[[AppState, Request, dict[str, str], RequestTracker], Awaitable[Answer]]


@dataclass(frozen=True)
class InferenceRoute:
    path: str
    call: Call
    name: str  # FastAPI's route name: the OpenAPI operationId derives from it
    params: tuple[str, ...] = ()
    openapi: dict[str, Any] = field(default_factory=dict)


def request_body(request: Request) -> RequestBody:
    """The body as the data plane reads it (a client gone mid-body raises ClientDisconnect,
    which `serve` answers as `ClientClosed`), and whether its client has gone, where the
    transport says (bounded_http/http_protocol.py)."""
    length = request.headers.get("content-length")
    size = int(length) if length is not None and length.isdigit() else None
    gone = request.scope.get("extensions", {}).get(CLIENT_GONE)
    if gone is None:
        return RequestBody(size, request.body, request.stream)
    return RequestBody(size, request.body, request.stream, gone)


async def _v2(state: AppState, request: Request, params: dict[str, str], tracker: RequestTracker) -> Answer:
    headers = request.headers
    return await state.dataplane.infer(
        params["name"],
        params.get("version"),
        request_body(request),
        headers.get("content-type"),
        headers.get(HEADER_LENGTH),
        tracker,
    )


async def _simple(state: AppState, request: Request, params: dict[str, str], tracker: RequestTracker) -> Answer:
    return await state.dataplane.infer_simple(request_body(request), request.headers.get("content-type"), tracker)


_V2_DOC = {"responses": INFER_ERRORS, "openapi_extra": documented_body(InferenceRequest), "tags": ["v2"]}

INFERENCE_ROUTES = (
    InferenceRoute(
        "/infer",
        _simple,
        "infer",
        openapi={
            "response_model": SimpleResponse,
            "responses": INFER_ERRORS,
            "openapi_extra": documented_body(SimpleRequest),
            "tags": ["simple"],
            "description": "Rows in, first output's rows out (a flat row in gives one row out).",
        },
    ),
    InferenceRoute("/v2/models/{name}/infer", _v2, "model_infer", ("name",), _V2_DOC),
    InferenceRoute("/v2/models/{name}/versions/{version}/infer", _v2, "version_infer", ("name", "version"), _V2_DOC),
)


async def serve(route: InferenceRoute, state: AppState, request: Request, params: dict[str, str]) -> Response:
    """Answer one inference request: the data plane's answer, or its error's answer."""
    with state.metrics.track(state.settings.name) as tracker:
        try:
            answer = await route.call(state, request, params, tracker)
        except ClientDisconnect:
            return _error(tracker, ClientClosed("the client closed the connection before its body arrived"))
        except ServerError as exc:
            return _error(tracker, exc)
        except asyncio.CancelledError:
            tracker.code = CLIENT_CLOSED
            raise
        except Exception:
            tracker.code = INTERNAL_ERROR
            raise
    if answer.header_length is None:
        return Response(answer.body, media_type=answer.media_type)
    return Response(
        answer.body,
        media_type=answer.media_type,
        headers={"Inference-Header-Content-Length": str(answer.header_length)},
    )


async def serve_traced(route: InferenceRoute, state: AppState, request: Request, params: dict[str, str]) -> Response:
    """`serve` in a span of its own, continuing the caller's traceparent (tracing on only)."""
    tracer = state.tracing
    assert tracer is not None
    with tracer.request(route.path, request.headers, state.settings.name) as trace:
        response = await serve(route, state, request, params)
        tracer.answered(trace, response.status_code)
    return response


def _error(tracker: RequestTracker, exc: ServerError) -> Response:
    tracker.code = status_of(exc)
    return error_response(exc)


def bound(route: InferenceRoute, state: AppState) -> Callable[[Request, dict[str, str]], Awaitable[Response]]:
    """`route` served with `state`: the fast path's endpoint (a partial: no frame of its own)."""
    return functools.partial(serve if state.tracing is None else serve_traced, route, state)


def register(app: FastAPI) -> None:
    """Add every inference route to FastAPI, its path parameters declared for the document."""
    for route in INFERENCE_ROUTES:
        app.add_api_route(route.path, _framework_endpoint(route), methods=["POST"], name=route.name, **route.openapi)


def _framework_endpoint(route: InferenceRoute) -> Callable[..., Awaitable[Response]]:
    async def endpoint(request: Request, **params: str) -> Response:
        state: AppState = request.app.state.server
        return await (serve if state.tracing is None else serve_traced)(route, state, request, params)

    declared = [inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY, annotation=str) for p in route.params]
    request = inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request)
    endpoint.__signature__ = inspect.Signature([request, *declared])  # type: ignore[attr-defined]
    endpoint.__name__ = route.name
    return endpoint
