"""Errors that carry their HTTP status, so handlers never turn a client mistake
into a 500 and every layer can raise without knowing about HTTP."""

from __future__ import annotations


class ServerError(Exception):
    """Base class: `status` is the HTTP code, `str(exc)` the client-facing message."""

    status: int = 500
    headers: dict[str, str] | None = None


class InvalidInput(ServerError):
    """The request is well-formed JSON but its tensors do not fit the model."""

    status = 400


class UnprocessableInput(ServerError):
    """The request body does not match the request schema."""

    status = 422


class PayloadTooLarge(ServerError):
    status = 413


class ClientClosed(ServerError):
    """The client went away (or was cut off for sending its body too slowly) before its body
    arrived: counted as a client error (nginx's 499), not as the server's 500; nobody reads
    the answer."""

    status = 499


class UnsupportedMediaType(ServerError):
    """A body that says it is not JSON (text/plain, a form, ...)."""

    status = 415


class ModelNotFound(ServerError):
    status = 404


class ModelNotReady(ServerError):
    status = 503


class QueueFull(ServerError):
    """Backpressure: the caller should retry after a short pause."""

    status = 429

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.headers = {"Retry-After": str(max(1, retry_after_s))}


class ShuttingDown(ServerError):
    status = 503

    def __init__(self, message: str = "server is shutting down") -> None:
        super().__init__(message)
        self.headers = {"Retry-After": "1", "Connection": "close"}


class BackendInputError(ServerError):
    """The runtime rejected an input (e.g. an index out of range); the caller's fault."""

    status = 400


class ModelLoadError(Exception):
    """A model version could not be loaded or warmed up."""
