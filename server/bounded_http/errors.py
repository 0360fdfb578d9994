"""The errors of the bounds every port keeps, as types that say what happened, not how a
transport reports it: a body over its limit (`PayloadTooLarge`, 413) and a budget that stays
full (`Busy`, 503). A program maps them to its transport's answer; the model server's
errors.py builds its own errors on `ServerError`. `str(exc)` is the client-facing message."""

from __future__ import annotations


class ServerError(Exception):
    """Base class of the errors a client is told about (anything else is an internal error)."""


class PayloadTooLarge(ServerError):
    """The body, or the memory its parse would take, is over the server's limit."""


class Overloaded(ServerError):
    """Backpressure: the caller should retry after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = max(1, retry_after_s)


class Busy(Overloaded):
    """Other large bodies hold the parse budget for longer than a request may wait."""

    def __init__(self) -> None:
        super().__init__("the server is busy parsing other large request bodies; retry shortly")
