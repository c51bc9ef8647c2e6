"""Running a step's tool calls and turning each into the content of its result.

`ToolExecutor.dispatch` answers calls in call order, their handlers running
concurrently (bounded by `Agent.tool_concurrency`, and inside a Workers
invocation by what it may still fetch, `durable_agents.budget`); a call that
cannot or may not run is answered without running. Which answers a crash can
leave behind (a `tool-durability-error` for an unsafe orphan) is the contract's
(docs/contract.md); the result kinds are listed in docs/python-api.md, approvals
and edited arguments in docs/approvals.md, `ModelRetry` in docs/turns.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import replace
from typing import Any

from .. import _json, _timeouts
from ..agent import Agent
from ..approvals import ApprovalState, PendingApproval
from ..budget import InvocationBudget
from ..errors import (
    ModelRetry,
    ToolArgumentsError,
    ToolDurabilityError,
    ToolFailure,
    describe_exception,
)
from ..messages import (
    OUTPUT_TOOL,
    MalformedToolCall,
    Message,
    ToolCall,
    ToolErrorKind,
    Usage,
    tool_error,
    tool_error_content,
)
from ..schedules import ScheduleRoom, StepSchedules, room_left
from ..tools import Tool, ToolContext
from .delegation import ChildAnswer, Delegation
from .ids import idempotency_key
from .output_retries import OutputRetries, turn_results
from .session_log import SessionLog

__all__ = ["ToolExecutor"]

_logger = logging.getLogger("durable_agents")


class ToolExecutor:
    """Runs one session's tool calls for a run: the handlers, and every result they get."""

    def __init__(
        self,
        agent: Agent[Any],
        tools: dict[str, Tool],
        log: SessionLog,
        output: OutputRetries,
        *,
        deps: Any,
        new_id: Callable[[], str],
        clock: Callable[[], float],
        budget: InvocationBudget | None,
        delegation: Delegation | None = None,
    ) -> None:
        self.agent = agent
        self.tools = tools
        self.log = log
        self.output = output
        self.deps = deps
        self.new_id = new_id
        self.clock = clock
        self.budget = budget
        self.delegation = delegation
        # What an agent tool's child turn used, by call: stored on the call's result.
        self.child_usage: dict[str, Usage] = {}
        self.unstarted: list[ToolCall] = []  # dispatch(budgeted=True) did not start these
        # By call, of the last dispatch: agent tools' calls whose child turn waits for a
        # person's decision (those calls, tagged). They get no result: the turn waits.
        self.waiting_children: dict[str, list[PendingApproval]] = {}
        self.retries: dict[str, int] = {}  # tool -> its calls answered tool-retry this turn
        # Room for more in the session (a durable store's): counted before a handler first runs.
        self.schedule_room: ScheduleRoom | None = None

    @property
    def history(self) -> list[Message]:
        return self.log.history

    def with_policy(self, call: ToolCall) -> ToolCall:
        """`call` with what the kit decided for it, if its tool came from a toolset."""
        tool = self.tools.get(call.name)
        policy = None if tool is None else tool.policy
        return call if policy is None else replace(call, policy=policy)

    def step_seconds(self, calls: Sequence[ToolCall]) -> float:
        """How long a step's handlers may run, as far as their tools declare it."""
        timeouts = [t.timeout for c in calls if (t := self.tools.get(c.name)) and t.timeout]
        return max(timeouts, default=0.0)

    async def dispatch(
        self,
        calls: list[ToolCall],
        *,
        resuming: bool = False,
        decided: Mapping[str, ApprovalState] | None = None,
        run: set[str] | None = None,
        budgeted: bool = False,
        edits: Mapping[str, dict[str, Any]] | None = None,
    ) -> list[Message]:
        """One result per call, in call order. Handlers of one step run concurrently.

        With `decided` (calls a person decided on): those in `run` (claimed just
        now) run as new calls, the others get their `tool-denied` result; a call in
        `edits` (approved with edited arguments) runs with those, and its result says
        so. With
        `budgeted`, inside a Workers invocation (`durable_agents.budget`), a handler
        starts only while the invocation can still fetch (one subrequest counted for
        each handler in flight); the calls never started get no result and are left in
        `self.unstarted`, in call order. An agent tool's call whose child turn waits for
        a decision gets no result either: it is in `self.waiting_children`."""
        decided, run, edits = decided or {}, run or set(), edits or {}
        self.waiting_children = {}
        over = self.beyond_cap()
        most = self.agent.tool_concurrency
        # (No semaphore where it could never make a handler wait: most steps.)
        slots: contextlib.AbstractAsyncContextManager[Any] = (
            asyncio.Semaphore(most) if len(calls) > most else contextlib.nullcontext()
        )
        limit = self.budget if budgeted else None
        in_flight = 0

        async def answer(call: ToolCall) -> str | None:
            nonlocal in_flight
            if call.id in decided and call.id not in run:
                return denied_result(call, decided[call.id])
            async with slots:
                if limit is not None and limit.calls_that_fit() - in_flight <= 0:
                    return None  # not started: deferred to a fresh invocation
                in_flight += 1
                edited = edits.get(call.id)
                try:
                    content = await self.result_content(
                        call if edited is None else replace(call, arguments=edited),
                        resuming and call.id not in run,
                        call.id in over,
                    )
                finally:
                    in_flight -= 1
                if call.id in self.waiting_children:
                    return None
                return content if edited is None else _ran_edited(content, edited)

        runs = any(call.id not in decided or call.id in run for call in calls)
        if runs and self.log.store.durable and self.schedule_room is None:
            # Before a handler first runs (one read a run): ctx.schedule counts against it.
            self.schedule_room = await room_left(self.log.store, self.log.session_id)
        jobs = [answer(call) for call in calls]
        contents = [await jobs[0]] if len(jobs) == 1 else await _all_or_crash(jobs)
        self.unstarted = [
            c
            for c, text in zip(calls, contents, strict=True)
            if text is None and c.id not in self.waiting_children
        ]
        return [
            self.result_message(c, text)
            for c, text in zip(calls, contents, strict=True)
            if text is not None
        ]

    def waiting_of(self, calls: Sequence[ToolCall]) -> list[PendingApproval]:
        """What waits for a person below `calls` of the last dispatch (their child turns'
        calls), in call order."""
        return [p for c in calls for p in self.waiting_children.get(c.id, [])]

    def result_message(self, call: ToolCall, content: str) -> Message:
        """The call's result; an agent tool's carries its child turn's usage, so the
        parent session's spend counts it (once: with the write that stores the result)."""
        usage = self.child_usage.pop(call.id, None)
        result = Message.tool_result(call, content)
        return result if usage is None else replace(result, usage=usage)

    def beyond_cap(self) -> set[str]:
        """The calls of the last step past `max_tool_calls_per_step`: answered, never run."""
        last = next((m for m in reversed(self.history) if m.role == "assistant"), None)
        cap = self.agent.max_tool_calls_per_step
        if last is None or len(last.tool_calls) <= cap:
            return set()
        return {c.id for c in last.tool_calls[cap:]}

    async def result_content(self, call: ToolCall, resuming: bool, over_cap: bool = False) -> str:
        """The content of `call`'s result: its handler's, or why it did not run."""
        answers = self.output.schema is not None and call.name == OUTPUT_TOOL
        if isinstance(call, MalformedToolCall):  # never run, so never a durability question
            if answers:
                self.output.count_rejection()
            return tool_error_content(ToolErrorKind.INVALID_ARGUMENTS, call.arguments_error)
        if answers and not over_cap:  # no side effect: checked again on resume
            return self.output.answer_output(call)
        tool = self.tools.get(call.name)
        safe = _safe_to_retry(call, tool)
        refused = self.refusal(call, tool, safe, resuming, over_cap)
        if refused is not None:
            return refused
        assert tool is not None  # (refused otherwise)
        try:
            args = tool.parse_arguments(call.arguments)
        except ToolArgumentsError as exc:
            return tool_error_content(
                ToolErrorKind.INVALID_ARGUMENTS,
                f"Tool {call.name!r} was not run: its arguments are invalid: {exc}",
            )
        return await self.handler_result(call, tool, args, safe, resuming)

    def refusal(
        self, call: ToolCall, tool: Tool | None, safe: bool, resuming: bool, over_cap: bool
    ) -> str | None:
        """The result of a call that is not run at all: an unsafe orphan, one past the
        step's cap, or one of no tool (None: it may run)."""
        if resuming and (tool is None or not safe):
            # (Also past the cap: the cap may have been lower when the step began.)
            return ToolDurabilityError(call.name, call.id).to_content()
        if over_cap:
            cap = self.agent.max_tool_calls_per_step
            return tool_error_content(
                ToolErrorKind.TOO_MANY_CALLS,
                f"Tool {call.name!r} was not run: one reply may ask for at most {cap} tool "
                f"calls, and this was call {cap + 1} or later. Ask for the rest in another step.",
            )
        if tool is None:
            return tool_error_content(
                ToolErrorKind.UNKNOWN_TOOL,
                f"There is no tool named {call.name!r}. Available tools: {sorted(self.tools)}.",
            )
        return None

    async def handler_result(
        self, call: ToolCall, tool: Tool, args: Any, safe: bool, resuming: bool
    ) -> str:
        """Run the call's handler (bounded by its tool's `timeout`): its result's content,
        or its failure's."""
        schedules = None
        if self.schedule_room is not None:
            schedules = StepSchedules(
                self.new_id, self.clock, self.agent.max_message_bytes, self.schedule_room
            )
        ctx = ToolContext(
            session_id=self.log.session_id,
            tool_call_id=call.id,
            tool_name=call.name,
            idempotency_key=idempotency_key(self.log.session_id, call.id),
            resumed=resuming,
            deps=self.deps,
            schedules=schedules,
            clock=self.clock,
            delegation=self.delegation,
        )
        assert tool.handler is not None  # bind_tools guarantees it
        timer = None  # (a handler that returns at once needs none)
        try:
            try:
                value = tool.handler(args, ctx)
                if inspect.isawaitable(value):
                    timer = _timeouts.timeout(tool.timeout)  # leaves no timer behind (Pyodide)
                    async with timer:
                        value = await value
            except BaseException:
                if schedules is not None:  # a failed call schedules nothing
                    schedules.discard()
                raise
            if schedules is not None:  # it returned: what it scheduled goes with its result
                self.log.scheduled += schedules.made
            if isinstance(value, ChildAnswer):  # an agent tool's: its answer, and its cost
                if value.waiting:  # its child waits for a person: no result (nor cost) yet
                    self.waiting_children[call.id] = list(value.waiting)
                    return ""
                self.child_usage[call.id] = value.usage
                value = value.content
        except ModelRetry as exc:
            return self.retry_result(call.name, exc)
        except ToolFailure as exc:
            if exc.outcome_unknown and not safe:
                return uncertain_result(
                    call, f"left its outcome unknown ({exc.message.rstrip('.')})"
                )
            return tool_error_content(exc.kind, f"Tool {call.name!r} failed: {exc.message}")
        except Exception as exc:
            timed_out = isinstance(exc, TimeoutError) and timer is not None and timer.expired()
            content = _failure(call, tool, exc, safe=safe, timed_out=timed_out)
            _log_failure(self.log.session_id, call, exc, content)
            return content
        return self.encoded(call, tool, value)

    def encoded(self, call: ToolCall, tool: Tool, value: Any) -> str:
        """A handler's return value as its stored result, or why it was not stored."""
        try:
            content = tool.encode_result(value)
        except _json.JSONTooDeepError:
            return tool_error_content(
                ToolErrorKind.INVALID_OUTPUT,
                f"Tool {call.name!r} ran, but its result nests arrays and objects deeper than "
                f"{_json.MAX_DEPTH} levels and was not stored.",
            )
        except ValueError as exc:  # breaks its output schema, or is not strict JSON
            return tool_error_content(
                ToolErrorKind.INVALID_OUTPUT,
                f"Tool {call.name!r} ran, but its result was not stored: {exc}",
            )
        size = len(content) if content.isascii() else len(content.encode())
        if size > self.agent.max_result_bytes:
            return tool_error_content(
                ToolErrorKind.RESULT_TOO_LARGE,
                f"Tool {call.name!r} ran, but its result ({size:,} bytes) is over the "
                f"{self.agent.max_result_bytes:,}-byte limit and was not stored. Ask for less "
                "(a smaller page or a narrower query).",
            )
        return content

    def retry_result(self, name: str, exc: ModelRetry) -> str:
        """A handler's `ModelRetry`: `tool-retry`, while the tool has retries left in the turn."""
        if name not in self.retries:  # first met in this run: those stored before it
            self.retries[name] = turn_results(self.history, ToolErrorKind.TOOL_RETRY, name)
        done = self.retries[name]
        if done >= self.agent.max_tool_retries:
            return tool_error_content(
                ToolErrorKind.TOOL_FAILED,
                f"Tool {name!r} failed: it asked for a retry {done + 1} times in this turn, over "
                f"the limit of {self.agent.max_tool_retries} (max_tool_retries): {exc.message}",
            )
        self.retries[name] = done + 1
        return tool_error_content(ToolErrorKind.TOOL_RETRY, exc.message)


