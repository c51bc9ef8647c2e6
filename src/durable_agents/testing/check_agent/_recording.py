"""What the check wraps around the agent to see what happens: each tool's handler (which
call it ran for, with what arguments and approval), the toolsets' tools likewise, and the
store (what each append carried, to name the crash points)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ...approvals import approval_states
from ...errors import ModelRetry, ToolFailure
from ...messages import Message
from ...stores.base import ApprovalChange, Store
from ...tools import RunContext, Tool, ToolContext, Toolset
from ..crash_points import CrashingStore
from ._report import clip
from ._rules import plain
from ._scenario import CURRENT, Crash, Invocation, Stage

Handler = Callable[[Any, ToolContext], Awaitable[Any]]


def recorded_handler(t: Tool, stage: Stage, store: Store) -> Handler:
    """`t`'s handler, each run recorded on the scenario being played: how it ended (for the
    report's counts) and, for a tool that needs approval, what the store says of the call
    as it runs."""
    handler = t.handler
    assert handler is not None

    async def recorded(args: Any, ctx: ToolContext) -> Any:
        scenario = stage.now(ctx.session_id)  # a child agent's tool: its session's own
        invocation = Invocation(
            scenario.turn, ctx.tool_name, ctx.tool_call_id, ctx.idempotency_key, 0,
            session=ctx.session_id,
        )  # fmt: skip
        invocation.run_number = 1 + sum(
            1 for i in scenario.invocations if i.call_id == ctx.tool_call_id
        )
        invocation.arguments = plain(args)
        if t.requires_approval:  # what the store says about this call as it runs
            states = approval_states(await store.load_approvals(scenario.name))
            invocation.approval = states.get(ctx.tool_call_id)
        scenario.invocations.append(invocation)
        token = CURRENT.set(invocation)
        try:
            value = handler(args, ctx)
            value = await value if inspect.isawaitable(value) else value
        except (Exception, asyncio.CancelledError) as exc:
            invocation.outcome, invocation.detail = _ended(exc, t.timeout)
            raise
        finally:
            CURRENT.reset(token)
        invocation.outcome = "completed"
        return value

    return recorded


def _ended(exc: BaseException, timeout: float | None) -> tuple[str, str]:
    """How a handler run that raised ended, for the report: ("retried" or "failed", what)."""
    if isinstance(exc, ModelRetry):
        return "retried", f"ModelRetry({clip(exc.message)!r})"
    if isinstance(exc, asyncio.CancelledError):  # the run loop stopped it: its timeout
        return "failed", f"stopped after its timeout ({timeout} s)" if timeout else "cancelled"
    text = exc.message if isinstance(exc, ToolFailure) else str(exc)
    return "failed", f"{type(exc).__name__}({clip(text)!r})"


class RecordingToolset:
    """A toolset of the agent, as the check runs it: listed as it lists, each tool's handler
    recorded like the agent's own (`recorded_handler`)."""

    def __init__(self, inner: Toolset, stage: Stage, store: Store) -> None:
        self.inner = inner
        self.stage = stage
        self.store = store

    @property
    def settings(self) -> tuple[str, ...]:
        return tuple(getattr(self.inner, "settings", ()))

    async def list_tools(self, ctx: RunContext[Any]) -> Sequence[Tool]:
        listed = await self.inner.list_tools(ctx)
        return [
            t.with_handler(recorded_handler(t, self.stage, self.store))
            if t.handler is not None
            else t
            for t in listed
        ]


class RecordingStore(CrashingStore):
    """`crash_on_write`, also keeping what each append carried and where (to name the crash
    points): a child session's appends, which its agent tool's turn makes through the same
    store, are counted among the parent's, so a crash point can be any of them."""

    def __init__(
        self,
        store: Store,
        crash: Crash | None,
        appends: list[list[Message]],
        approval_writes: list[list[ApprovalChange]],
        sessions: list[tuple[str, str | None]] | None = None,
    ) -> None:
        super().__init__(store, crash.n if crash else None, crash.when if crash else "before")
        self._log = appends
        self._approval_log = approval_writes
        self._sessions = [] if sessions is None else sessions

    async def append_messages_atomic(
        self, session_id: str, expected_seq: int, messages: Sequence[Message], **kwargs: Any
    ) -> int:
        self._log.append(list(messages))
        self._approval_log.append(list(kwargs.get("approvals", ())))
        self._sessions.append((session_id, kwargs.get("agent_name")))
        return await super().append_messages_atomic(session_id, expected_seq, messages, **kwargs)
