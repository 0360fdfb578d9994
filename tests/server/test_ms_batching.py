"""Dynamic batching on a recording fake backend (no HTTP, no runtime)."""

from __future__ import annotations

import asyncio
import math
import threading
import time

import numpy as np
import pytest

from model_server.batching import DynamicBatcher, batch_key, dispatch_delay, merge, regroup_window, split
from model_server.errors import BackendInputError, QueueFull, ShuttingDown


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """y = 2x + row index within the batch (so a wrong split is visible), and
    remembers the row count of every call. Each call takes `seconds` of a fake clock
    (or, without one, really sleeps them)."""

    def __init__(self, gate: threading.Event | None = None, clock: FakeClock | None = None, seconds: float = 0.0):
        self.calls: list[int] = []
        self.gate = gate
        self.clock, self.seconds = clock, seconds

    def __call__(self, inputs):
        if self.gate is not None:
            self.gate.wait(5)
        if self.clock is not None:
            self.clock.now += self.seconds
        elif self.seconds:
            time.sleep(self.seconds)
        x = inputs["x"]
        self.calls.append(x.shape[0])
        return {"y": x * 2, "rows": np.full(x.shape[0], x.shape[0])}


class Observer:
    def __init__(self) -> None:
        self.depth = 0
        self.batches: list[int] = []
        self.waits = 0

    def queued(self, delta):
        self.depth += delta

    def queue_wait(self, seconds):
        self.waits += 1

    def batch(self, rows, compute_seconds):
        self.batches.append(rows)


def rows(value: float, n: int = 1, width: int = 3) -> dict[str, np.ndarray]:
    return {"x": np.full((n, width), value, np.float32)}


async def settle(condition, turns: int = 200) -> bool:
    """Let the loop run until `condition()` holds (a bounded number of turns, no clock)."""
    for _ in range(turns):
        await asyncio.sleep(0)
        if condition():
            return True
    return False


def test_merge_and_split_are_inverse():
    parts = [rows(1, 2), rows(2, 1), rows(3, 3)]
    merged = merge(parts)
    assert merged["x"].shape == (6, 3)
    back = split({"x": merged["x"]}, [2, 1, 3])
    for original, piece in zip(parts, back, strict=True):
        np.testing.assert_array_equal(original["x"], piece["x"])
    with pytest.raises(ValueError, match="not batch-major"):
        split({"x": np.zeros(5)}, [2, 1, 3])


def test_batch_key_separates_incompatible_shapes_and_dtypes():
    assert batch_key(rows(1, 2)) == batch_key(rows(5, 7))
    assert batch_key(rows(1, 1, width=3)) != batch_key(rows(1, 1, width=4))
    assert batch_key({"x": np.zeros((1, 3), np.float64)}) != batch_key(rows(1))


async def test_concurrent_requests_share_one_call_and_get_their_own_rows():
    run, obs = Recorder(), Observer()
    batcher = DynamicBatcher(run, max_batch_size=8, max_delay_s=1.0, max_queue=64, observer=obs)
    batcher.start()
    results = await asyncio.gather(*(batcher.submit(rows(i, 2), 2) for i in range(4)))
    await batcher.close(1)
    assert run.calls == [8]  # filled to max_batch_size, so no need to wait for the delay
    assert obs.batches == [8] and obs.waits == 4 and obs.depth == 0
    for i, out in enumerate(results):
        np.testing.assert_array_equal(out["y"], np.full((2, 3), 2 * i))
        assert out["rows"].tolist() == [8, 8]


async def test_max_batch_size_is_respected_and_fifo_kept():
    run = Recorder()
    batcher = DynamicBatcher(run, max_batch_size=4, max_delay_s=0.05, max_queue=64)
    batcher.start()
    results = await asyncio.gather(*(batcher.submit(rows(i, 3), 3) for i in range(3)))
    await batcher.close(1)
    assert all(c <= 4 for c in run.calls) and sum(run.calls) == 9
    assert [float(r["y"][0, 0]) for r in results] == [0.0, 2.0, 4.0]


async def test_incompatible_shapes_never_share_a_batch():
    seen: list[set[int]] = []

    def run(inputs):
        seen.append({inputs["x"].shape[1]})
        return {"y": inputs["x"] + 1}

    batcher = DynamicBatcher(run, max_batch_size=16, max_delay_s=0.05, max_queue=64)
    batcher.start()
    jobs = [batcher.submit(rows(i, 1, width=3 if i % 2 else 5), 1) for i in range(6)]
    results = await asyncio.gather(*jobs)
    await batcher.close(1)
    assert sorted(len(s) for s in seen) == [1] * len(seen)  # one width per call
    assert len(seen) == 2
    for i, out in enumerate(results):
        assert out["y"].shape == (1, 3 if i % 2 else 5)


