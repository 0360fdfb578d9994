"""FastAPI application factory. All state is created here and handed to routes
through `app.state` + dependencies, so tests build isolated apps side by side."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI
from prometheus_client import REGISTRY, CollectorRegistry
from starlette.types import Message, Receive, Scope, Send

from . import __version__
from .api import health, routes, v2
from .api.common import BODY_MODELS
from .api.errors import install_error_handlers
from .bodies import BodyDecoder
from .dataplane import DataPlane
from .fastpath import FastRoute, InferenceFastPath
from .gpu import GpuReader, detect_gpu_reader
from .lifecycle import Shutdown
from .loading import BackendFactory
from .metrics import ServerMetrics
from .middleware import BodySizeLimit, ContainErrors
from .repository import ModelRepository
from .settings import ServerSettings
from .state import AppState
from .tracing import from_settings as tracing_from_settings

log = logging.getLogger(__name__)


def create_app(
    settings: ServerSettings,
    *,
    registry: CollectorRegistry | None = None,
    gpu_reader: GpuReader | None | Literal["auto"] = "auto",
    backend_factory: BackendFactory | None = None,
    shutdown: Shutdown | None = None,
) -> FastAPI:
    """Build the app; models load in the background once the app starts. `shutdown` is
    the process edge's handle on SIGTERM (runner.py); without one, only the lifespan ends it."""
    if gpu_reader == "auto":
        gpu_reader = detect_gpu_reader()
    metrics = ServerMetrics(registry if registry is not None else REGISTRY, gpu_reader=gpu_reader)
    metrics.declare_model(settings.name)
    repository = ModelRepository(settings, metrics, backend_factory=backend_factory)
    shutdown = shutdown or Shutdown(settings.drain_timeout_s)
    bodies = BodyDecoder(parse_bytes=settings.parse_memory_bytes, max_body_bytes=settings.max_body_bytes)
    state = AppState(
        settings=settings,
        metrics=metrics,
        repository=repository,
        shutdown=shutdown,
        bodies=bodies,
        dataplane=DataPlane(settings, repository, bodies),
        tracing=tracing_from_settings(settings.otlp_traces_endpoint, settings.trace_sample_ratio, settings.name),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await repository.start()
        watcher = asyncio.get_running_loop().create_task(_flush_when_stopping(state))
        termination_log = settings.termination_log
        in_pod = termination_log is not None and termination_log.exists()
        if termination_log is not None and in_pod:
            loaded = asyncio.get_running_loop().create_task(_exit_if_nothing_loads(state, termination_log))
        yield
        if in_pod:
            loaded.cancel()
        watcher.cancel()
        shutdown.stop()
        await repository.stop(shutdown.drain_budget())
        bodies.close()
        if state.tracing is not None:
            await asyncio.to_thread(state.tracing.shutdown)

    app = ModelServerApp(
        title="model-server",
        version=__version__,
        lifespan=lifespan,
        description=f"Serves model '{settings.name}' over a simple JSON API and KServe v2.",
    )
    app.state.server = state
    app.shutdown = shutdown
    app.include_router(health.router)
    routes.register(app)
    app.include_router(v2.router)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(ContainErrors)
    install_error_handlers(app)
    _document_bodies(app)
    app.fast_path = InferenceFastPath(
        partial(FastAPI.__call__, app),
        [FastRoute(route.path, routes.bound(route, state)) for route in routes.INFERENCE_ROUTES],
        max_body_bytes=settings.max_body_bytes,
    )
    return app


class ModelServerApp(FastAPI):
    """FastAPI with the inference POSTs answered in front of it (fastpath.py)."""

    fast_path: InferenceFastPath | None = None
    shutdown: Shutdown | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.shutdown is not None and self.shutdown.draining and scope["type"] == "http":
            send = closing_connection(send)
        if self.fast_path is None:
            await super().__call__(scope, receive, send)
        else:
            await self.fast_path(scope, receive, send)


def closing_connection(send: Send) -> Send:
    """While draining, each response tells its client to close the connection after it.

    A kept-alive connection stays with this pod (conntrack pins it) after the pod has left the
    Service; when the listener closes, a request the client sends on it at that moment is lost
    (seen as one ReadError in 1,220 requests during a rolling update on a real node). Closing each
    connection after a response instead sends the client's next request down a new connection,
    which reaches a pod still in the Service."""

    async def send_closing(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
            message = {**message, "headers": [*headers, (b"connection", b"close")]}
        await send(message)

    return send_closing


def _document_bodies(app: FastAPI) -> None:
    """Add the hand-parsed request bodies to the OpenAPI components."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in BODY_MODELS:
                body = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(body.pop("$defs", {}))
                components[model.__name__] = body
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


# The exit code of a server whose model did not load (in a pod: see ServerSettings.termination_log).
LOAD_FAILED_EXIT = 3
TERMINATION_MESSAGE_BYTES = 2048


async def _exit_if_nothing_loads(state: AppState, path: Path) -> None:
    """In a pod a model that does not load never will (its files do not change): write why where
    the kubelet reads it and exit, so the container restarts and the pod's status (and the
    InferenceService's) names the reason, as KServe's servers do, instead of sitting unready
    until the startup probe gives up minutes later."""
    repository = state.repository
    await repository.wait_loaded()
    if repository.served or state.shutdown.draining:
        return
    failures = repository.failures
    why = "; ".join(f"version {v} failed to load: {reason}" for v, reason in sorted(failures.items()))
    why = why or repository.not_ready_reason() or "no model version loaded"
    log.error("no model version loaded; exiting (%d): %s", LOAD_FAILED_EXIT, why)
    with contextlib.suppress(OSError):
        path.write_text(" ".join(why.split()).encode()[:TERMINATION_MESSAGE_BYTES].decode(errors="ignore") + "\n")
    logging.shutdown()
    os._exit(LOAD_FAILED_EXIT)  # nothing is served, so nothing is in flight to drain


async def _flush_when_stopping(state: AppState) -> None:
    """Once the listener closes no request will come to fill a batch: stop waiting."""
    await state.shutdown.wait_stopping()
    state.repository.flush()