def _safe_to_retry(call: ToolCall, tool: Tool | None) -> bool:
    """Whether the call may run again after a crash. A toolset's call is judged by what
    was decided when it was stored."""
    if call.policy is not None:
        return call.policy.get("safe_to_retry") is True
    return tool is not None and tool.safe_to_retry


def _failure(call: ToolCall, tool: Tool, exc: Exception, *, safe: bool, timed_out: bool) -> str:
    """The result of a handler that raised (neither ModelRetry nor ToolFailure)."""
    if not safe and (timed_out or _outcome_unknown(exc)):
        # It may have acted: answer as for a call lost in a crash, so the
        # model checks before acting again instead of making a new call.
        what = (
            f"did not finish within {tool.timeout} s and was stopped"
            if timed_out
            else f"lost its connection before an answer came back ({describe_exception(exc)})"
        )
        return uncertain_result(call, what)
    if timed_out:
        return tool_error_content(
            ToolErrorKind.TOOL_TIMEOUT,
            f"Tool {call.name!r} did not finish within {tool.timeout} s and was "
            "stopped. It is safe to retry.",
        )
    return tool_error_content(
        ToolErrorKind.TOOL_FAILED, f"Tool {call.name!r} failed: {describe_exception(exc)}"
    )


def _log_failure(session_id: str, call: ToolCall, exc: Exception, content: str) -> None:
    """A handler's unexpected error, with its traceback, where the developer looks: the
    `durable_agents` logger (unconfigured, Python prints it to stderr: in the Worker,
    workerd's log, so `scripts/dev`'s output and `wrangler tail`). The call's arguments
    may be personal: they are not logged."""
    error = tool_error(content)
    kind = error.get("kind") if error is not None else None
    _logger.error(
        "tool %r failed in session %s (call %s); the model was told %s. Its traceback:",
        call.name, session_id, call.id, kind, exc_info=exc,
    )  # fmt: skip


