"""Process edge: uvicorn with graceful SIGTERM handling and the metrics port.

The metrics port is a second listener of the same server, on the same loop, with the same
connection limits (bounded_http/http_protocol.py): prometheus_client's own server started a thread per
connection with no timeout, and 1,000 half-sent requests made 1,000 threads.

SIGTERM -> readiness turns false at once -> (optional `shutdown_delay_s` while
the endpoint is removed from Services) -> the listener closes -> in-flight and
queued requests finish, bounded by `drain_timeout_s` -> exit 0.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import threading
from types import FrameType

import uvicorn
from prometheus_client import REGISTRY

from bounded_http import metrics_port, signals
from bounded_http.http_protocol import ConnectionLimits, LimitedHttpProtocol

from .app import create_app
from .caches import prepare_compile_caches
from .grpc_server import GrpcFrontEnd
from .lifecycle import Shutdown
from .settings import ServerSettings

log = logging.getLogger("model_server")


class GracefulServer(uvicorn.Server):
    """uvicorn.Server that marks the app unready before it starts shutting down."""

    def __init__(
        self,
        config: uvicorn.Config,
        settings: ServerSettings,
        shutdown: Shutdown,
        metrics: uvicorn.Config | None = None,
        grpc: GrpcFrontEnd | None = None,
    ) -> None:
        super().__init__(config)
        self.settings = settings
        self.lifecycle = shutdown
        self.metrics = metrics
        self.grpc = grpc
        self._delay: threading.Timer | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        metrics = await self._listen_for_metrics() if self.metrics is not None else None
        await super().startup(sockets)
        if metrics is not None:
            self.servers.append(metrics)  # closed, and its connections drained, with the rest
        if self.grpc is not None and not self.should_exit:
            await self.grpc.start()
        early = signals.take_received()
        if early is not None and not self.should_exit:  # before uvicorn's handlers were there
            log.info("signal %d received while starting", early)
            self.handle_exit(early, None)

    async def _listen_for_metrics(self) -> asyncio.Server:
        """The metrics port: its connections are the server's own (the same state, so the same
        shutdown and Date header), each under the same limits as the main port's."""
        assert self.metrics is not None
        return await metrics_port.listen(self.metrics, self.server_state)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """The gRPC port stops taking calls with the HTTP ports; its calls in progress drain
        alongside theirs (the batcher flushes for both)."""
        if self.grpc is None:
            await super().shutdown(sockets)
            return
        await asyncio.gather(super().shutdown(sockets), self.grpc.stop(self.settings.drain_timeout_s))

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.lifecycle.drain()
        delay = self.settings.shutdown_delay_s
        if delay > 0 and self._delay is None and not self.should_exit:
            log.info("signal %d: not ready; stopping in %.1fs", sig, delay)
            self._delay = threading.Timer(delay, self._begin_shutdown, args=(sig, frame))
            self._delay.daemon = True
            self._delay.start()
            return
        self._begin_shutdown(sig, frame)

    def _begin_shutdown(self, sig: int, frame: FrameType | None) -> None:
        # Runs in a signal handler (or the delay timer's thread): Shutdown.stop hands
        # the event to the app's loop, whose task then flushes the queues.
        super().handle_exit(sig, frame)
        if not self.lifecycle.stopping:
            log.info("signal %d: draining (timeout %.1fs)", sig, self.settings.drain_timeout_s)
            self.lifecycle.stop()


#: Answered even when every connection has a request in flight: the kubelet's probes among them.
PROBE_PATHS = frozenset({"/health/live", "/health/ready", "/v2/health/live", "/v2/health/ready"})


def connection_limits(settings: ServerSettings, probe_paths: frozenset[str] = PROBE_PATHS) -> ConnectionLimits:
    return ConnectionLimits.of(settings, probe_paths)


def metrics_config(settings: ServerSettings) -> uvicorn.Config | None:
    """The metrics port's listener, or None without `metrics_port`."""
    if not settings.metrics_port:
        return None
    return uvicorn.Config(
        metrics_port.MetricsExposition(REGISTRY),
        host=settings.host,
        port=settings.metrics_port,
        log_config=None,
        access_log=False,
        lifespan="off",
        proxy_headers=False,
        timeout_keep_alive=settings.keep_alive_timeout_s,
        http=LimitedHttpProtocol.with_limits(connection_limits(settings, frozenset({"/metrics"}))),
    )


TEXT_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
JSON_LOG_FIELDS = "%(asctime)s %(levelname)s %(name)s %(message)s"


def log_handler(log_format: str = "text", trace_ids: bool = False) -> logging.Handler:
    """stderr, as text (the default) or one JSON object per line; with `trace_ids`, a record
    logged under a traced request carries its trace_id and span_id."""
    handler = logging.StreamHandler()
    if log_format == "json":
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(
            JsonFormatter(JSON_LOG_FIELDS, rename_fields={"asctime": "time", "levelname": "level", "name": "logger"})
        )
    else:
        handler.setFormatter(logging.Formatter(TEXT_LOG_FORMAT))
    if trace_ids:
        from .tracing import TraceIds

        handler.addFilter(TraceIds())
    return handler


def configure_logging(level: str, log_format: str = "text", trace_ids: bool = False) -> None:
    logging.basicConfig(level=level.upper(), handlers=[log_handler(log_format, trace_ids)])


def serve(settings: ServerSettings) -> int:
    """Run until SIGTERM/SIGINT; 0 after a graceful stop."""
    configure_logging(settings.log_level, settings.log_format, trace_ids=settings.otlp_traces_endpoint is not None)
    prepare_compile_caches()
    shutdown = Shutdown(settings.drain_timeout_s)
    app = create_app(settings, registry=REGISTRY, shutdown=shutdown)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=settings.access_log,
        # JSON: uvicorn's loggers keep no handlers of their own and reach the root's JSON lines.
        log_config=None if settings.log_format == "json" else uvicorn.config.LOGGING_CONFIG,
        timeout_graceful_shutdown=settings.drain_timeout_s,  # type: ignore[arg-type]
        timeout_keep_alive=settings.keep_alive_timeout_s,
        lifespan="on",
        # Answers waiting for their clients are held in the request bodies' budget (bounded_http/http_protocol.py).
        http=LimitedHttpProtocol.with_limits(connection_limits(settings), app.state.server.bodies.buffer),
    )
    grpc = GrpcFrontEnd(app.state.server) if settings.grpc_port is not None else None
    server = GracefulServer(config, settings, shutdown, metrics_config(settings), grpc)
    # uvicorn re-raises the caught signal after a graceful stop; the remembering handlers
    # underneath turn that into a normal return, so the exit code is 0.
    signals.remember_stop_signals()
    # The framework's objects live as long as the process: out of the collector's sight,
    # a full collection no longer walks them all in the middle of requests (a p99 of
    # 92 -> 29 ms at 64 clients on a small model, bench/peer_bench.py).
    gc.collect()
    gc.freeze()
    server.run()
    return 0 if server.started else 1