async def test_full_queue_raises_queue_full_with_retry_after():
    gate = threading.Event()
    batcher = DynamicBatcher(Recorder(gate), max_batch_size=1, max_delay_s=0, max_queue=2)
    batcher.start()
    first = asyncio.ensure_future(batcher.submit(rows(0), 1))
    await asyncio.sleep(0.05)  # taken by the worker, blocked in the backend
    queued = [asyncio.ensure_future(batcher.submit(rows(i), 1)) for i in (1, 2)]
    await asyncio.sleep(0)
    with pytest.raises(QueueFull) as info:
        await batcher.submit(rows(9), 1)
    assert info.value.retry_after_s >= 1
    gate.set()
    done = await asyncio.gather(first, *queued)
    assert [float(d["y"][0, 0]) for d in done] == [0.0, 2.0, 4.0]
    await batcher.close(1)


async def test_close_flushes_the_queue_then_rejects():
    gate = threading.Event()
    run = Recorder(gate)
    batcher = DynamicBatcher(run, max_batch_size=64, max_delay_s=10.0, max_queue=64)
    batcher.start()
    busy = asyncio.ensure_future(batcher.submit(rows(9), 1))
    assert await settle(lambda: batcher.depth == 0)  # the runtime is now busy with it
    pending = [asyncio.ensure_future(batcher.submit(rows(i), 1)) for i in range(5)]
    await asyncio.sleep(0.02)
    assert batcher.depth == 5  # forming behind the busy runtime, for up to 10 s
    closing = asyncio.ensure_future(batcher.close(5))
    assert await settle(lambda: batcher.depth == 0)  # dispatched at once, no delay left
    gate.set()
    await closing
    results = await asyncio.gather(*pending)
    assert run.calls == [1, 5] and float((await busy)["y"][0, 0]) == 18
    assert [float(r["y"][0, 0]) for r in results] == [0, 2, 4, 6, 8]
    with pytest.raises(ShuttingDown):
        await batcher.submit(rows(1), 1)


async def test_drain_timeout_fails_what_cannot_finish():
    gate = threading.Event()
    batcher = DynamicBatcher(Recorder(gate), max_batch_size=1, max_delay_s=0, max_queue=8)
    batcher.start()
    stuck = [asyncio.ensure_future(batcher.submit(rows(i), 1)) for i in range(3)]
    await asyncio.sleep(0.05)
    await batcher.close(0.1)
    gate.set()
    outcomes = await asyncio.gather(*stuck, return_exceptions=True)
    assert all(isinstance(o, ShuttingDown) for o in outcomes)


async def test_a_bad_request_does_not_fail_its_batch_neighbours():
    def run(inputs):
        x = inputs["x"]
        if np.any(x < 0):
            raise BackendInputError("negative input")
        return {"y": x + 1}

    batcher = DynamicBatcher(run, max_batch_size=8, max_delay_s=0.2, max_queue=8)
    batcher.start()
    outcomes = await asyncio.gather(*(batcher.submit(rows(v), 1) for v in (1, -1, 2)), return_exceptions=True)
    await batcher.close(1)
    assert float(outcomes[0]["y"][0, 0]) == 2.0 and float(outcomes[2]["y"][0, 0]) == 3.0
    assert isinstance(outcomes[1], BackendInputError)


async def test_output_without_batch_dim_falls_back_to_single_requests():
    calls = []

    def run(inputs):
        calls.append(inputs["x"].shape[0])
        return {"total": np.asarray(inputs["x"].sum())}

    batcher = DynamicBatcher(run, max_batch_size=8, max_delay_s=0.1, max_queue=8)
    batcher.start()
    outs = await asyncio.gather(*(batcher.submit(rows(v), 1) for v in (1, 2)))
    later = await batcher.submit(rows(5), 1)
    await batcher.close(1)
    assert [float(o["total"]) for o in outs] == [3.0, 6.0]
    assert float(later["total"]) == 15.0
    assert calls[0] == 2 and calls[1:] == [1, 1, 1]


