"""Large bodies: parse memory bounded by a budget sized from the pod's memory, and
the event loop free while a large body is decoded (a real server process)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bounded_http.budgets import AnswerBudget, MemoryBudget, ReadBudget
from bounded_http.limits import detect_memory_limit
from model_server.bodies import BodyDecoder, RequestBody, estimate_parse_bytes
from model_server.errors import Busy, PayloadTooLarge
from model_server.settings import ServerSettings
from testsupport import payloads
from testsupport.liveness import post_and_watch_liveness
from testsupport.onnx_models import affine_model
from testsupport.payloads import MiB, memory, reset_peak
from testsupport.processes import free_port, running, serve_command

WIDTH = 1024  # model input width: the answer (one value per row) is tiny next to the body


def v2_body(item: bytes, size: int) -> bytes:
    return payloads.v2_body(item, size, WIDTH)


def nested_body(item: bytes, size: int) -> bytes:
    return payloads.nested_body(item, size, WIDTH)


def lists_body(size: int) -> bytes:
    return payloads.lists_body(size, WIDTH)


class ServerProcess:
    def __init__(self, url: str, process: subprocess.Popen) -> None:
        self.url = url
        self.process = process
        self.port = int(url.rsplit(":", 1)[1])


@contextlib.contextmanager
def serve(repo: Path, *flags: str) -> Iterator[ServerProcess]:
    """`python -m model_server serve` on a free loopback port, until ready."""
    port = free_port()
    args = ["--model-name", "tiny", "--no-watch", "--max-delay-ms", "0", "--intra-op-threads", "1"]
    args += ["--log-level", "warning", *flags]
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with running(serve_command(repo, port, *args), env=env, ready_url=f"{url}/health/ready") as process:
        yield ServerProcess(url, process)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bodies") / "repo"
    affine_model(path / "1" / "model.onnx", np.ones((WIDTH, 1), np.float32), np.zeros(1, np.float32))
    return path


POD_2GI = ("--memory-limit-bytes", str(2048 * MiB))  # the mnist-cpu example's limit


@pytest.fixture(scope="module")
def server(repo) -> Iterator[ServerProcess]:
    with serve(repo, *POD_2GI) as running:
        yield running


def growth_for(server: ServerProcess, *bodies: bytes, path: str = "/v2/models/tiny/infer") -> tuple[list[int], int]:
    """POST the bodies at once; their statuses and the peak resident growth they caused."""
    before = memory(server.process.pid, "VmRSS")
    reset_peak(server.process.pid)

    async def post_all() -> list[int]:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            answers = await asyncio.gather(
                *(client.post(path, content=b, headers={"content-type": "application/json"}) for b in bodies)
            )
        return [a.status_code for a in answers]

    statuses = asyncio.run(post_all())
    return statuses, memory(server.process.pid, "VmHWM") - before


def test_liveness_answers_while_a_large_body_is_parsed(server):
    body = v2_body(b"1,", 16 * MiB)
    status, elapsed, answers = post_and_watch_liveness(server.port, body, timeout=120)
    assert status == 200
    # The longest stretch after the body arrived without a liveness answer: when the
    # parse ran on the event loop, it was nearly all of the request's time.
    marks = [0.0, *answers, elapsed]
    longest = max(b - a for a, b in zip(marks, marks[1:], strict=False))
    print(f"request {elapsed:.2f}s, {len(answers)} liveness answers, longest silence {longest:.2f}s")
    assert len(answers) >= 3
    assert longest < 0.75 * elapsed


@pytest.mark.slow
@pytest.mark.parametrize(
    "body",
    [
        v2_body(b"0.1234567,", 16 * MiB),
        v2_body(b"1,", 16 * MiB),
        nested_body(b"-12345.5e-3", 16 * MiB),
    ],
    ids=["floats", "small-ints", "nested-rows"],
)
def test_peak_memory_of_a_large_body_stays_within_its_estimate(repo, body):
    with serve(repo, *POD_2GI) as server:
        statuses, growth = growth_for(server, body)
    estimate = estimate_parse_bytes(body)
    print(
        f"body {len(body) / MiB:.0f} MiB: peak growth {growth / MiB:.0f} MiB ({growth / len(body):.1f}x), "
        f"estimate {estimate / MiB:.0f} MiB ({estimate / len(body):.1f}x)"
    )
    assert statuses == [200]
    assert growth <= estimate


def test_body_whose_parse_would_exceed_the_budget_is_413_before_parsing(server):
    body = lists_body(16 * MiB)  # 5.6 M empty lists: ~30x its size as Python objects
    with httpx.Client(base_url=server.url, timeout=60) as client:
        r = client.post("/v2/models/tiny/infer", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text[:200]
    assert "parse budget" in r.json()["error"]
    statuses, growth = growth_for(server, body)
    assert statuses == [413]
    assert growth < 3 * len(body)


@pytest.mark.slow
def test_concurrent_large_bodies_take_turns_within_the_budget(repo):
    body = v2_body(b"0.1234567,", 8 * MiB)
    estimate = estimate_parse_bytes(body)
    budget = estimate + estimate // 2  # room for one parse at a time
    with serve(repo, "--parse-memory-bytes", str(budget), "--max-body-bytes", str(16 * MiB)) as server:
        statuses, growth = growth_for(server, *[body] * 4)
    print(f"4 x {len(body) / MiB:.0f} MiB at once: peak growth {growth / MiB:.0f} MiB, budget {budget / MiB:.0f} MiB")
    assert statuses == [200] * 4
    # One parse at a time plus the bodies waiting for their turn, never four parses.
    assert growth <= estimate + 3 * len(body) + 32 * MiB
    assert growth < 2 * estimate


# --------------------------------------------------------------------------- units


def test_estimate_is_a_small_multiple_for_numbers_and_large_for_containers():
    floats = v2_body(b"0.1234567,", 4 * MiB)
    ints = v2_body(b"1,", 4 * MiB)
    lists = lists_body(4 * MiB)
    assert 2 * len(floats) < estimate_parse_bytes(floats) <= 10 * len(floats)
    assert estimate_parse_bytes(ints) <= 40 * len(ints)
    assert estimate_parse_bytes(lists) > 60 * len(lists)
    # String text may widen to 4 bytes a character once one character needs it.
    text = b'{"s": "' + b"a" * MiB + b'"}'
    assert estimate_parse_bytes(text.replace(b'"}', b'\\ud83d\\ude00"}')) > 3 * estimate_parse_bytes(text) / 2


@pytest.mark.parametrize(
    ("limit", "budget", "max_body"),
    [(2048 * MiB, 819 * MiB, 64 * MiB), (512 * MiB, 204 * MiB, 20 * MiB), (64 * MiB, 25 * MiB, 2 * MiB)],
)
def test_limits_are_sized_from_the_memory_limit(tmp_path, limit, budget, max_body):
    settings = ServerSettings(model=tmp_path, memory_limit_bytes=limit)
    assert settings.parse_memory_bytes >> 20 == budget >> 20
    assert settings.max_body_bytes >> 20 == max_body >> 20
    explicit = ServerSettings(model=tmp_path, memory_limit_bytes=limit, max_body_bytes=4096, parse_memory_bytes=1 << 30)
    assert (explicit.max_body_bytes, explicit.parse_memory_bytes) == (4096, 1 << 30)


def test_memory_limit_comes_from_the_cgroup_else_the_machine(tmp_path):
    v2, v1 = tmp_path / "memory.max", tmp_path / "limit_in_bytes"
    v2.write_text("max\n")
    v1.write_text(f"{3 * MiB}\n")
    assert detect_memory_limit([str(v2), str(v1)]) == 3 * MiB
    v2.write_text(f"{5 * MiB}\n")
    assert detect_memory_limit([str(v2), str(v1)]) == 5 * MiB
    machine = detect_memory_limit([str(tmp_path / "absent")])
    assert machine > 64 * MiB and detect_memory_limit([]) == machine


async def test_budget_is_first_come_first_served_and_waits_are_bounded():
    budget = MemoryBudget(100)
    await budget.acquire(60, timeout=1)
    order: list[str] = []

    async def take(name: str, size: int) -> None:
        await budget.acquire(size, timeout=5)
        order.append(name)

    large = asyncio.create_task(take("large", 80))
    await asyncio.sleep(0.01)
    small = asyncio.create_task(take("small", 10))  # would fit now, but the large one came first
    await asyncio.sleep(0.01)
    assert order == [] and budget.free == 40
    budget.release(60)
    await asyncio.gather(large, small)
    assert order == ["large", "small"] and budget.free == 10
    with pytest.raises(Busy):
        await budget.acquire(20, timeout=0.05)
    assert budget.free == 10 and not budget._waiters  # the timed-out wait left nothing behind
    with pytest.raises(ValueError):
        await budget.acquire(101, timeout=1)
    budget.release(90)
    assert budget.free == 100


def interleaved(count: int, size: int, chunk: int) -> list[RequestBody]:
    """`count` bodies of `size` bytes whose chunks arrive in turns, as concurrent uploads do."""

    def body() -> RequestBody:
        async def chunks():
            for start in range(0, size, chunk):
                await asyncio.sleep(0)  # the other uploads' chunks arrive meanwhile
                yield b"1" * min(chunk, size - start)

        async def read() -> bytes:
            raise AssertionError("large bodies are read chunk by chunk")

        return RequestBody(size, read, chunks)

    return [body() for _ in range(count)]


async def test_bodies_arriving_in_turns_never_hold_each_other_up():
    """Four 8 MiB uploads into a 29 MiB read budget, a chunk each in turn: taken as they came,
    they held 7 MiB each, all waited for the rest, and all got 503 after the wait (CI saw
    exactly that under load). Now a chunk is granted only while some upload can still
    finish, so all four are decoded, the budget whole again after."""
    decoder = BodyDecoder(parse_bytes=116 * MiB, max_body_bytes=16 * MiB, wait_s=2.0)
    try:
        assert decoder.buffer.total == 29 * MiB
        bodies = interleaved(4, 8 * MiB, 64 * 1024)
        sizes = await asyncio.gather(*(decoder.decode(b, len, estimate=len) for b in bodies))
        assert sizes == [8 * MiB] * 4
        await asyncio.sleep(0.05)  # the parse threads hand the budgets back on the loop
        assert decoder.buffer.free == decoder.buffer.total and decoder.parse.free == decoder.parse.total
    finally:
        decoder.close()


async def test_read_budget_grants_only_safe_chunks_and_headers_alone_hold_nothing():
    budget = ReadBudget(100)
    idle = [budget.open(100) for _ in range(5)]  # announced the whole budget, sent nothing
    a, b = budget.open(60), budget.open(60)
    await budget.take(a, 50, timeout=1)
    await budget.take(b, 40, timeout=1)  # a can still finish: 10 left is a's need
    with pytest.raises(Busy):  # 1 more to b and neither a (10) nor b (19) could finish
        await budget.take(b, 1, timeout=0.05)
    assert budget.free == 10 and not budget._waiters
    waiting = asyncio.create_task(budget.take(b, 20, timeout=2))
    await budget.take(a, 10, timeout=1)  # a's last bytes: always safe
    await asyncio.sleep(0)
    assert not waiting.done()
    budget.close(a)  # a parsed and done: b may have the rest
    await waiting
    assert budget.free == 40
    with pytest.raises(PayloadTooLarge):
        await budget.take(b, 1, timeout=1)
    budget.close(b)
    for reader in idle:
        budget.close(reader)
    assert budget.free == 100 and not budget._readers


async def test_answers_are_held_in_the_read_budget_only_where_every_body_can_still_finish():
    budget = ReadBudget(100)
    upload = budget.open(60)
    await budget.take(upload, 20, timeout=1)  # 40 still to come
    assert budget.hold(30) and budget.free == 50
    assert not budget.hold(11)  # 39 left: the upload could not finish (an answer may never come back)
    assert budget.free == 50
    await budget.take(upload, 40, timeout=1)  # the upload's last bytes still fit
    budget.unhold(30)
    assert not budget.hold(101)  # never more than the whole
    waiting = asyncio.create_task(budget.take(budget.open(100), 90, timeout=2))
    await asyncio.sleep(0)
    assert not budget.hold(1)  # a waiting chunk goes first
    budget.close(upload)
    await waiting
    assert budget.free == 10


def test_one_client_holds_at_most_its_share_of_the_answers():
    answers = AnswerBudget(ReadBudget(100), share=0.5)
    assert answers.hold("10.0.0.1", 30) and not answers.spent("10.0.0.1")
    assert not answers.hold("10.0.0.1", 30)  # 60 over its 50
    assert answers.hold("10.0.0.1", 20) and answers.spent("10.0.0.1")
    assert answers.hold("10.0.0.2", 50)  # the other half is another client's
    assert answers.budget.free == 0 and not answers.hold("10.0.0.3", 1)
    answers.release("10.0.0.1", 50)
    assert not answers.spent("10.0.0.1") and answers.held == {"10.0.0.2": 50}
    answers.release("10.0.0.2", 50)
    assert answers.budget.free == 100 and not answers.held


def all_can_finish(readers: list[tuple[int, int]], free: int) -> bool:
    """The banker's check, as written first: sort every reader by need, each returns what it holds."""
    for need, held in sorted((claim - held, held) for claim, held in readers):
        if need > free:
            return False
        free += held
    return True


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 9), st.integers(1, 70)), max_size=60))
def test_read_budget_grants_exactly_what_the_whole_bankers_check_allows(steps: list[tuple[int, int, int]]) -> None:
    """The check that no longer sorts every reader answers as the one that did, for any sequence
    of readers opening, taking and closing."""
    budget = ReadBudget(100)
    open_readers: list[int] = []
    for action, pick, amount in steps:
        if action == 0 or not open_readers:
            open_readers.append(budget.open(amount))
            continue
        reader = open_readers[pick % len(open_readers)]
        if action == 2:
            budget.close(reader)
            open_readers.remove(reader)
            continue
        claim, held = budget._readers[reader]
        size = min(amount, claim - held)
        after = [(c, h + (size if r == reader else 0)) for r, (c, h) in budget._readers.items()]
        expected = budget.free >= size and all_can_finish(after, budget.free - size)
        assert budget._safe(reader, size) == expected
        if expected:
            budget._grant(reader, size)
    assert budget.free == 100 - sum(held for _, held in budget._readers.values())


