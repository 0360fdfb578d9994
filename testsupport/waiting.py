"""Waiting for an event instead of a window: `eventually` asks until the answer is what a test
waits for, and fails naming what never came.

A test on a busy machine cannot say how long something takes; it can say what must happen and
give it a generous bound, past which the thing is not slow but missing. Every wait in the suite
goes through here, so that bound and the failure's words are the same everywhere.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

#: Long enough that a loaded 2-core machine is never the reason a wait fails.
DEFAULT_TIMEOUT_S = 60.0


class NeverHappened(AssertionError):
    """What a test waited for did not come within its bound."""


def _failure(what: str, timeout: float, last: object, error: BaseException | None) -> NeverHappened:
    detail = f"; last asked: {last!r}" if error is None else f"; last error: {error!r}"
    return NeverHappened(f"{what or 'the condition'} did not hold within {timeout:g} s{detail}")


def eventually(
    probe: Callable[[], T | None],
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = 0.05,
    what: str = "",
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """The first truthy answer of `probe`, asked every `interval` seconds; an exception of a
    type in `ignore` counts as a falsy answer. Raises `NeverHappened` after `timeout`."""
    deadline = time.monotonic() + timeout
    last: object = None
    error: BaseException | None = None
    while True:
        try:
            last, error = probe(), None
        except ignore as exc:
            last, error = None, exc
        if last:
            return last
        if time.monotonic() >= deadline:
            raise _failure(what, timeout, last, error)
        time.sleep(interval)


async def eventually_async(
    probe: Callable[[], T | None | Awaitable[T | None]],
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = 0.05,
    what: str = "",
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """`eventually` on an event loop: `probe` may be a plain function or a coroutine function,
    and the loop runs between two asks."""
    deadline = time.monotonic() + timeout
    last: object = None
    error: BaseException | None = None
    while True:
        try:
            answer = probe()
            last, error = (await answer if isinstance(answer, Awaitable) else answer), None
        except ignore as exc:
            last, error = None, exc
        if last:
            return last
        if time.monotonic() >= deadline:
            raise _failure(what, timeout, last, error)
        await asyncio.sleep(interval)