def _ran_edited(content: str, edited: dict[str, Any]) -> str:
    """The result of a call a person approved with edited arguments: says so, with them."""
    error = tool_error(content)
    if error is not None:  # it failed, or may or may not have run: about the edited call
        note = (
            "A person approved this call with edited arguments (edited_arguments), not the "
            "arguments you sent; this error is about the call with them."
        )
        return json.dumps({**error, "edited_arguments": edited, "note": note}, ensure_ascii=False)
    note = (
        "A person approved this call with edited arguments: it ran once, with "
        "edited_arguments, not the arguments you sent."
    )
    try:
        value: Any = _json.loads(content)
    except ValueError:
        value = content
    return json.dumps(
        {"result": value, "edited_arguments": edited, "note": note}, ensure_ascii=False
    )


def denied_result(call: ToolCall, state: ApprovalState) -> str:
    """The result of a call that a person denied (or whose stored arguments no
    longer match what was approved: then it is not run either)."""
    if state.decision == "approved":  # approved, but for another digest: refuse it
        reason: str | None = "the stored call does not match the approved digest"
    else:
        reason = state.reason
    return tool_error_content(
        ToolErrorKind.TOOL_DENIED,
        f"The call to {call.name!r} (call {call.id}) was denied by a person and did not run. "
        "Do not make it again unless the user asks for it; say what was not done.",
        toolName=call.name,
        toolCallId=call.id,
        reason=reason,
    )


