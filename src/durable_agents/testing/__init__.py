"""Test doubles for agents built on durable-agents: a scripted LLM and crash points.

    llm = ScriptedLLM([LLMResponse(tool_calls=[ToolCall("c1", "post", {...})]),
                       LLMResponse(text="done")])
    crashing = crash_on_write(store, before="result of post")   # dies on step 1's write #2
    with pytest.raises(SimulatedCrash):
        await run(agent, llm=llm, message="hi", session_id="s1", store=crashing)
    result = await run(agent, llm=llm, session_id="s1", store=store)  # resume

A crash point is one atomic append (a write), named by what it stores
(`crash_on_write(store, after="call of book_slot")`) or counted
(`crash_on_write(store, 3)`); `count_writes(store).writes` lists a run's
writes by those names.

`SimulatedCrash` derives from `BaseException`, like a real process death it
cannot be swallowed by an `except Exception` in a handler or in the loop.

`TestLLM` (any agent: each tool once, arguments from its schema) and
`FunctionLLM(fn)` (your own answers) are the offline models of
`durable_agents.llm.offline`, re-exported here.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import ConfigurationError
from ..llm.offline import FunctionLLM, TestLLM, stream_response
from ..messages import LLMResponse, Message, StreamPart, ToolSpec
from ..run import DEFERRED_REASON
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


_WRITE_FORMS = (
    "'call of TOOL' (the step's write #1, storing a call of TOOL), 'result of TOOL' (a write "
    "storing a result of TOOL), 'decision on TOOL' (a person's approve() of a call of "
    "TOOL, approved or denied), 'claim of TOOL' (the write just before an approved call of "
    "TOOL runs) or 'final reply' (the write ending the turn)"
)
_WRITE_NAME = re.compile(
    r"(?:the\s+)?(?:(?P<kind>calls?\s+of|results?\s+of|decisions?\s+on|claims?\s+of)\s+"
    r"(?P<tool>[A-Za-z0-9_-]{1,64})|(?P<final>final\s+reply))"
)


@dataclass(frozen=True, slots=True)
class _WriteName:
    """Which write a name means: a kind ("call", "result", "decision", "claim",
    "final reply") and, but for the final reply, a tool."""

    text: str
    kind: str
    tool: str | None

    @classmethod
    def parse(cls, text: str) -> _WriteName:
        match = _WRITE_NAME.fullmatch(" ".join(str(text).split()))
        if match is None:
            raise ConfigurationError(
                f"crash_on_write: cannot tell which write {text!r} means; name one as "
                f"{_WRITE_FORMS}"
            )
        if match.group("final"):
            return cls(text, "final reply", None)
        kind = match.group("kind").split()[0].rstrip("s")
        return cls(text, kind, match.group("tool"))


def _write_names(
    messages: Sequence[Message], approvals: Sequence[ApprovalChange], tool_of: dict[str, str]
) -> list[tuple[str, str | None]]:
    """What one write stores, as (kind, tool) pairs: the names that match it."""
    names: list[tuple[str, str | None]] = []
    for m in messages:
        names += [("call", c.name) for c in m.tool_calls]
        if m.role == "tool":
            names.append(("result", m.tool_name))
        if m.is_final_reply:
            names.append(("final reply", None))
    for change in approvals:
        if change.event in ("approved", "denied") and change.reason != DEFERRED_REASON:
            names.append(("decision", tool_of.get(change.tool_call_id)))
        elif change.event == "claimed":
            names.append(("claim", tool_of.get(change.tool_call_id)))
    return names


def _describe(
    names: Sequence[tuple[str, str | None]],
    messages: Sequence[Message],
    approvals: Sequence[ApprovalChange],
) -> str:
    """A write as `writes` lists it: by the names that match it, else by what it holds."""
    parts: dict[str, list[str]] = {}
    for kind, tool in names:
        parts.setdefault(kind, [])
        if tool is not None and tool not in parts[kind]:
            parts[kind].append(tool)
    text = "; ".join(
        kind + (" of " if kind != "decision" else " on ") + ", ".join(tools) if tools else kind
        for kind, tools in parts.items()
    )
    if text:
        return text
    held = ["a summary" if m.is_summary else f"a {m.role} message" for m in messages] + [
        f"{a.event} {a.tool_call_id}" for a in approvals
    ]
    return ", ".join(held) or "no message (schedules only)"


class CrashingStore:
    """Wraps a store; the atomic append it is told of raises `SimulatedCrash`.

    Which one: the `crash_on`-th (from 1), or the first whose content `write`
    names (see `crash_on_write`). With `when="before"` (the default) nothing of
    that append lands; with `when="after"` it lands and then the crash happens,
    as when a process dies right after a commit returns. `crash_on=None` and no
    `write` never crashes (see `count_writes`). Every other method passes
    through (taking and releasing a run's lease are not appends: they are not
    counted). `appends` counts the calls made, `writes` names each
    ("call of lookup, post", "result of lookup, post", "final reply", ...) and
    `crashed` says whether the crash happened.

    A named write that a turn ends without making (its final reply lands
    first) fails the test then: `AssertionError`, listing the writes seen.
    """

    def __init__(
        self,
        store: Store,
        crash_on: int | None,
        when: Literal["before", "after"] = "before",
        *,
        write: str | None = None,
    ) -> None:
        if crash_on is not None and crash_on < 1:
            raise ConfigurationError("crash_on counts from 1")
        if crash_on is not None and write is not None:
            raise ConfigurationError("crash on a write by its number or by its name, not both")
        self.inner = store
        self.crash_on = crash_on
        self.when = when
        self.write = _WriteName.parse(write) if write is not None else None
        self.appends = 0
        self.writes: list[str] = []
        self.crashed = False
        self._tool_of: dict[str, str] = {}  # call id -> tool name, for approval events

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
        names = await self._names(session_id, messages, approvals)
        self.writes.append(_describe(names, messages, approvals))
        crash = not self.crashed and (
            self.appends == self.crash_on
            or (self.write is not None and (self.write.kind, self.write.tool) in names)
        )
        what = f"atomic append #{self.appends}" + (
            f" ({self.write.text})" if crash and self.write is not None else ""
        )
        if crash and self.when == "before":
            self.crashed = True
            raise SimulatedCrash(f"simulated crash before {what}")
        count = await self.inner.append_messages_atomic(
            session_id, expected_seq, messages, agent_name=agent_name, lease=lease,
            approvals=approvals, session_name=session_name, schedules=schedules,
        )  # fmt: skip
        if crash:
            self.crashed = True
            raise SimulatedCrash(f"simulated crash after {what}")
        if self.write is not None and not self.crashed and ("final reply", None) in names:
            raise AssertionError(
                f"crash_on_write(..., {self.when}={self.write.text!r}): the turn ended (its "
                f"final reply was stored, write #{self.appends}) without ever making that "
                "write, so it never crashed. The writes it saw: "
                + "; ".join(f"#{n} {w}" for n, w in enumerate(self.writes, 1))
                + ". Check the tool's name, or wrap the store only for the turn that makes "
                "the write."
            )
        return count

    async def _names(
        self, session_id: str, messages: Sequence[Message], approvals: Sequence[ApprovalChange]
    ) -> list[tuple[str, str | None]]:
        for m in messages:
            self._tool_of.update((c.id, c.name) for c in m.tool_calls)
        self._tool_of.update((a.tool_call_id, a.tool_name) for a in approvals if a.tool_name)
        unknown = {a.tool_call_id for a in approvals} - set(self._tool_of)
        if unknown:  # decided or claimed calls this wrapper has not seen stored
            for m in await self.inner.load_messages(session_id):
                self._tool_of.update((c.id, c.name) for c in m.tool_calls)
        return _write_names(messages, approvals, self._tool_of)

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
    store: Store,
    n: int | None = None,
    *,
    when: Literal["before", "after"] | None = None,
    before: str | None = None,
    after: str | None = None,
) -> CrashingStore:
    """`store`, except that one atomic append (a write) raises `SimulatedCrash`.

    Name the write by what it stores, and the side of it to die on:

        crash_on_write(store, before="result of send_sms")  # it ran; its result is lost
        crash_on_write(store, after="call of book_slot")     # stored; nothing ran yet
        crash_on_write(store, after="decision on book_slot") # approve() landed, then died
        crash_on_write(store, before="claim of book_slot")   # approved, never started
        crash_on_write(store, before="final reply")

    A name is "call of TOOL", "result of TOOL", "decision on TOOL", "claim of
    TOOL" or "final reply"; the first write that stores it is the one.
    `count_writes(store).writes` lists a run's writes by these names. If the
    turn ends without such a write, its final write raises `AssertionError`
    (listing the writes it saw) instead of the test passing uncrashed: wrap
    the store for the turn that makes the write.

    Or count: `crash_on_write(store, n)` crashes on the n-th append (from 1),
    `when="before"` (the default) or `"after"` it lands.
    """
    names = {"before": before, "after": after}
    named = {side: text for side, text in names.items() if text is not None}
    if isinstance(n, str):
        raise ConfigurationError(
            f"crash_on_write(store, {n!r}): name a write with before= or after=, e.g. "
            f"crash_on_write(store, before={n!r}); n counts appends"
        )
    if len(named) + (n is not None) != 1:
        raise ConfigurationError(
            "crash_on_write needs exactly one of: n (which append, from 1), before='<a "
            "write>' or after='<a write>'"
        )
    if named:
        if when is not None:
            raise ConfigurationError(
                "when= goes with n; with a named write, before= or after= says the side"
            )
        side, text = next(iter(named.items()))
        return CrashingStore(store, None, "before" if side == "before" else "after", write=text)
    return CrashingStore(store, n, when or "before")


def count_writes(store: Store) -> CrashingStore:
    """`store`, counting its atomic appends in `.appends` (one commit each) and naming
    them in `.writes` (the names `crash_on_write` takes); never crashes."""
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
