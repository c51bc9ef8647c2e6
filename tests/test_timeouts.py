"""durable_agents._timeouts: `asyncio.timeout` semantics, and one shared timer for all
of a loop's timeouts instead of one each (Pyodide never clears a cancelled timer, and
workerd allows 10,000 active ones; tests/runtime/test_timeouts.py runs it there)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from durable_agents._timeouts import timeout


class Timers:
    """A `schedule` for `timeout` that records each timer it sets and whether it was cleared."""

    def __init__(self) -> None:
        self.set = 0
        self.cleared = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, seconds: float, fire: Any) -> Any:
        self.set += 1
        handle = loop.call_later(seconds, fire)

        def cancel() -> None:
            self.cleared += 1
            handle.cancel()

        return cancel


async def test_a_block_past_its_time_is_cancelled_with_timeout_error() -> None:
    with pytest.raises(TimeoutError):
        async with timeout(0.05) as t:
            await asyncio.sleep(5)
    assert t.expired()


async def test_a_block_within_its_time_runs_to_the_end() -> None:
    async with timeout(5) as t:
        await asyncio.sleep(0.01)
        value = 7
    assert value == 7
    assert not t.expired()


async def test_none_is_no_limit_and_errors_pass_through() -> None:
    async with timeout(None) as t:
        await asyncio.sleep(0.01)
    assert not t.expired()
    with pytest.raises(KeyError):
        async with timeout(5):
            raise KeyError("mine")


async def test_a_shorter_timeout_inside_a_longer_one_fires_first() -> None:
    async with timeout(30) as outer:
        with pytest.raises(TimeoutError):
            async with timeout(0.05) as inner:
                await asyncio.sleep(5)
    assert inner.expired()
    assert not outer.expired()


async def test_timeouts_of_many_tasks_each_fire_on_time() -> None:
    async def slow(seconds: float) -> str:
        try:
            async with timeout(seconds):
                await asyncio.sleep(5)
        except TimeoutError:
            return "timed out"
        return "finished"

    loop = asyncio.get_running_loop()
    started = loop.time()
    outcomes = await asyncio.gather(*(slow(0.05 + i * 0.01) for i in range(20)))
    assert outcomes == ["timed out"] * 20
    assert loop.time() - started < 2


async def test_every_timer_is_cleared_when_its_block_ends() -> None:
    timers = Timers()
    for _ in range(1000):
        async with timeout(30, timers):
            await asyncio.sleep(0)
    with pytest.raises(TimeoutError):
        async with timeout(0.01, timers):
            await asyncio.sleep(1)
    with pytest.raises(KeyError):
        async with timeout(30, timers):
            raise KeyError("mine")
    assert timers.set == timers.cleared == 1002