async def test_a_release_checks_a_bounded_number_of_the_waiting_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """1,000 stalled uploads each waiting for a chunk: every event re-checked every waiter against
    every reader (sorted), 18 s of event loop in all, and /health/live went unanswered. A release
    now checks the waiters nearest to finishing until one must still wait."""
    budget = ReadBudget(100_000)
    readers = [budget.open(10_000) for _ in range(1_000)]
    for reader in readers:
        await budget.take(reader, 90, timeout=1)  # 90,000 held, each needs 9,910 more
    await budget.take(readers[0], 100, timeout=1)  # the one needing least can always go on
    waiting = [asyncio.create_task(budget.take(reader, 100, timeout=5)) for reader in readers[1:]]
    await asyncio.sleep(0)
    assert not any(task.done() for task in waiting) and len(budget._waiters) == 999
    checks = 0
    check = ReadBudget._safe

    def counted(self: ReadBudget, reader: int, size: int) -> bool:
        nonlocal checks
        checks += 1
        return check(self, reader, size)

    monkeypatch.setattr(ReadBudget, "_safe", counted)
    budget.close(readers[0])  # 190 bytes back: two waiting chunks can go on
    await asyncio.sleep(0)
    assert sum(task.done() for task in waiting) == 2 and len(budget._waiters) == 997
    assert checks <= 5, checks
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    assert not budget._waiters


