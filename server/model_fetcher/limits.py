"""What one fetch may cost: a size cap over every file it writes and an overall deadline,
however slowly the bytes trickle. Shared by the model fetcher and the adapters sidecar."""

from __future__ import annotations

import argparse
import dataclasses
import re
import time

from .errors import ExitCode, FetchError

DEFAULT_MAX_BYTES = 200 << 30
DEFAULT_DEADLINE_SECONDS = 3600.0


@dataclasses.dataclass
class Limits:
    """What one fetch may cost, and what it must match; shared by every file it writes."""

    max_bytes: int = DEFAULT_MAX_BYTES
    deadline_seconds: float = DEFAULT_DEADLINE_SECONDS
    sha256: str | None = None
    redirect_hosts: frozenset[str] = frozenset()
    started: float = dataclasses.field(default_factory=time.monotonic)
    written: int = 0

    def remaining(self) -> float:
        left = self.deadline_seconds - (time.monotonic() - self.started)
        if left <= 0:
            raise FetchError(f"not done within the deadline of {self.deadline_seconds:g} s", ExitCode.DEADLINE)
        return left

    def count(self, size: int) -> None:
        self.written += size
        if self.written > self.max_bytes:
            raise FetchError(f"more than the size cap of {self.max_bytes} bytes", ExitCode.TOO_LARGE)

    def expect(self, total: int, what: str) -> None:
        if self.written + total > self.max_bytes:
            raise FetchError(
                f"{what} is {total} bytes, over the size cap of {self.max_bytes} bytes", ExitCode.TOO_LARGE
            )


SIZE_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30}
SIZE_UNITS["ti"] = 1 << 40


def parse_size(text: str) -> int:
    """A byte count: 5000000, 500Mi, 200Gi, 1T."""
    match = re.fullmatch(r"\s*(\d+)\s*([kKmMgGtT]i?)?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 500Mi or 200Gi")
    return int(match[1]) * SIZE_UNITS[(match[2] or "").lower()]
