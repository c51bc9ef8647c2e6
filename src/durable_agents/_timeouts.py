"""Timeouts whose timer is cleared when the block ends: `async with timeout(seconds) as t:`.

Pyodide's event loop (the one a Python Worker runs) schedules every
`call_later` as a JavaScript `setTimeout`, and cancelling the handle does not
clear it: the JS timer stays active until it fires, doing nothing. workerd
allows 10,000 active timers per isolate (`QuotaExceededError: You have
exceeded the number of active timeouts you may set`), and a Durable Object
keeps its isolate across requests. So `asyncio.timeout(30)` around each of a
thousand tool calls, or each read of a streamed body, left thousands of
timers alive for 30 s, and the next turn's timers failed.

Here the deadline is a timer of its own that the block's end clears: in a
Worker `js.setTimeout` / `js.clearTimeout` (the timer belongs to the request
that set it, as any timer of a Worker does), elsewhere `loop.call_later` and
its handle's `cancel()`. When it fires, it hands the expiry to the loop, and
the block is cancelled as `asyncio.timeout` would: `TimeoutError`, and
`.expired()` says so. `seconds=None` is no limit.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from types import TracebackType

__all__ = ["Timeout", "timeout"]

Fire = Callable[[], None]
Cancel = Callable[[], None]
Schedule = Callable[[asyncio.AbstractEventLoop, float, Fire], Cancel]


def _loop_timer(loop: asyncio.AbstractEventLoop, seconds: float, fire: Fire) -> Cancel:
    return loop.call_later(seconds, fire).cancel


def _js_timer(loop: asyncio.AbstractEventLoop, seconds: float, fire: Fire) -> Cancel:
    from js import clearTimeout, setTimeout  # type: ignore[import-not-found, unused-ignore]
    from pyodide.ffi import create_proxy  # type: ignore[import-not-found, unused-ignore]

    # A JS callback runs outside the loop's handles: hand the expiry to the loop.
    callback = create_proxy(lambda *_: loop.call_soon(fire))
    timer_id = setTimeout(callback, max(seconds, 0.0) * 1000)

    def cancel() -> None:
        clearTimeout(timer_id)
        callback.destroy()

    return cancel


def default_schedule() -> Schedule:
    return _js_timer if sys.platform == "emscripten" else _loop_timer


class Timeout:
    """`asyncio.timeout(seconds)` whose timer is cleared when the block ends (see the module).

    `schedule(loop, seconds, fire) -> cancel` sets the timer (default: per platform)."""

    def __init__(self, seconds: float | None, schedule: Schedule | None = None) -> None:
        self.seconds = seconds
        self._schedule = schedule or default_schedule()
        self._inner = asyncio.timeout(None)
        self._cancel: Cancel | None = None

    def expired(self) -> bool:
        return self._inner.expired()

    async def __aenter__(self) -> Timeout:
        await self._inner.__aenter__()
        if self.seconds is not None:
            loop, inner = asyncio.get_running_loop(), self._inner

            def fire() -> None:
                if self._cancel is not None:  # (the block has not ended yet)
                    inner.reschedule(loop.time())

            self._cancel = self._schedule(loop, max(self.seconds, 0.0), fire)
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        cancel, self._cancel = self._cancel, None
        if cancel is not None:
            cancel()
        await self._inner.__aexit__(kind, error, traceback)


def timeout(seconds: float | None, schedule: Schedule | None = None) -> Timeout:
    """A block that may take at most `seconds` (None: no limit); see the module."""
    return Timeout(seconds, schedule)