@pytest.mark.parametrize("chunked", [False, True])
def test_connections_that_announce_a_body_and_send_none_hold_no_budget(tmp_path: Path, chunked: bool) -> None:
    """Four connections sending only headers with `Content-Length: 53687091` (or a chunked
    header) reserved the buffer budget before any byte arrived: real 200 kB requests got 503
    "busy parsing other large bodies" for as long as they were held. Now they hold nothing."""
    import socket
    import time

    from tests.server.helpers import make_settings, running_server

    path = affine_model(tmp_path / "repo" / "1" / "model.onnx", np.ones((4, 3), np.float32), np.zeros(3, np.float32))
    settings = make_settings(path.parent.parent, parse_memory_bytes=64 * MiB, max_body_bytes=60 * MiB)
    announce = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {53_687_091}"
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [12_000, 4], "data": [0.5] * 48_000}]}
    with running_server(settings) as server:
        host, port = server.url.removeprefix("http://").split(":")
        idle = []
        for _ in range(4):
            conn = socket.create_connection((host, int(port)))
            conn.sendall(
                f"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"{announce}\r\n\r\n".encode()
            )
            idle.append(conn)
        try:
            time.sleep(0.5)  # the server has read every header and is waiting for the bodies
            with httpx.Client(base_url=server.url, timeout=8) as client:
                answers = [client.post("/v2/models/tiny/infer", json=body) for _ in range(3)]
            assert [a.status_code for a in answers] == [200, 200, 200], answers[0].text[:200]
        finally:
            for conn in idle:
                conn.close()
