"""Timeouts that leave no timer behind: `async with timeout(seconds) as t: ...`.

Pyodide's event loop (the one a Python Worker runs) schedules every
`call_later` as a JavaScript `setTimeout`, and cancelling the handle does not
clear it: the JS timer stays active until it fires, doing nothing. workerd
allows 10,000 active timers per isolate (`QuotaExceededError: You have
exceeded the number of active timeouts you may set`), and a Durable Object
keeps its isolate across requests. So `asyncio.timeout(30)` around each of a
thousand tool calls, or each read of a streamed body, leaves thousands of
timers alive for 30 s, and the next turn's timers fail.

Here every timeout of a loop shares one sleeper: deadlines go into a heap, and
one task sleeps until the earliest (at most `TICK` seconds at a time, so a new
deadline seldom needs it woken). A timeout that ends first just marks its
entry; nothing is scheduled per timeout. Only a deadline earlier than the
sleeper's next wake-up (a timeout shorter than `TICK`) restarts it, leaving one
timer behind. On CPython the same code runs, so it is what the tests exercise.

`timeout(seconds)` behaves as `asyncio.timeout(seconds)`: on expiry the block
is cancelled and `TimeoutError` raised, `.expired()` says whether it was; None
is no limit.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import weakref
from collections.abc import Callable
from types import TracebackType

__all__ = ["TICK", "Timeout", "timeout"]

TICK = 1.0
"""The longest the shared sleeper sleeps at once, in seconds."""


class _Entry:
    __slots__ = ("callback", "cancelled", "order", "when")

    def __init__(self, when: float, order: int, callback: Callable[[], None]) -> None:
        self.when, self.order, self.callback, self.cancelled = when, order, callback, False

    def __lt__(self, other: _Entry) -> bool:
        return (self.when, self.order) < (other.when, other.order)


class _Sleeper:
    """The deadlines of one event loop and the one task that waits for them."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.heap: list[_Entry] = []
        self.order = itertools.count()
        self.task: asyncio.Task[None] | None = None
        self.wake_at = float("inf")

    def add(self, when: float, callback: Callable[[], None]) -> _Entry:
        entry = _Entry(when, next(self.order), callback)
        heapq.heappush(self.heap, entry)
        if self.task is None or self.task.done():
            self.task = self.loop.create_task(self.run())
        elif when < self.wake_at:  # sooner than it wakes: start it again (one timer left)
            self.task.cancel()
            self.task = self.loop.create_task(self.run())
        return entry

    async def run(self) -> None:
        try:
            while self.heap:
                entry = self.heap[0]
                if entry.cancelled:
                    heapq.heappop(self.heap)
                    continue
                wait = entry.when - self.loop.time()
                if wait > 0:
                    self.wake_at = self.loop.time() + min(wait, TICK)
                    await asyncio.sleep(min(wait, TICK))
                    continue
                heapq.heappop(self.heap)
                entry.callback()
        finally:
            self.wake_at = float("inf")


_SLEEPERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Sleeper] = (
    weakref.WeakKeyDictionary()
)


class Timeout:
    """`asyncio.timeout(seconds)`, its timer shared with every other (see the module)."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self._inner = asyncio.timeout(None)
        self._entry: _Entry | None = None

    def expired(self) -> bool:
        return self._inner.expired()

    async def __aenter__(self) -> Timeout:
        await self._inner.__aenter__()
        if self.seconds is not None:
            loop = asyncio.get_running_loop()
            sleeper = _SLEEPERS.get(loop)
            if sleeper is None:
                sleeper = _SLEEPERS[loop] = _Sleeper(loop)
            inner = self._inner
            self._entry = sleeper.add(
                loop.time() + max(self.seconds, 0.0), lambda: inner.reschedule(loop.time())
            )
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._entry is not None:
            self._entry.cancelled = True
        await self._inner.__aexit__(kind, error, traceback)


def timeout(seconds: float | None) -> Timeout:
    """A block that may take at most `seconds` (None: no limit); see the module."""
    return Timeout(seconds)
