"""The suite's one wait: the first truthy answer, or a failure that names what never came."""

from __future__ import annotations

import itertools

import pytest

from testsupport.waiting import NeverHappened, eventually, eventually_async


def test_the_first_truthy_answer_is_returned() -> None:
    answers = iter([None, 0, "", "ready", "later"])
    assert eventually(lambda: next(answers), interval=0) == "ready"


def test_a_missing_event_fails_with_its_name_and_the_last_answer() -> None:
    with pytest.raises(NeverHappened, match=r"the replica did not hold within 0.05 s; last asked: 0"):
        eventually(lambda: 0, timeout=0.05, interval=0.01, what="the replica")


def test_ignored_errors_count_as_not_yet_and_others_fail_at_once() -> None:
    count = itertools.count()

    def flaky() -> int:
        n = next(count)
        if n < 3:
            raise ConnectionError("not listening yet")
        return n

    assert eventually(flaky, interval=0, ignore=(ConnectionError,)) == 3
    with pytest.raises(ValueError):
        eventually(lambda: int("x"), ignore=(ConnectionError,))
    with pytest.raises(NeverHappened, match="last error: ConnectionError"):
        eventually(
            lambda: flaky() and (_ for _ in ()).throw(ConnectionError()), timeout=0.05, ignore=(ConnectionError,)
        )


async def test_the_async_wait_takes_plain_and_coroutine_probes() -> None:
    answers = iter([False, False, 7])
    assert await eventually_async(lambda: next(answers), interval=0) == 7

    async def probe() -> str:
        return "up"

    assert await eventually_async(probe) == "up"
    with pytest.raises(NeverHappened, match="the slice"):
        await eventually_async(lambda: None, timeout=0.05, interval=0.01, what="the slice")
