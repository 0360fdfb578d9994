"""One server's state, made once by app.py and shared by both transports: the FastAPI routes
(through api/common.py's dependency) and the gRPC port (grpc_server.py), so neither reaches into
the other's layer for it."""

from __future__ import annotations

from dataclasses import dataclass

from .bodies import BodyDecoder
from .dataplane import DataPlane
from .lifecycle import Shutdown
from .metrics import ServerMetrics
from .repository import ModelRepository
from .settings import ServerSettings
from .tracing import Tracing


@dataclass
class AppState:
    """Everything a request handler needs, created once per app."""

    settings: ServerSettings
    metrics: ServerMetrics
    repository: ModelRepository
    shutdown: Shutdown
    bodies: BodyDecoder
    dataplane: DataPlane
    tracing: Tracing | None = None  # None: tracing off, the routes do no tracing work

    @property
    def draining(self) -> bool:
        """Readiness is false (SIGTERM received)."""
        return self.shutdown.draining

    def readiness(self) -> tuple[bool, str | None]:
        if self.draining:
            return False, "shutting down"
        reason = self.repository.not_ready_reason()
        return reason is None, reason