def uncertain_result(call: ToolCall, what: str) -> str:
    """The result of an unsafe call that ran and may have acted, though no answer says so:
    a `tool-durability-error`, as for a call lost in a crash, so the model checks before
    acting again instead of making a new call."""
    return ToolDurabilityError(
        call.name,
        call.id,
        f"Tool '{call.name}' (call {call.id}) {what}, so it may or may not have taken effect. "
        "It was not retried because it is not declared safe_to_retry. Do not repeat it "
        "blindly: check whether the effect happened first, or ask the user.",
    ).to_content()


def _outcome_unknown(exc: BaseException) -> bool:
    """Whether a handler's error leaves its effect unknown: a timeout or a
    transport failure, where the request may have been received and acted on."""
    import httpx  # loaded at the first failure of a tool, if nothing loaded it before

    return isinstance(exc, TimeoutError | ConnectionError | httpx.TransportError)


async def _all_or_crash(jobs: list[Coroutine[Any, Any, str | None]]) -> list[str | None]:
    """Run the jobs concurrently. Ordinary errors are already results; anything
    that escapes is a BaseException (a crash, a cancellation): stop the
    siblings and let it propagate, so no result of this step is written."""
    tasks = [asyncio.ensure_future(job) for job in jobs]
    try:
        _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except BaseException:
        for task in tasks:
            task.cancel()
        raise
    for task in pending:
        task.cancel()
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
    return [task.result() for task in tasks]
