"""Request bodies: read and decoded under a memory budget, off the event loop.

A JSON body turns into Python objects before it turns into tensors, and those take
many times the body's bytes: a float is ~32 bytes for ~10 bytes of text, an empty
list 64 bytes for 3. So a large body first takes its bytes from one budget as they
arrive (`ReadBudget`, which never lets concurrent uploads wait on each other), then
its parse cost, estimated from a count of its separators (`estimate_parse_bytes`),
from another; a body whose estimate exceeds the whole budget is refused (413) before
it is parsed, and the parse runs in a small thread pool so that the event loop keeps
answering probes. Small bodies parse on the loop: that is faster than a thread hop
and their worst case is small.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from bounded_http.budgets import MemoryBudget, ReadBudget, read_body

from .errors import PayloadTooLarge

T = TypeVar("T")

#: Bodies up to this size are parsed on the event loop, without a reservation.
INLINE_BYTES = 128 * 1024

# Bytes per item of JSON, measured on CPython 3.11 with orjson (tests/server/
# test_ms_bodies.py checks the estimate against a real server's peak resident memory):
# while orjson parses, each value has a parser node (16 bytes) and its Python object
# and list slot (a float: 32 bytes); the parser also copies the body. Decoding then
# adds up to 12 bytes per value of arrays while the objects are alive. A list costs
# 56 bytes plus slack, a small dict ~360.
_PER_VALUE = 72
_PER_LIST = 72
_PER_DICT = 360


def estimate_parse_bytes(body: bytes | bytearray | memoryview) -> int:
    """An upper bound on the memory that parsing and decoding `body` takes, body
    included. Values are separated by `,` or open a container, so counting those
    bounds how many objects the parser can make; string text costs at most its
    own length (ASCII) or four times it (str is UCS-4 once one character needs it)."""
    data = body if isinstance(body, (bytes, bytearray)) else bytes(body)
    lists, dicts = data.count(b"["), data.count(b"{")
    values = data.count(b",") + lists + dicts + 1
    text = len(data) if data.isascii() and b"\\u" not in data else 4 * len(data)
    return len(data) + text + _PER_VALUE * values + _PER_LIST * lists + _PER_DICT * dicts


def _never() -> bool:
    return False


@dataclass(slots=True)  # not frozen: made once per request, and frozen fields cost a setattr each
class RequestBody:
    """A request's body as a transport delivers it: the length it announced (None without one),
    two ways to read it once (whole, or chunk by chunk as it arrives), and whether its client
    has gone (nobody will read the answer: no reason to make it)."""

    length: int | None
    read: Callable[[], Awaitable[bytes]]
    chunks: Callable[[], AsyncIterator[bytes]]
    gone: Callable[[], bool] = _never


class BodyDecoder:
    """Reads a request body and runs a decoding function on it, within the budgets.

    Bodies waiting for their parse hold `buffer_bytes` at most; parses running hold
    `parse_bytes` at most (each its estimate). A parse never waits for a buffer, so
    the two cannot deadlock: peak memory for bodies stays below their sum plus the
    inline parses, one at a time on the loop.
    """

    def __init__(self, *, parse_bytes: int, max_body_bytes: int, wait_s: float = 10.0, threads: int = 2) -> None:
        self.parse = MemoryBudget(parse_bytes)
        self.buffer = ReadBudget(max(max_body_bytes, parse_bytes // 4))
        self.max_body_bytes = max_body_bytes
        self.wait_s = wait_s
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="parse")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def decode(
        self,
        request: RequestBody,
        decode: Callable[[bytes | bytearray], T],
        estimate: Callable[[bytes | bytearray], int] = estimate_parse_bytes,
    ) -> T:
        """`decode(body)` within the budgets; `estimate(body)` bounds what decoding takes (the
        JSON estimate by default; a binary body's own, which knows its BYTES elements)."""
        length = request.length
        if length is not None and length <= INLINE_BYTES:
            return decode(await request.read())
        # Taken as the bytes arrive, not as declared: a connection that sends headers
        # announcing 50 MB and then nothing holds nothing, so it cannot starve the others; a
        # 503 means bytes other requests really hold.
        reader = self.buffer.open(self.max_body_bytes if length is None else length)

        async def take(size: int) -> None:
            await self.buffer.take(reader, size, self.wait_s)

        handed_over = False
        try:
            body = await read_body(request.chunks(), length, take)
            if len(body) <= INLINE_BYTES:
                return decode(body)
            loop = asyncio.get_running_loop()
            cost = await loop.run_in_executor(self._pool, estimate, body)  # passes over the body
            if cost > self.parse.total:
                raise PayloadTooLarge(
                    f"parsing this {len(body)}-byte body would take about {cost >> 20} MiB, more than the "
                    f"parse budget of {self.parse.total >> 20} MiB (parse-memory-bytes, sized from the "
                    "memory limit); send fewer or smaller values per request, or the binary tensor extension"
                )
            await self.parse.acquire(cost, self.wait_s)
            job = self._pool.submit(_without_gc, decode, body)
            handed_over = True
            # The budgets are returned when the thread is done with the body, even if
            # the request is cancelled (client gone, drain timeout) while it runs.
            job.add_done_callback(lambda _: _call_soon(loop, self._release, cost, reader))
            return await asyncio.wrap_future(job)
        finally:
            if not handed_over:
                self.buffer.close(reader)

    def _release(self, cost: int, reader: int) -> None:
        self.parse.release(cost)
        self.buffer.close(reader)


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., object], *args: object) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to release to
        loop.call_soon_threadsafe(fn, *args)


_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_restore = False


def _without_gc(decode: Callable[[bytearray], T], body: bytearray) -> T:
    """Run `decode` with the cyclic collector paused: a parse makes millions of
    containers that form no cycles, and the collections they trigger cost more
    than the parse itself (3.8x on a body of empty lists)."""
    global _gc_pausers, _gc_restore
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_restore = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        return decode(body)
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_restore:
                gc.enable()
