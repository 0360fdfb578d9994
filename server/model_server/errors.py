"""What can go wrong serving a request, as types that say what happened, not how a transport
reports it, and each one's status (`status_of`): an HTTP status code, which the REST port
answers with its headers and body (api/errors.py), the gRPC port maps to its own code
(grpc_server.py) and the request metrics count, so the two transports cannot disagree on what a
failure is. `str(exc)` is the client-facing message."""

from __future__ import annotations

from bounded_http.errors import Busy, Overloaded, PayloadTooLarge, ServerError

__all__ = [
    "CLIENT_CLOSED",
    "INTERNAL_ERROR",
    "STATUS",
    "BackendInputError",
    "Busy",
    "ClientClosed",
    "InvalidInput",
    "ModelLoadError",
    "ModelNotFound",
    "ModelNotReady",
    "Overloaded",
    "PayloadTooLarge",
    "QueueFull",
    "ServerError",
    "ShuttingDown",
    "UnprocessableInput",
    "UnsupportedMediaType",
    "status_of",
]


class InvalidInput(ServerError):
    """The request is well-formed JSON but its tensors do not fit the model."""


class UnprocessableInput(ServerError):
    """The request body does not match the request schema."""


class ClientClosed(ServerError):
    """The client went away (or was cut off for sending its body too slowly) before its body
    arrived, or before its answer was made: a client error, not the server's; nobody reads the
    answer."""


class UnsupportedMediaType(ServerError):
    """A body that says it is not JSON (text/plain, a form, ...)."""


class ModelNotFound(ServerError):
    """No such model or version."""


class ModelNotReady(ServerError):
    """The model is known but not loaded (yet)."""


class QueueFull(Overloaded):
    """The batcher's queue is full."""


class ShuttingDown(ServerError):
    """Draining: the request belongs on another replica."""

    retry_after_s = 1

    def __init__(self, message: str = "server is shutting down") -> None:
        super().__init__(message)


class BackendInputError(ServerError):
    """The runtime rejected an input (e.g. an index out of range); the caller's fault."""


class ModelLoadError(Exception):
    """A model version could not be loaded or warmed up."""


#: nginx's "client closed request": counted as the client's doing, never sent.
CLIENT_CLOSED = 499
INTERNAL_ERROR = 500

STATUS: dict[type[ServerError], int] = {
    InvalidInput: 400,
    BackendInputError: 400,
    ModelNotFound: 404,
    PayloadTooLarge: 413,
    UnsupportedMediaType: 415,
    UnprocessableInput: 422,
    Overloaded: 429,
    Busy: 503,  # the parse budget, not the queue: another replica may have room
    ClientClosed: CLIENT_CLOSED,
    ModelNotReady: 503,
    ShuttingDown: 503,
}


def status_of(exc: ServerError) -> int:
    """The status of `exc`'s type, or of its nearest ancestor in the table."""
    for cls in type(exc).__mro__:
        status = STATUS.get(cls)
        if status is not None:
            return status
    return INTERNAL_ERROR
