"""What can go wrong serving a request, as types that say what happened, not how a transport
reports it: the core raises them and knows nothing of HTTP; `api/errors.py` alone maps each to
a status code and headers. `str(exc)` is the client-facing message."""

from __future__ import annotations

from bounded_http.errors import Busy, Overloaded, PayloadTooLarge, ServerError

__all__ = [
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
