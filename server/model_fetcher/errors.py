"""How a fetch fails: one exception whose exit code says which kind of failure it was, so a
pod's status (the init container's exit code) tells them apart."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    SOURCE = 1
    USAGE = 2
    UNSAFE = 3
    NOT_A_MODEL = 4
    TOO_LARGE = 5
    DEADLINE = 6
    CHECKSUM = 7
    LOCAL_IO = 8


class FetchError(Exception):
    """The model could not be fetched: the message says what and from where, `code` the exit
    code the init container ends with, so a pod's status tells the kinds of failure apart."""

    def __init__(self, message: str, code: ExitCode = ExitCode.SOURCE) -> None:
        super().__init__(message)
        self.code = code