async def test_cancelled_request_is_dropped_before_running():
    run = Recorder()
    batcher = DynamicBatcher(run, max_batch_size=8, max_delay_s=0.1, max_queue=8)
    batcher.start()
    gone = asyncio.ensure_future(batcher.submit(rows(1), 1))
    kept = asyncio.ensure_future(batcher.submit(rows(2), 1))
    await asyncio.sleep(0)
    gone.cancel()
    out = await kept
    await batcher.close(1)
    assert run.calls == [1] and float(out["y"][0, 0]) == 4.0


async def test_flush_stops_waiting_for_company():
    clock = FakeClock()
    gate = threading.Event()
    run = Recorder(gate, clock=clock, seconds=10.0)
    batcher = DynamicBatcher(run, max_batch_size=64, max_delay_s=30.0, max_queue=64, clock=clock)
    batcher.start()
    first = asyncio.ensure_future(batcher.submit(rows(1), 1))
    assert await settle(lambda: batcher.depth == 0)
    behind = [asyncio.ensure_future(batcher.submit(rows(i), 1)) for i in (2, 3)]
    gate.set()
    await asyncio.wait_for(first, 5)
    # The first caller has not come back: the idle runtime waits for it (5 s of the fake clock).
    assert not await settle(lambda: batcher.depth == 0, turns=50)
    batcher.flush()  # draining: nobody else is coming
    await asyncio.wait_for(asyncio.gather(*behind), 5)
    assert run.calls == [1, 2]
    await batcher.close(1)


async def test_batches_are_padded_to_buckets_and_padding_is_dropped():
    run, obs = Recorder(), Observer()
    batcher = DynamicBatcher(run, max_batch_size=8, max_delay_s=0.2, max_queue=8, observer=obs, buckets=[1, 2, 4, 8])
    batcher.start()
    results = await asyncio.gather(*(batcher.submit(rows(i), 1) for i in (1, 2, 3)))
    single = await batcher.submit(rows(7, 2), 2)
    await batcher.close(1)
    assert run.calls == [4, 2]  # 3 rows ran as a bucket of 4, 2 rows as 2
    assert obs.batches == [3, 2]  # metrics count real rows, not padding
    assert [r["y"].shape for r in results] == [(1, 3)] * 3
    assert [float(r["y"][0, 0]) for r in results] == [2.0, 4.0, 6.0]
    assert single["y"].shape == (2, 3) and single["rows"].tolist() == [2, 2]


# --------------------------------------------------------------------------- adaptive policy


def test_policy_idle_runtime_dispatches_at_once_when_nobody_is_due_back():
    for rows_queued in (1, 3, 15):
        assert dispatch_delay(now=0.0, queued_rows=rows_queued, max_batch=16, runtime_idle=True) == 0.0


def test_policy_busy_runtime_batch_keeps_forming_until_it_frees():
    wait = dict(queued_rows=3, max_batch=16, runtime_idle=False)
    # Leaving early cannot make it start sooner, however long the batch has been forming.
    assert dispatch_delay(now=10.002, **wait) == math.inf
    assert dispatch_delay(now=10.9, **wait) == math.inf
    assert dispatch_delay(now=10.0, **wait, closing=True) == 0.0


def test_policy_full_batch_never_waits():
    assert dispatch_delay(now=0, queued_rows=16, max_batch=16, runtime_idle=False) == 0.0
    assert dispatch_delay(now=0, queued_rows=15, max_batch=16, runtime_idle=False) == math.inf
    full = dict(queued_rows=16, max_batch=16, runtime_idle=True, returning_rows=8, regroup_until=5)
    assert dispatch_delay(now=0, **full) == 0.0


def test_policy_idle_runtime_waits_only_for_the_callers_of_the_batch_that_just_finished():
    regroup = dict(queued_rows=4, max_batch=16, runtime_idle=True, regroup_until=10.005)
    assert dispatch_delay(now=10.001, returning_rows=12, **regroup) == pytest.approx(0.004)
    assert dispatch_delay(now=10.006, returning_rows=12, **regroup) == 0.0
    # Everyone came back (a lone client's next request, too): nothing to wait for.
    assert dispatch_delay(now=10.001, returning_rows=0, **regroup) == 0.0
    assert dispatch_delay(now=10.001, returning_rows=12, closing=True, **regroup) == 0.0


def test_regroup_window_is_half_a_batch_and_never_beyond_max_delay():
    assert regroup_window(batch_seconds=0.004, max_delay=0.005) == pytest.approx(0.002)  # a big model
    assert regroup_window(batch_seconds=0.0002, max_delay=0.005) == pytest.approx(0.0001)  # a tiny one
    assert regroup_window(batch_seconds=0.5, max_delay=0.005) == 0.005
    assert regroup_window(batch_seconds=0.5, max_delay=0.0) == 0.0


