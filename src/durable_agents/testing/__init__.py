"""Test doubles for agents built on durable-agents: a scripted LLM and crash points.

    llm = ScriptedLLM([LLMResponse(tool_calls=[ToolCall("c1", "post", {...})]),
                       LLMResponse(text="done")])
    crashing = crash_after_tool_results(store)      # dies on step 1's write #2
    with pytest.raises(SimulatedCrash):
        await run(agent, llm=llm, message="hi", session_id="s1", store=crashing)
    result = await run(agent, llm=llm, session_id="s1", store=store)  # resume

`SimulatedCrash` derives from `BaseException`, like a real process death it
cannot be swallowed by an `except Exception` in a handler or in the loop.

`TestLLM` (any agent: each tool once, arguments from its schema) and
`FunctionLLM(fn)` (your own answers) are the offline models of
`durable_agents.llm.offline`, re-exported here.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import ConfigurationError
from ..llm.offline import FunctionLLM, TestLLM, stream_response
from ..messages import LLMResponse, Message, StreamPart, ToolSpec
from ..stores.base import (
    ApprovalChange,
    ApprovalEvent,
    Lease,
    LeaseHolder,
    Schedule,
    SessionInfo,
    SessionPage,
    Store,
)

Step = (
    LLMResponse
    | BaseException
    | Callable[[list[Message], list[ToolSpec]], LLMResponse | Awaitable[LLMResponse]]
)


class SimulatedCrash(BaseException):
    """The process 'died' here. A BaseException so nothing in between can catch it."""


class ScriptExhaustedError(BaseException):
    """A ScriptedLLM was called more times than its script has steps.

    A BaseException on purpose: a test double running out of script is a bug
    in the test, never an LLM outage for `run()` to report as status "error".
    """


@dataclass(frozen=True, slots=True)
class LLMCall:
    """What one `chat()` call was sent."""

    messages: list[Message]
    tools: list[ToolSpec]


class ScriptedLLM:
    """An LLM that plays a script: each step is an `LLMResponse` to return, an
    exception to raise, or a callable `(messages, tools) -> LLMResponse` (sync or
    async) for answers that depend on the conversation. Every call is recorded
    on `.calls`. `stream()` plays the same step in pieces (its text word by
    word, `delta_delay` seconds apart, then the `LLMResponse`)."""

    def __init__(self, steps: Sequence[Step], *, delta_delay: float = 0.0) -> None:
        self.steps = list(steps)
        self.delta_delay = delta_delay
        self.calls: list[LLMCall] = []

    @property
    def remaining(self) -> int:
        return len(self.steps) - len(self.calls)

    async def chat(self, messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        index = len(self.calls)
        self.calls.append(LLMCall(list(messages), list(tools)))
        if index >= len(self.steps):
            last = messages[-1] if messages else None
            raise ScriptExhaustedError(
                f"ScriptedLLM was called {index + 1} times but its script has "
                f"{len(self.steps)} steps; the last message it was sent: {last!r}"
            )
        step = self.steps[index]
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, LLMResponse):
            return step
        answer = step(list(messages), list(tools))
        return await answer if inspect.isawaitable(answer) else answer

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec]
    ) -> AsyncIterator[StreamPart]:
        """The next step, as `chat()` plays it, in pieces: deltas, then the `LLMResponse`."""
        async for part in stream_response(await self.chat(messages, tools), self.delta_delay):
            yield part


class CrashingStore:
    """Wraps a store; its `crash_on`-th atomic append raises `SimulatedCrash`.

    With `when="before"` (the default) nothing of that append lands; with
    `when="after"` it lands and then the crash happens, as when a process dies
    right after a commit returns. `crash_on=None` never crashes (see
    `count_writes`). Every other method passes through (taking and releasing
    a run's lease are not appends: they are not counted). `appends` counts the
    calls made.
    """

    def __init__(
        self, store: Store, crash_on: int | None, when: Literal["before", "after"] = "before"
    ) -> None:
        if crash_on is not None and crash_on < 1:
            raise ConfigurationError("crash_on counts from 1")
        self.inner = store
        self.crash_on = crash_on
        self.when = when
        self.appends = 0

    @property
    def durable(self) -> bool:
        return self.inner.durable

    async def load_messages(
        self, session_id: str, *, start: int = 0, limit: int | None = None
    ) -> list[Message]:
        return await self.inner.load_messages(session_id, start=start, limit=limit)

    async def load_context(self, session_id: str) -> tuple[int, list[Message]]:
        return await self.inner.load_context(session_id)

    async def find_request(self, session_id: str, request_key: str) -> tuple[int, str] | None:
        return await self.inner.find_request(session_id, request_key)

    async def append_messages_atomic(
        self,
        session_id: str,
        expected_seq: int,
        messages: Sequence[Message],
        *,
        agent_name: str | None = None,
        lease: Lease | None = None,
        approvals: Sequence[ApprovalChange] = (),
        session_name: str | None = None,
        schedules: Sequence[Schedule] = (),
    ) -> int:
        self.appends += 1
        crash = self.appends == self.crash_on
        if crash and self.when == "before":
            raise SimulatedCrash(f"simulated crash before atomic append #{self.appends}")
        count = await self.inner.append_messages_atomic(
            session_id, expected_seq, messages, agent_name=agent_name, lease=lease,
            approvals=approvals, session_name=session_name, schedules=schedules,
        )  # fmt: skip
        if crash:
            raise SimulatedCrash(f"simulated crash after atomic append #{self.appends}")
        return count

    async def acquire_lease(
        self, session_id: str, owner: str, ttl_ms: int, *, take_from: str | None = None
    ) -> LeaseHolder | None:
        return await self.inner.acquire_lease(session_id, owner, ttl_ms, take_from=take_from)

    async def release_lease(self, session_id: str, owner: str) -> None:
        await self.inner.release_lease(session_id, owner)

    async def load_approvals(self, session_id: str) -> list[ApprovalEvent]:
        return await self.inner.load_approvals(session_id)

    async def load_schedules(self, session_id: str) -> list[Schedule]:
        return await self.inner.load_schedules(session_id)

    async def delete_schedule(self, session_id: str, schedule_id: str) -> bool:
        return await self.inner.delete_schedule(session_id, schedule_id)

    async def get_session(self, session_id: str) -> SessionInfo | None:
        return await self.inner.get_session(session_id)

    async def list_sessions(self, *, limit: int = 50, cursor: str | None = None) -> SessionPage:
        return await self.inner.list_sessions(limit=limit, cursor=cursor)

    async def find_sessions(self, name: str) -> list[SessionInfo]:
        return await self.inner.find_sessions(name)

    async def delete_session(self, session_id: str) -> bool:
        return await self.inner.delete_session(session_id)

    async def delete_idle(self, before_ms: int, *, limit: int = 100) -> int:
        return await self.inner.delete_idle(before_ms, limit=limit)

    async def load_timeline(
        self, session_id: str, *, start: int = 0, limit: int | None = None
    ) -> list[tuple[int, Message]]:
        return await self.inner.load_timeline(session_id, start=start, limit=limit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def crash_on_write(
    store: Store, n: int, *, when: Literal["before", "after"] = "before"
) -> CrashingStore:
    """`store`, except that its n-th atomic append (from 1) raises `SimulatedCrash`."""
    return CrashingStore(store, n, when)


def count_writes(store: Store) -> CrashingStore:
    """`store`, counting its atomic appends in `.appends` (one commit each); never crashes."""
    return CrashingStore(store, None)


def crash_after_tool_results(store: Store) -> CrashingStore:
    """Crash on the 2nd append: step 1's write #2, after its handlers ran."""
    return crash_on_write(store, 2)


# Last: check_agent builds on the crash helpers above.
from .check_agent import AgentCheckReport, check_agent, check_agent_async  # noqa: E402

__all__ = [
    "AgentCheckReport",
    "CrashingStore",
    "FunctionLLM",
    "LLMCall",
    "ScriptExhaustedError",
    "ScriptedLLM",
    "SimulatedCrash",
    "TestLLM",
    "check_agent",
    "check_agent_async",
    "count_writes",
    "crash_after_tool_results",
    "crash_on_write",
]
