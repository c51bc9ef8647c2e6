"""Timeouts inside workerd: Pyodide's loop never clears a cancelled timer and workerd
allows 10,000 active ones per isolate, so 12,000 `asyncio.timeout(30)` blocks in a
row would fail (`QuotaExceededError: You have exceeded the number of active timeouts
you may set`) and leave the isolate unable to set any for 30 s. The kit's own
`_timeouts.timeout` clears its timer when the block ends: the same 12,000 pass, and
timers still work after, in this request and the next (a timer belongs to the request
that set it). (The failing variant is not run: it would break every later test here.)"""

import asyncio

from durable_agents._timeouts import timeout


async def test_twelve_thousand_timeouts_leave_the_isolate_able_to_set_timers() -> None:
    for _ in range(12_000):
        async with timeout(30):
            await asyncio.sleep(0)
    async with timeout(0.05) as t:
        await asyncio.sleep(0.01)
    assert not t.expired()
    try:
        async with timeout(0.02):
            await asyncio.sleep(1)
    except TimeoutError:
        return
    raise AssertionError("the block should have timed out")


async def test_a_timeout_in_a_later_request_fires_on_time() -> None:
    for _ in range(3):
        try:
            async with timeout(0.02) as t:
                await asyncio.sleep(1)
        except TimeoutError:
            assert t.expired()
            continue
        raise AssertionError("the block should have timed out")