async def test_behind_a_busy_runtime_only_a_full_batch_is_queued_ahead():
    gate = threading.Event()
    run = Recorder(gate)
    batcher = DynamicBatcher(run, max_batch_size=4, max_delay_s=0.005, max_queue=64)
    batcher.start()
    busy = asyncio.ensure_future(batcher.submit(rows(0), 1))
    assert await settle(lambda: batcher.depth == 0)
    early = [asyncio.ensure_future(batcher.submit(rows(i), 1)) for i in (1, 2)]
    await asyncio.sleep(0.05)  # ten times max_delay: still forming, the runtime is busy
    assert batcher.depth == 2
    late = [asyncio.ensure_future(batcher.submit(rows(i), 1)) for i in (3, 4)]
    assert await settle(lambda: batcher.depth == 0)  # full: queued behind the running batch
    last = asyncio.ensure_future(batcher.submit(rows(5), 1))
    assert not await settle(lambda: batcher.depth == 0, turns=50)  # one batch waits per thread, no more
    gate.set()
    await asyncio.wait_for(asyncio.gather(busy, *early, *late, last), 30)
    await batcher.close(1)
    assert run.calls == [1, 4, 1]


async def test_closed_loop_clients_keep_meeting_in_one_full_batch():
    """Eight clients, each sending its next request a moment after its answer (as over
    HTTP, one after another): the idle runtime waits for them instead of taking the
    first one back alone and letting the rest form behind it."""
    run, obs = Recorder(seconds=0.1), Observer()  # a 100 ms batch: a 50 ms regroup window
    batcher = DynamicBatcher(run, max_batch_size=8, max_delay_s=1.0, max_queue=64, observer=obs)
    batcher.start()

    async def client(i: int) -> None:
        for _ in range(5):
            await batcher.submit(rows(i), 1)
            await asyncio.sleep(0.0005 * i)  # the round trip: 0 to 3.5 ms

    await asyncio.wait_for(asyncio.gather(*(client(i) for i in range(8))), 30)
    await batcher.close(1)
    assert obs.batches == [8] * 5


async def test_callers_that_do_not_come_back_hold_a_batch_only_half_a_batch_time():
    run = Recorder(seconds=0.04)
    batcher = DynamicBatcher(run, max_batch_size=8, max_delay_s=10.0, max_queue=64)
    batcher.start()
    first = asyncio.ensure_future(batcher.submit(rows(1), 1))
    assert await settle(lambda: batcher.depth == 0)
    behind = [asyncio.ensure_future(batcher.submit(rows(i), 1)) for i in (2, 3)]
    await first  # its caller never sends again (open-loop traffic)
    # Half a 40 ms batch of waiting plus the batch: done long before max_delay (10 s) would be.
    await asyncio.wait_for(asyncio.gather(*behind), 5)
    assert run.calls == [1, 2]
    await batcher.close(1)


async def test_callers_that_left_long_ago_do_not_make_a_later_lone_client_wait():
    clock = FakeClock()
    run = Recorder(clock=clock, seconds=1.0)  # a 0.5 s regroup window on the fake clock
    batcher = DynamicBatcher(run, max_batch_size=8, max_delay_s=3600, max_queue=64, clock=clock)
    batcher.start()
    await asyncio.wait_for(asyncio.gather(*(batcher.submit(rows(i), 1) for i in range(8))), 5)
    clock.now += 60  # the burst's callers are gone; a lone client comes
    for i in range(3):
        await asyncio.wait_for(batcher.submit(rows(i), 1), 5)  # each at once, not after an hour
    assert run.calls == [8, 1, 1, 1]
    await batcher.close(1)


async def test_instances_each_take_a_request_when_idle():
    gates = [threading.Event(), threading.Event()]
    runs = [Recorder(gates[0]), Recorder(gates[1])]
    batcher = DynamicBatcher(runs, max_batch_size=16, max_delay_s=3600, max_queue=64, clock=FakeClock())
    batcher.start()
    first = asyncio.ensure_future(batcher.submit(rows(1), 1))
    assert await settle(lambda: batcher.depth == 0)
    second = asyncio.ensure_future(batcher.submit(rows(2), 1))
    assert await settle(lambda: batcher.depth == 0)  # the second instance was idle
    for gate in gates:
        gate.set()
    await asyncio.wait_for(asyncio.gather(first, second), 30)
    await batcher.close(1)
    assert runs[0].calls == [1] and runs[1].calls == [1]
