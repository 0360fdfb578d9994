"""Memory budgets for what a port holds on behalf of its clients: bytes of request bodies as
they arrive (`ReadBudget`), answers written whole and not yet read (`AnswerBudget`), and plain
reservations (`MemoryBudget`). Every program's ports take from them, so that what one client
sends or leaves unread is bounded by a budget, not by connections times a body's size. A budget
that stays full ends a wait with `Busy` (503); a body over its claim is `PayloadTooLarge` (413).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections import deque
from collections.abc import AsyncIterable, Awaitable, Callable

from .errors import Busy, PayloadTooLarge


class MemoryBudget:
    """A first-come-first-served semaphore over bytes: a large reservation is not
    overtaken forever by small ones."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.free = total
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    async def acquire(self, size: int, timeout: float) -> None:
        """Take `size` bytes, waiting at most `timeout` s (then `Busy`)."""
        if size > self.total:
            raise ValueError(f"{size} bytes exceed the whole budget of {self.total}")
        if not self._waiters and size <= self.free:
            self.free -= size
            return
        waiter = (size, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter[1]
        except BaseException as exc:
            if waiter[1].done() and not waiter[1].cancelled():
                self.release(size)  # granted just as the wait ended
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
                waiter[1].cancel()
                self._wake()  # a large waiter at the head may have held up smaller ones
            if isinstance(exc, TimeoutError):
                raise Busy() from None
            raise

    def take_now(self, size: int) -> bool:
        """Take `size` bytes if they are free now, ahead of any waiter: for memory already in use
        that the budget must count (an answer made), not memory yet to be taken."""
        if size > self.free:
            return False
        self.free -= size
        return True

    def release(self, size: int) -> None:
        self.free += size
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._waiters[0][0] <= self.free:
            size, future = self._waiters.popleft()
            if not future.done():
                self.free -= size
                future.set_result(None)


class ReadBudget:
    """Bytes of bodies being read, taken as they arrive, each body up to its claim (its
    Content-Length, or the largest body allowed).

    Bodies arrive interleaved, so bodies that each hold part of themselves and wait for the
    rest can fill a plain budget and wait on each other until they all time out. Here a
    chunk is granted only if, with it, every reader could still finish in some order, each
    returning what it holds (the banker's algorithm): some reader can always finish. A
    reader that has sent nothing beyond its headers holds nothing and blocks no one.

    Each check costs O(log total), not a sort of every reader (`NeedTree`), and waiting
    chunks are granted nearest-to-finishing reader first, stopping at the first that must
    still wait: re-checking every waiter against every reader on each event took 18 s of
    the event loop for 1,000 stalled uploads, and /health/live went unanswered.
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.free = total
        self._readers: dict[int, list[int]] = {}  # id -> [claim, held]
        self._needs = NeedTree(total)
        # Waiting chunks by (their reader's need, arrival): the live ones in `_waiters`, and in
        # `_queue` until popped (a chunk that stopped waiting is skipped then, or compacted away).
        self._waiters: dict[int, tuple[int, int, asyncio.Future[None]]] = {}  # seq -> (reader, size, future)
        self._queue: list[tuple[int, int]] = []  # heap of (need, seq)
        self._ids = itertools.count()

    def open(self, claim: int) -> int:
        """A reader of at most `claim` bytes (at most the whole budget); its id."""
        reader = next(self._ids)
        claim = min(claim, self.total)
        self._readers[reader] = [claim, 0]
        self._needs.add(claim, 0)
        return reader

    async def take(self, reader: int, size: int, timeout: float) -> None:
        """`size` more bytes for `reader`, waiting at most `timeout` s (then `Busy`)."""
        claim, held = self._readers[reader]
        if held + size > claim:
            raise PayloadTooLarge(f"request body is larger than its {claim} bytes")
        if self._safe(reader, size):
            self._grant(reader, size)
            self._wake()  # this reader, now nearer its end, may be what lets a waiting one go on
            return
        seq = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._waiters[seq] = (reader, size, future)
        heapq.heappush(self._queue, (claim - held, seq))
        try:
            async with asyncio.timeout(timeout):
                await future
        except TimeoutError:
            raise Busy() from None
        finally:
            if self._waiters.pop(seq, None) is not None and len(self._queue) > 2 * len(self._waiters) + 16:
                self._queue = [entry for entry in self._queue if entry[1] in self._waiters]
                heapq.heapify(self._queue)

    def hold(self, size: int) -> bool:
        """`size` bytes at once, for bytes already in memory (an answer written whole), if every
        reader could still finish without them back and no chunk is waiting; `unhold` returns
        them. They are not a reader's: nothing counts on them coming back soon."""
        if self._waiters or size > self.free or self._needs.worst() > self.free - size:
            return False
        self.free -= size
        return True

    def unhold(self, size: int) -> None:
        self.free += size
        self._wake()

    def close(self, reader: int) -> None:
        """Return everything `reader` holds."""
        claim, held = self._readers.pop(reader)
        self._needs.remove(claim - held, held)
        self.free += held
        self._wake()

    def _grant(self, reader: int, size: int) -> None:
        claims = self._readers[reader]
        claim, held = claims
        self._needs.remove(claim - held, held)
        self._needs.add(claim - held - size, held + size)
        claims[1] = held + size
        self.free -= size

    def _safe(self, reader: int, size: int) -> bool:
        """Whether, after `size` more bytes to `reader`, the readers can all finish: the one
        needing least finishes first and returns what it holds, and so on."""
        free = self.free - size
        if free < 0:
            return False
        claim, held = self._readers[reader]
        need = claim - held
        if self._needs.worst() <= self.free:
            # Safe now: the grant only brings nearer to their end the readers needing more than
            # the reader's new need, so only those needing at most that, and the reader, decide.
            worst, held_below = self._needs.prefix(need - size)
            return worst <= free and need - held_below <= self.free
        # Not safe now (a reader that cannot finish yet has opened since): check the state the
        # grant would make, whole.
        self._needs.remove(need, held)
        self._needs.add(need - size, held + size)
        safe = self._needs.worst() <= free
        self._needs.remove(need - size, held + size)
        self._needs.add(need, held)
        return safe

    def _wake(self) -> None:
        """Grant waiting chunks, the reader nearest to finishing first (the one needing least
        can always go on), until one must still wait."""
        while self._queue:
            _, seq = self._queue[0]
            waiter = self._waiters.get(seq)
            if waiter is None or waiter[2].done():
                heapq.heappop(self._queue)
                continue
            reader, size, future = waiter
            if not self._safe(reader, size):
                return
            heapq.heappop(self._queue)
            del self._waiters[seq]
            self._grant(reader, size)
            future.set_result(None)


class AnswerBudget:
    """Answers written whole and not yet read by their clients, held in the request bodies'
    budget (`ReadBudget.hold`), so that bodies and answers waiting in a process have one bound:
    the budget, not its connections times an answer's size. A client (its address) holds at
    most `share` of it, so one that never reads cannot keep the others' answers out."""

    def __init__(self, budget: ReadBudget, share: float = 0.5) -> None:
        self.budget = budget
        self.per_client = int(budget.total * share)
        self.held: dict[str, int] = {}  # client -> bytes

    def hold(self, client: str, size: int) -> bool:
        """`size` bytes of an answer to `client`, if they may be kept now."""
        held = self.held.get(client, 0)
        if held + size > self.per_client or not self.budget.hold(size):
            return False
        self.held[client] = held + size
        return True

    def release(self, client: str, size: int) -> None:
        self.budget.unhold(size)
        left = self.held[client] - size
        if left:
            self.held[client] = left
        else:
            del self.held[client]

    def spent(self, client: str) -> bool:
        """Whether `client` holds its whole share: its next answer could not be kept."""
        return self.held.get(client, 0) >= self.per_client


_NONE = -(1 << 62)  # no reader: below any need
_EMPTY = (0, _NONE)


class NeedTree:
    """Readers by need (bytes still to come) with what they hold: whether they can all
    finish with `free` bytes in O(log total) per change and per question.

    Sorted by need, the readers can all finish iff each one's need is at most `free` plus
    what the readers before it hold: iff `worst()`, the largest of need minus the bytes held
    by readers needing less, is at most `free`. A segment tree over needs 0..total keeps, per
    range, the bytes held in it and that largest value counted from the range's start; only
    ranges with readers are stored. No library keeps such sums over a sorted order.
    """

    __slots__ = ("_counts", "_leaves", "_nodes")

    def __init__(self, total: int) -> None:
        self._leaves = 1 << max(total, 1).bit_length()  # needs run from 0 to total
        self._nodes: dict[int, tuple[int, int]] = {}  # node -> (held, worst); the root is 1
        self._counts: dict[int, int] = {}  # need -> readers

    def add(self, need: int, held: int) -> None:
        self._update(need, held, 1)

    def remove(self, need: int, held: int) -> None:
        self._update(need, -held, -1)

    def worst(self) -> int:
        return self._nodes.get(1, _EMPTY)[1]

    def prefix(self, need: int) -> tuple[int, int]:
        """`worst()` over the readers needing at most `need`, and what those needing less hold."""
        nodes = self._nodes
        node, start, span = 1, 0, self._leaves
        worst, held = _NONE, 0
        while span > 1 and node in nodes:
            span >>= 1
            if need >= start + span:  # the left half is all below: take it whole
                left_held, left_worst = nodes.get(2 * node, _EMPTY)
                worst = max(worst, left_worst - held)
                held += left_held
                node, start = 2 * node + 1, start + span
            else:
                node = 2 * node
        if span == 1 and need in self._counts:
            worst = max(worst, need - held)
        return worst, held

    def _update(self, need: int, held: int, count: int) -> None:
        nodes = self._nodes
        node = self._leaves + need
        readers = self._counts.get(need, 0) + count
        if readers:
            self._counts[need] = readers
            nodes[node] = (nodes.get(node, _EMPTY)[0] + held, need)
        else:
            del self._counts[need]
            del nodes[node]
        node >>= 1
        while node:
            left_held, left_worst = nodes.get(2 * node, _EMPTY)
            right_held, right_worst = nodes.get(2 * node + 1, _EMPTY)
            if left_worst == _NONE and right_worst == _NONE:
                nodes.pop(node, None)
            else:
                nodes[node] = (left_held + right_held, max(left_worst, right_worst - left_held))
            node >>= 1


#: The ASGI scope extension a transport puts its "has the client gone?" under (http_protocol.py):
#: a callable an application asks before it makes an answer nobody will read.
CLIENT_GONE = "bounded_http.client_gone"


async def read_body(
    chunks: AsyncIterable[bytes], length: int | None, take: Callable[[int], Awaitable[None]]
) -> bytearray:
    """The body in one growing buffer (no join of chunks), each chunk's bytes taken from the
    budget before they are kept: memory follows what arrived, not what was announced."""
    body = bytearray()
    async for chunk in chunks:
        if length is not None and len(body) + len(chunk) > length:
            raise PayloadTooLarge("request body is longer than its Content-Length")
        await take(len(chunk))
        body += chunk
    return body
