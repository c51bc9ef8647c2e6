"""What a run reports while it goes (`run(..., on_event=...)`), and how to stop it (`CancelToken`).

    async def show(event: RunEvent) -> None:
        match event:
            case TextDelta(text):                 # a piece of the reply, as the LLM writes it
                print(text, end="")
            case MessageStored(position, message):  # a message, once its write has landed
                ...
            case RunFinished(result):             # the end: the RunResult run() returns
                ...
            case ChildEvent(agent, session_name, tool_call_id, event):  # an agent tool's turn
                ...

    result = await run(agent, llm=llm, message="...", session_id="s1", store=store,
                       on_event=show, cancel=token)

Deltas are a preview: the stored messages are the truth, and each is
reported once, with its `position` in the session (0 for the first), after
the append that stored it. Reporting costs no write. A turn is stopped with
`token.cancel()`: it ends at the next step boundary with status
`"cancelled"`, never between a step's write #1 and its handlers (see the
crash-window table in docs/contract.md).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ._turn.run_result import RunResult
from .messages import Message, TextDelta

__all__ = [
    "CancelToken",
    "ChildEvent",
    "MessageStored",
    "OnEvent",
    "RunEvent",
    "RunFinished",
    "TextDelta",
]


@dataclass(frozen=True, slots=True)
class MessageStored:
    """A message of the session, reported once the append that stored it has landed."""

    position: int
    message: Message


@dataclass(frozen=True, slots=True)
class RunFinished:
    """The run's last event: the same `RunResult` that `run()` returns."""

    result: RunResult


@dataclass(frozen=True, slots=True)
class ChildEvent:
    """An event of a turn that one of the run's agent tools runs (`agent_tool`): `event`
    as the child's `on_event` got it (a `ChildEvent` again for a grandchild's), tagged
    with the child's `agent`, its `session_name` (`child_session_name`) and the parent's
    `tool_call_id`."""

    agent: str
    session_name: str
    tool_call_id: str
    event: RunEvent


RunEvent = TextDelta | MessageStored | RunFinished | ChildEvent
OnEvent = Callable[[RunEvent], Awaitable[None] | None]


class CancelToken:
    """Asks a run to stop at its next step boundary (`run(..., cancel=token)`).

    `cancel()` may be called from anywhere, any number of times, before or
    during the run. An LLM call in progress is abandoned (nothing of it was
    stored); a step whose write #1 landed finishes its handlers and stores
    their results first. The run then returns status `"cancelled"`, with the
    history consistent, and `run(..., message=None)` goes on with the turn.
    """

    __slots__ = ("_event", "reason")

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.reason: str | None = None

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self, reason: str | None = None) -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    async def wait(self) -> None:
        """Return once `cancel()` has been called."""
        await self._event.wait()


_log = logging.getLogger("durable_agents")


class EventReporter:
    """Hands a run's events to its `on_event`, which may be sync or async (the kit's own
    plumbing: `run()` makes one).

    A watcher that raises is logged and dropped, never allowed to end the turn:
    an error between a step's write #1 and its handlers would leave orphans.
    """

    def __init__(self, on_event: OnEvent | None) -> None:
        self.on_event = on_event

    @property
    def watched(self) -> bool:
        return self.on_event is not None

    async def emit(self, event: RunEvent) -> None:
        if self.on_event is None:
            return
        try:
            outcome = self.on_event(event)
            if inspect.isawaitable(outcome):
                await outcome
        except Exception:
            _log.exception("on_event raised; this run reports no more events")
            self.on_event = None
