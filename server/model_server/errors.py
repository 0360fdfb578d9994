"""What can go wrong serving a request, as types that say what happened, not how a transport
reports it: the core raises them and knows nothing of HTTP; `api/errors.py` alone maps each to
a status code and headers. `str(exc)` is the client-facing message."""

from __future__ import annotations


class ServerError(Exception):
    """Base class of the errors a client is told about (anything else is an internal error)."""


class InvalidInput(ServerError):
    """The request is well-formed JSON but its tensors do not fit the model."""


class UnprocessableInput(ServerError):
    """The request body does not match the request schema."""


class PayloadTooLarge(ServerError):
    """The body, or the memory its parse would take, is over the server's limit."""


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


class Overloaded(ServerError):
    """Backpressure: the caller should retry after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = max(1, retry_after_s)


class QueueFull(Overloaded):
    """The batcher's queue is full."""


class Busy(Overloaded):
    """Other large bodies hold the parse budget for longer than a request may wait."""

    def __init__(self) -> None:
        super().__init__("the server is busy parsing other large request bodies; retry shortly")


class ShuttingDown(ServerError):
    """Draining: the request belongs on another replica."""

    retry_after_s = 1

    def __init__(self, message: str = "server is shutting down") -> None:
        super().__init__(message)


class BackendInputError(ServerError):
    """The runtime rejected an input (e.g. an index out of range); the caller's fault."""


class ModelLoadError(Exception):
    """A model version could not be loaded or warmed up."""
