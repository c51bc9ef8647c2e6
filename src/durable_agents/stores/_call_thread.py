"""One thread that runs a store's blocking calls in order, each result handed back to
the event loop that asked for it.

Why not `loop.run_in_executor` on a one-thread `ThreadPoolExecutor`: a durable step
makes two such round trips (its two commits), and the executor's wrapping (a
concurrent future chained to an asyncio one, its condition and callbacks) made each
about 40 us slower than this queue and one `call_soon_threadsafe`, measured by
`scripts/bench_core.py` section 6. The blocking calls (a commit waits for fsync) stay
off the event loop: other sessions' tasks keep running while one commits.

The thread is a daemon: a store nobody closed must not keep the interpreter from
exiting. A call cut off by the exit is a crash at that point, which SQLite's journal
makes safe (nothing of an unfinished transaction lands). The thread holds no reference
to its owner, and stops when its owner is closed or collected.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], Any]


class CallThread:
    """A thread running `fn(arg)` for each `call`, one at a time, in the order called."""

    def __init__(self, name: str) -> None:
        jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._jobs = jobs
        threading.Thread(target=_serve, args=(jobs,), name=name, daemon=True).start()
        self._stop = weakref.finalize(self, jobs.put, None)

    def call(self, fn: Callable[[Any], T], arg: Any) -> asyncio.Future[T]:
        """A future of the running loop for `fn(arg)`, run in the thread after the calls
        before it. Cancelled before the thread takes it up, it never runs (as a queued
        executor job); once running, it runs to its end."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put((loop, future, fn, arg))
        return future

    def stop(self) -> None:
        """End the thread once the calls queued before this have run."""
        self._stop()


def _serve(jobs: queue.SimpleQueue[_Job | None]) -> None:
    while (job := jobs.get()) is not None:
        loop, future, fn, arg = job
        if future.cancelled():
            continue
        try:
            result, error = fn(arg), None
        except BaseException as exc:  # handed to the caller, as an executor does
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for it
            loop.call_soon_threadsafe(_settle, future, result, error)
        del job, future, fn, arg, result, error  # no reference kept while idle


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)
