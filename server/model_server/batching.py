"""Adaptive dynamic batching: concurrent requests are stacked into one backend call.

Requests wait in a bounded queue; a dispatcher takes the oldest one plus every
queued request of the same shape, up to `max_batch_size` rows. Load, not a fixed
window, sets the batch size (the scheduling of Triton's dynamic batcher and
TF-Serving's batch scheduler), with one rule for the callers a batch just answered:

- an idle runtime takes a lone request at once (no batching window);
- behind a busy runtime the batch keeps forming until the runtime frees up; a full
  batch is queued behind the running one at once, so the runtime does not wait for
  the event loop between full batches;
- when a batch of r rows finishes, its callers usually send their next request within
  a round trip: the idle runtime waits for that many rows to arrive again, so
  closed-loop clients keep meeting in one full batch instead of settling into
  half-size groups that take turns on the runtime (the same rows in twice the calls).
  The wait is bounded by half the batch's run time (`regroup_window`: it pays only
  where the runtime, not the HTTP path, is the bottleneck) and by `max_delay`: the
  runtime never stands idle longer than that while requests wait.

Each caller gets back exactly its own rows. A full queue raises `QueueFull` at once
(backpressure instead of unbounded latency); closing flushes the queue.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import defaultdict, deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from . import tracing
from .errors import QueueFull, ShuttingDown

log = logging.getLogger(__name__)

Tensors = dict[str, np.ndarray]
RunFn = Callable[[Mapping[str, np.ndarray]], Tensors]


class BatchObserver(Protocol):
    """Where the batcher reports what it does (metrics live elsewhere)."""

    def queued(self, delta: int) -> None: ...
    def queue_wait(self, seconds: float) -> None: ...
    def batch(self, rows: int, compute_seconds: float) -> None: ...


class NullObserver:
    def queued(self, delta: int) -> None:
        pass

    def queue_wait(self, seconds: float) -> None:
        pass

    def batch(self, rows: int, compute_seconds: float) -> None:
        pass


@dataclass(eq=False, slots=True)
class _Request:
    inputs: Tensors
    rows: int
    key: Hashable
    future: asyncio.Future[dict[str, np.ndarray]]
    enqueued: float
    trace: tracing.RequestTrace | None = None  # None unless this request is traced


@dataclass(eq=False, slots=True)
class _Lane:
    """One model instance (e.g. a session per GPU) and the threads that call it."""

    runner: RunFn
    executor: ThreadPoolExecutor
    threads: int
    in_flight: int = 0  # batches handed to the executor and not finished

    @property
    def idle(self) -> bool:
        return self.in_flight < self.threads

    @property
    def full(self) -> bool:
        """One batch may wait in the executor behind the running ones, no more:
        later requests keep coalescing in the queue instead."""
        return self.in_flight > self.threads


def dispatch_delay(
    *,
    now: float,
    queued_rows: int,
    max_batch: int,
    runtime_idle: bool,
    returning_rows: int = 0,
    regroup_until: float = 0.0,
    closing: bool = False,
) -> float:
    """Seconds the forming batch should keep waiting for company: 0 = dispatch now,
    `math.inf` = until the runtime frees up (a finishing batch re-evaluates).

    A full batch never waits, nor does anything while closing. Behind a busy runtime a
    batch cannot start sooner by leaving early, so it keeps forming. An idle runtime
    waits only for `returning_rows`, the rows of a just-finished batch whose callers
    have not sent their next request yet, and only until `regroup_until` (see
    `regroup_window`); a lone caller's next request finds nothing to wait for.
    """
    if closing or queued_rows >= max_batch:
        return 0.0
    if not runtime_idle:
        return math.inf
    if returning_rows <= 0:
        return 0.0
    return max(0.0, regroup_until - now)


REGROUP_FRACTION = 0.5


def regroup_window(batch_seconds: float, max_delay: float) -> float:
    """How long after a batch finishes the idle runtime may wait for its callers' next
    requests: a fraction of what a batch takes to run (waiting longer than that idles
    the runtime for more than regrouping can save), never beyond `max_delay`."""
    return min(max_delay, REGROUP_FRACTION * batch_seconds)


def batch_key(inputs: Mapping[str, np.ndarray]) -> Hashable:
    """Requests can share a batch only if every input agrees on dtype and on the
    shape after the batch dimension."""
    return tuple(sorted((name, arr.dtype.str, arr.shape[1:]) for name, arr in inputs.items()))


def merge(parts: Sequence[Mapping[str, np.ndarray]]) -> Tensors:
    """Stack per-request inputs along the batch dimension."""
    if len(parts) == 1:
        return dict(parts[0])
    return {name: np.concatenate([p[name] for p in parts], axis=0) for name in parts[0]}


def split(outputs: Mapping[str, np.ndarray], rows: Sequence[int]) -> list[Tensors]:
    """Cut batch outputs back into per-request pieces; ValueError if an output
    is not batch-major (its leading dimension is not the total row count)."""
    total = sum(rows)
    for name, arr in outputs.items():
        if arr.ndim == 0 or arr.shape[0] != total:
            raise ValueError(f"output '{name}' has shape {list(arr.shape)}, not {total} rows: not batch-major")
    bounds = np.cumsum([0, *rows])
    return [{name: arr[bounds[i] : bounds[i + 1]] for name, arr in outputs.items()} for i in range(len(rows))]


def bucket_for(rows: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds `rows` (rows itself when none does)."""
    return next((b for b in sorted(buckets) if b >= rows), rows)


