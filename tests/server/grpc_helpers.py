"""The model server with its gRPC port, in a thread of the test process: the process edge's own
server (runner.GracefulServer), so the gRPC listener starts and stops as it does in a pod."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import uvicorn
from prometheus_client import CollectorRegistry

from bounded_http.grpc_calls import SERVICE
from model_server import grpc_predict_v2_pb2 as pb
from model_server.app import create_app
from model_server.grpc_server import GrpcFrontEnd
from model_server.lifecycle import Shutdown
from model_server.runner import GracefulServer
from model_server.settings import ServerSettings

from .helpers import RunningServer, wait_started


@dataclass
class GrpcServer:
    http: RunningServer
    grpc_port: int
    server: GracefulServer

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        return self.http.metric(name, labels)


@contextlib.contextmanager
def running_grpc_server(
    settings: ServerSettings, *, wait_ready: bool = True, **app_kwargs: object
) -> Iterator[GrpcServer]:
    """`settings` served over HTTP and gRPC (a free port each) until the block ends."""
    registry = CollectorRegistry()
    shutdown = Shutdown(settings.drain_timeout_s)
    app = create_app(settings, registry=registry, gpu_reader=None, shutdown=shutdown, **app_kwargs)  # type: ignore[arg-type]
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
    front = GrpcFrontEnd(app.state.server)
    server = GracefulServer(config, settings, shutdown, None, front)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_started(app, lambda: bool(server.started and front.port), wait_ready)
        yield GrpcServer(RunningServer(app, f"http://127.0.0.1:{port}", registry), front.port, server)
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


def raw_call(target: str, method: str, body: bytes, timeout: float = 10) -> bytes:
    """One call of `method` with `body` as its message bytes, whatever they are."""
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(f"/{SERVICE}/{method}")
        answer: bytes = call(body, timeout=timeout)
        return answer


def infer(target: str, request: pb.ModelInferRequest, timeout: float = 10) -> pb.ModelInferResponse:
    """ModelInfer with the server's own message classes (typed contents, odd requests)."""
    return pb.ModelInferResponse.FromString(raw_call(target, "ModelInfer", request.SerializeToString(), timeout))