def pad_rows(inputs: Mapping[str, np.ndarray], target: int) -> Tensors:
    """Append zero rows up to `target` so the runtime only ever sees bucket
    shapes (MIGraphX compiles a program per input shape)."""
    padded = {}
    for name, arr in inputs.items():
        extra = target - arr.shape[0]
        filler = np.zeros((extra, *arr.shape[1:]), dtype=arr.dtype)
        if arr.dtype == object:
            filler[...] = ""
        padded[name] = np.concatenate([arr, filler], axis=0) if extra > 0 else arr
    return padded


class DynamicBatcher:
    """Queue + dispatcher for one loaded model version."""

    def __init__(
        self,
        run: RunFn | Sequence[RunFn],
        *,
        max_batch_size: int,
        max_delay_s: float,
        max_queue: int,
        workers: int = 1,
        batchable: bool = True,
        observer: BatchObserver | None = None,
        name: str = "model",
        buckets: Sequence[int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # One lane per model instance, each with its own `workers` threads.
        runners = [run] if callable(run) else list(run)
        self._lanes = [
            _Lane(runner, ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"infer-{name}-{i}"), workers)
            for i, runner in enumerate(runners)
        ]
        self._buckets = sorted(buckets) if buckets and batchable else None
        self._max_batch = max_batch_size if batchable else 1
        self._max_delay = max_delay_s
        self._max_queue = max_queue
        self._observer = observer or NullObserver()
        self._name = name
        self._clock = clock
        self._queue: deque[_Request] = deque()
        self._rows_by_key: dict[Hashable, int] = defaultdict(int)
        self._wakeup = asyncio.Event()
        self._workers: list[asyncio.Task[None]] = []
        self._running: set[asyncio.Task[None]] = set()
        self._closing = False
        self._batch_seconds = 0.0  # moving average, for Retry-After and the regroup window
        # Rows whose batch finished and whose callers have not sent another request yet,
        # and until when the idle runtime waits for them (see `dispatch_delay`).
        self._returning = 0
        self._regroup_until = 0.0
        self._batches = 0  # batches run so far: the batch id in traces

    # ------------------------------------------------------------------ public

    def start(self) -> None:
        """Start the dispatcher task on the running loop."""
        if not self._workers:
            loop = asyncio.get_running_loop()
            self._workers = [loop.create_task(self._dispatch(), name=f"batcher-{self._name}")]

    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def closing(self) -> bool:
        return self._closing

    async def submit(self, inputs: Tensors, rows: int) -> Tensors:
        """Queue one request and wait for its outputs (its own rows only)."""
        if self._closing:
            raise ShuttingDown(f"model version {self._name} is shutting down")
        if len(self._queue) >= self._max_queue:
            raise QueueFull(
                f"inference queue is full ({self._max_queue} requests waiting); retry later",
                retry_after_s=self._retry_after(),
            )
        future: asyncio.Future[dict[str, np.ndarray]] = asyncio.get_running_loop().create_future()
        request = _Request(inputs, rows, batch_key(inputs), future, self._clock(), tracing.current())
        if request.trace is not None:
            tracing.mark_enqueued(request.trace)
        self._queue.append(request)
        self._rows_by_key[request.key] += rows
        self._returning = max(0, self._returning - rows)
        self._observer.queued(+1)
        self._wakeup.set()
        try:
            return await future
        except asyncio.CancelledError:
            self._withdraw(request)
            raise

    def _withdraw(self, request: _Request) -> None:
        """A caller gone before its batch formed (a client's deadline, a cancelled call) gives
        its place in the queue back at once, instead of holding it until the next batch forms."""
        try:
            self._queue.remove(request)
        except ValueError:
            return  # already taken into a batch
        self._rows_by_key[request.key] -= request.rows
        if self._rows_by_key[request.key] <= 0:
            del self._rows_by_key[request.key]
        self._observer.queued(-1)

    def flush(self) -> None:
        """Stop waiting for batches to fill: used while draining, when no more
        requests are coming to fill them."""
        self._max_delay = 0.0
        self._returning = 0
        self._wakeup.set()

    def stop_accepting(self) -> None:
        """New submits fail from now on; queued requests run without further delay."""
        self._closing = True
        self._wakeup.set()

    async def close(self, timeout: float) -> None:
        """Stop accepting, finish what is queued within `timeout`, fail the rest."""
        self.stop_accepting()
        if self._workers:
            done, pending = await asyncio.wait(self._workers, timeout=timeout)
            if pending:
                log.warning("drain of %s timed out after %.1fs", self._name, timeout)
                pending |= self._running
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
        while self._queue:
            request = self._queue.popleft()
            self._observer.queued(-1)
            if not request.future.done():
                request.future.set_exception(ShuttingDown())
        self._rows_by_key.clear()
        for lane in self._lanes:
            lane.executor.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ dispatcher

    async def _dispatch(self) -> None:
        """Hand batches to lanes as the policy says; return once closing has drained everything."""
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                if self._closing:
                    if self._running:
                        await asyncio.wait(set(self._running))
                    return
                await self._sleep(None)
                continue
            lane = min((lane for lane in self._lanes if not lane.full), key=_in_flight, default=None)
            if lane is None:  # every lane has a batch waiting: a finishing batch wakes us
                await self._sleep(None)
                continue
            head = self._queue[0]
            delay = dispatch_delay(
                now=self._clock(),
                queued_rows=self._rows_by_key[head.key],
                max_batch=self._max_batch,
                runtime_idle=lane.idle,
                returning_rows=self._returning,
                regroup_until=self._regroup_until,
                closing=self._closing,
            )
            if delay > 0:
                await self._sleep(None if delay == math.inf else delay)
                continue
            batch = self._take(head.key)
            if batch:
                lane.in_flight += 1
                task = loop.create_task(self._run_batch(batch, lane))
                self._running.add(task)
                task.add_done_callback(self._running.discard)

    async def _sleep(self, seconds: float | None) -> None:
        """Until something changes (a request, a finished batch, closing) or `seconds` pass."""
        self._wakeup.clear()
        if seconds is None:
            await self._wakeup.wait()
            return
        timer = asyncio.get_running_loop().call_later(seconds, self._wakeup.set)
        try:
            await self._wakeup.wait()
        finally:
            timer.cancel()

    async def _run_batch(self, batch: list[_Request], lane: _Lane) -> None:
        try:
            await self._execute(batch, lane.runner, lane.executor)
        except asyncio.CancelledError:
            self._fail(batch, ShuttingDown())
            raise
        except Exception as exc:  # never let one bad batch kill the dispatcher
            log.exception("batch of %s failed", self._name)
            self._fail(batch, exc)
        finally:
            lane.in_flight -= 1
            # Callers of batches whose regroup window has passed are not waited for any more
            # (they may never come back); this batch's callers are.
            now = self._clock()
            returning = self._returning if now < self._regroup_until else 0
            self._returning = min(self._max_batch, returning + sum(request.rows for request in batch))
            self._regroup_until = now + regroup_window(self._batch_seconds, self._max_delay)
            self._wakeup.set()

    def _take(self, key: Hashable) -> list[_Request]:
        """Pop queued requests of `key` in FIFO order while they fit the batch;
        drop requests whose handler was cancelled while they waited."""
        batch: list[_Request] = []
        keep: deque[_Request] = deque()
        rows = 0
        full = False
        now = self._clock()
        for request in self._queue:
            if request.key != key or full:
                keep.append(request)
                continue
            if batch and rows + request.rows > self._max_batch:
                full = True
                keep.append(request)
                continue
            self._rows_by_key[key] -= request.rows
            self._observer.queued(-1)
            if request.future.done():  # its handler was cancelled meanwhile
                continue
            self._observer.queue_wait(now - request.enqueued)
            if request.trace is not None:
                tracing.mark_taken(request.trace)
            batch.append(request)
            rows += request.rows
        self._queue = keep
        if self._rows_by_key.get(key) == 0:
            del self._rows_by_key[key]
        return batch

    async def _execute(self, batch: list[_Request], runner: RunFn, executor: ThreadPoolExecutor) -> None:
        rows = [r.rows for r in batch]
        loop = asyncio.get_running_loop()
        inputs = merge([r.inputs for r in batch])
        total = sum(rows)
        inputs, padded = self._padded(inputs, total)
        started = self._clock()
        traces = [r.trace for r in batch if r.trace is not None]
        started_ns = time.time_ns() if traces else 0
        try:
            outputs = await loop.run_in_executor(executor, runner, inputs)
            ended_ns = time.time_ns() if traces else 0
            outputs = _unpadded(outputs, total, padded)
            parts = split(outputs, rows) if len(batch) > 1 else [outputs]
        except ValueError as exc:
            if len(batch) == 1:
                raise
            log.warning("%s: %s; no longer merging requests", self._name, exc)
            self._max_batch = 1
            await self._execute_each(batch, runner, executor)
            return
        except Exception:
            if len(batch) == 1:
                raise
            # One bad request must not fail its neighbours: rerun them one by one.
            await self._execute_each(batch, runner, executor)
            return
        elapsed = self._clock() - started
        self._batches += 1
        if traces:
            batch_id = f"{self._name}-{self._batches}"
            tracing.record_batch(traces, batch_id, total, padded, started_ns, ended_ns)
        self._observer.batch(sum(rows), elapsed)
        self._batch_seconds = 0.8 * self._batch_seconds + 0.2 * elapsed if self._batch_seconds else elapsed
        _resolve(batch, parts)

    def _padded(self, inputs: Tensors, total: int) -> tuple[Tensors, int]:
        """`inputs` of `total` rows padded to the smallest bucket that holds them (as they are
        without buckets), and the rows they now have."""
        padded = bucket_for(total, self._buckets) if self._buckets else total
        if padded > total:
            inputs = pad_rows(inputs, padded)
        return inputs, padded

    async def _execute_each(self, batch: list[_Request], runner: RunFn, executor: ThreadPoolExecutor) -> None:
        for request in batch:
            try:
                await self._execute([request], runner, executor)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._fail([request], exc)

    @staticmethod
    def _fail(batch: list[_Request], exc: BaseException) -> None:
        for request in batch:
            if not request.future.done():
                request.future.set_exception(exc)

    def _retry_after(self) -> int:
        """Seconds until the current queue has likely drained."""
        batches = len(self._queue) / max(1, self._max_batch)
        return min(30, max(1, math.ceil(batches * self._batch_seconds)))


def _unpadded(outputs: Tensors, total: int, padded: int) -> Tensors:
    """`outputs` of a batch padded to `padded` rows, cut back to its `total` real rows."""
    if padded > total:
        return {k: v[:total] if v.ndim and v.shape[0] == padded else v for k, v in outputs.items()}
    return outputs


def _resolve(batch: list[_Request], parts: list[Tensors]) -> None:
    """Each request its part of the answer, unless it has already ended."""
    for request, part in zip(batch, parts, strict=True):
        if not request.future.done():
            request.future.set_result(part)


def _in_flight(lane: _Lane) -> int:
    return lane.in_flight
