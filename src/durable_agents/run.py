"""The durable agent loop. The at-most-once contract lives here and only here.

One turn, as stored (every arrow is one atomic, conditional append):

    load history ─► repair orphans ──────────────► (one write: a result for every orphan)
    loop:
      LLM call
      ├─ tool calls ─► write #1: [user message of the turn, if not yet stored] + assistant(calls)
      │                handlers run (concurrently)
      │                write #2: every result of the step, in call order
      └─ text only ──► final write: [user message, if not yet stored] + assistant(text)

Why write #1 comes before any handler: once the call is stored, a crash at any
later point leaves an *orphan* (a stored call without a result) that the next
run sees. An orphan of a `safe_to_retry` tool is re-invoked; any other gets a
`ToolDurabilityError` result, because nothing can tell whether its side
effect landed. Every append is conditional on the history length this run
loaded, so of two concurrent runs only one can store a step, and only the one
that stored it dispatches its calls.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from .agent import Agent
from .errors import (
    ConfigurationError,
    MemoryStoreNotDurableError,
    MessageTooLargeError,
    RequestKeyReusedError,
    SessionNotFoundError,
    ToolDurabilityError,
)
from .messages import LLMResponse, MalformedToolCall, Message, ToolCall, ToolSpec, Usage
from .stores.base import Store
from .stores.memory import memory_store
from .tools import Handler, Tool, ToolArgumentsError, ToolContext

RunStatus = Literal["complete", "max_steps", "error"]


class LLM(Protocol):
    """Anything that can take the conversation and answer with text and tool calls.

    Use `durable_agents.llm` (`AnthropicLLM`, `OpenAILLM` for any
    OpenAI-compatible server, `WorkersAILLM` inside a Worker, or
    `llm_from_env`); `testing.ScriptedLLM` in tests. `chat()` may retry inside
    (an LLM call is safe to repeat); whatever it raises ends the run with
    status "error".
    """

    async def chat(self, messages: list[Message], tools: list[ToolSpec]) -> LLMResponse: ...


@dataclass(frozen=True, slots=True)
class RunResult:
    """What `run()` returns.

    `status` is `"complete"` (the LLM gave a final reply, in `response`),
    `"max_steps"` (stopped after `agent.max_steps` LLM calls), or `"error"`
    (the LLM call failed; `error` says why). In the last two cases the stored
    history is consistent and `run(..., message=None)` continues the turn.
    `messages` is the whole conversation as the LLM sees it, system message
    first. `steps` counts this run's LLM calls and `usage` their tokens.
    """

    status: RunStatus
    response: str
    session_id: str
    messages: list[Message]
    steps: int
    usage: Usage
    error: str | None = None


async def run(
    agent: Agent,
    *,
    llm: LLM,
    message: str | None = None,
    session_id: str | None = None,
    store: Store | None = None,
    tools: Mapping[str, Handler] | None = None,
    deps: Any = None,
    new_id: Callable[[], str] | None = None,
    request_key: str | None = None,
) -> RunResult:
    """Run one turn of `agent`, durably when given a durable `store` and a `session_id`.

    - New conversation: pass `message`. Without `session_id` a new session id
      is made (and returned in the result).
    - Continue a session: pass its `session_id` and the next `message`. A
      session id never seen before is created by its first write.
    - Finish an interrupted turn: pass `session_id` and `message=None`. Lost
      tool results are repaired, then the loop continues; if the turn had
      already finished, its reply is returned without calling the LLM.

    - Retry a request safely: pass the caller's idempotency key as
      `request_key` with the message (an HTTP `Idempotency-Key`). It is stored
      with the user message; a `run()` repeating a key already stored does not
      start another turn: it finishes that turn (as `message=None` does) or,
      if later turns followed, returns its reply. A repeated key with another
      message is a `RequestKeyReusedError`.

    `tools` supplies or overrides handlers by tool name. `deps` reaches every
    handler as `ctx.deps`. `new_id` makes session and tool call ids (default:
    random UUIDs, drawn at call time).

    Raises, before any LLM call, `ConfigurationError` (bad agent, tools or
    arguments; `SessionNotFoundError` for `message=None` on an empty session)
    and `MessageTooLargeError` (a message over `agent.max_message_bytes`);
    later, `SessionConflictError` (another run wrote to the session first;
    nothing of this write landed) and `StoreError`. LLM failures do not raise:
    they end the run with status `"error"`. Tool failures are results.
    """
    make_id = new_id or _random_id
    if message is not None:
        _check_user_message(agent, session_id, message)
    if request_key is not None and message is None:
        raise ConfigurationError("request_key identifies a message; pass it with message=")
    bound = _bind_tools(agent, tools or {})
    if store is None:
        store = memory_store()
    if session_id is None:
        if message is None:
            raise ConfigurationError(
                "a new session needs a message (or pass an existing session_id)"
            )
        session = _Session(agent, store, make_id(), [], bound, deps, make_id)
    else:
        if not store.durable:
            raise MemoryStoreNotDurableError(session_id)
        history = await store.load_messages(session_id)
        if message is None and not history:
            raise SessionNotFoundError(session_id)
        session = _Session(agent, store, session_id, history, bound, deps, make_id)
        start = None if request_key is None or message is None else (
            session.find_request(request_key, message)
        )  # fmt: skip
        if start is not None:
            earlier = session.earlier_turn_result(start)
            if earlier is not None:
                return earlier
            message = None  # a retry of the last turn: finish it, as message=None does
    return await session.run(message, llm, request_key)


def _check_user_message(agent: Agent, session_id: str | None, message: object) -> None:
    if not isinstance(message, str):
        raise ConfigurationError(f"message must be a string, got {type(message).__name__}")
    size = len(message.encode())
    if size > agent.max_message_bytes:
        raise MessageTooLargeError(
            session_id or "(new session)",
            size,
            agent.max_message_bytes,
            "user",
            limit_name=f"max_message_bytes of agent {agent.name!r}",
        )


def _random_id() -> str:
    return uuid.uuid4().hex


def _bind_tools(agent: Agent, handlers: Mapping[str, Handler]) -> dict[str, Tool]:
    declared = {t.name: t for t in agent.tools}
    unknown = sorted(set(handlers) - set(declared))
    if unknown:
        raise ConfigurationError(
            f"handlers given for tools that agent {agent.name!r} does not declare: {unknown}; "
            f"declared: {sorted(declared)}"
        )
    bound = {
        name: t.with_handler(handlers[name]) if name in handlers else t
        for name, t in declared.items()
    }
    missing = sorted(name for name, t in bound.items() if t.handler is None)
    if missing:
        raise ConfigurationError(
            f"tools {missing} of agent {agent.name!r} have no handler; pass them as "
            "run(..., tools={name: handler})"
        )
    return bound


def pending_tool_calls(history: Sequence[Message]) -> list[ToolCall]:
    """The calls of the last assistant message that have no stored result (orphans).

    Only the last assistant message can hold them: every step stores its results
    before the next LLM call, so an earlier step's calls are always answered.
    """
    for index in range(len(history) - 1, -1, -1):
        message = history[index]
        if message.role == "assistant":
            answered = {m.tool_call_id for m in history[index + 1 :] if m.role == "tool"}
            return [c for c in message.tool_calls if c.id not in answered]
    return []


def idempotency_key(session_id: str, tool_call_id: str) -> str:
    """The key handed to a tool call's handler: stable per call, distinct across calls."""
    digest = hashlib.sha256(f"{session_id}\x00{tool_call_id}".encode()).hexdigest()
    return f"da-{digest[:40]}"


def _error_result(kind: str, text: str) -> str:
    return json.dumps({"error": text, "kind": kind}, ensure_ascii=False)


class _Session:
    """One run's view of a session: the loaded history and the next position to write."""

    def __init__(
        self,
        agent: Agent,
        store: Store,
        session_id: str,
        history: list[Message],
        tools: dict[str, Tool],
        deps: Any,
        new_id: Callable[[], str],
    ) -> None:
        self.agent = agent
        self.store = store
        self.session_id = session_id
        self.history = history
        self.tools = tools
        self.deps = deps
        self.new_id = new_id
        self.system = Message.system(agent.instructions)
        self.specs = [t.spec for t in tools.values()]
        self.call_ids = {c.id for m in history for c in m.tool_calls}

    def find_request(self, request_key: str, message: str) -> int | None:
        """The position of the user message stored with `request_key`, if any."""
        for index, stored in enumerate(self.history):
            if stored.role == "user" and stored.request_key == request_key:
                if stored.content != message:
                    raise RequestKeyReusedError(self.session_id, request_key)
                return index
        return None

    def earlier_turn_result(self, start: int) -> RunResult | None:
        """The result of the turn begun at `start`, if later turns followed it (else None)."""
        end = next((i for i, m in enumerate(self.history) if i > start and m.role == "user"), None)
        if end is None:
            return None
        reply = next((m.content for m in reversed(self.history[start:end]) if m.is_final_reply), "")
        return self.result("complete", reply, 0, Usage())

    async def run(self, message: str | None, llm: LLM, request_key: str | None = None) -> RunResult:
        orphans = pending_tool_calls(self.history)
        if orphans:
            await self.append(await self.dispatch(orphans, resuming=True))
        if message is None and self.history[-1].is_final_reply:
            return self.result("complete", self.history[-1].content, 0, Usage())

        unstored = (
            [Message("user", message, request_key=request_key)] if message is not None else []
        )
        steps, usage = 0, Usage()
        while steps < self.agent.max_steps:
            try:
                response = await llm.chat([self.system, *self.history, *unstored], self.specs)
                if not isinstance(response, LLMResponse):
                    raise TypeError(f"chat() returned {type(response).__name__}, not LLMResponse")
            except Exception as exc:  # an LLM failure ends the run; the history stays consistent
                return self.result("error", "", steps, usage, f"{type(exc).__name__}: {exc}")
            steps += 1
            usage += response.usage or Usage()
            calls = self.assign_ids(response.tool_calls)
            assistant = Message.assistant(response.text, calls, response.usage)
            await self.append([*unstored, assistant])  # write #1, or the final write
            unstored = []
            if not calls:
                return self.result("complete", response.text, steps, usage)
            await self.append(await self.dispatch(calls))  # write #2
        return self.result("max_steps", "", steps, usage)

    async def append(self, messages: list[Message]) -> None:
        await self.store.append_messages_atomic(
            self.session_id, len(self.history), messages, agent_name=self.agent.name
        )
        self.history.extend(messages)

    def assign_ids(self, calls: Sequence[ToolCall]) -> list[ToolCall]:
        """Give every call an id unique in the session, so it can be matched to one result."""
        assigned = []
        for call in calls:
            if not call.id or call.id in self.call_ids:
                call = replace(call, id=f"call_{self.new_id()}")
            self.call_ids.add(call.id)
            assigned.append(call)
        return assigned

    async def dispatch(self, calls: list[ToolCall], *, resuming: bool = False) -> list[Message]:
        """One result per call, in call order. Handlers of one step run concurrently."""
        jobs = [self.result_content(call, resuming) for call in calls]
        contents = [await jobs[0]] if len(jobs) == 1 else await _all_or_crash(jobs)
        return [Message.tool_result(c, text) for c, text in zip(calls, contents, strict=True)]

    async def result_content(self, call: ToolCall, resuming: bool) -> str:
        if isinstance(call, MalformedToolCall):  # never run, so never a durability question
            return _error_result("invalid-arguments", call.arguments_error)
        tool = self.tools.get(call.name)
        if resuming and (tool is None or not tool.safe_to_retry):
            return ToolDurabilityError(call.name, call.id).to_content()
        if tool is None:
            return _error_result(
                "unknown-tool",
                f"There is no tool named {call.name!r}. Available tools: {sorted(self.tools)}.",
            )
        try:
            args = tool.parse_arguments(call.arguments)
        except ToolArgumentsError as exc:
            return _error_result(
                "invalid-arguments",
                f"Tool {call.name!r} was not run: its arguments are invalid: {exc}",
            )
        ctx = ToolContext(
            session_id=self.session_id,
            tool_call_id=call.id,
            tool_name=call.name,
            idempotency_key=idempotency_key(self.session_id, call.id),
            resumed=resuming,
            deps=self.deps,
        )
        assert tool.handler is not None  # _bind_tools guarantees it
        timer = asyncio.timeout(tool.timeout)
        try:
            value = tool.handler(args, ctx)
            if inspect.isawaitable(value):
                async with timer:
                    value = await value
        except Exception as exc:
            if isinstance(exc, TimeoutError) and timer.expired():
                return _error_result(
                    "tool-timeout",
                    f"Tool {call.name!r} did not finish within {tool.timeout} s and was "
                    "stopped; its effect may or may not have happened.",
                )
            return _error_result("tool-failed", f"Tool {call.name!r} failed: {_describe(exc)}")
        try:
            content = tool.encode_result(value)
        except ValueError as exc:
            return _error_result(
                "invalid-output",
                f"Tool {call.name!r} ran, but its result does not match its output schema: {exc}",
            )
        size = len(content.encode())
        if size > self.agent.max_result_bytes:
            return _error_result(
                "result-too-large",
                f"Tool {call.name!r} ran, but its result ({size:,} bytes) is over the "
                f"{self.agent.max_result_bytes:,}-byte limit and was not stored. Ask for less "
                "(a smaller page or a narrower query).",
            )
        return content

    def result(
        self, status: RunStatus, response: str, steps: int, usage: Usage, error: str | None = None
    ) -> RunResult:
        return RunResult(
            status=status,
            response=response,
            session_id=self.session_id,
            messages=[self.system, *self.history],
            steps=steps,
            usage=usage,
            error=error,
        )


def _describe(exc: Exception) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def _all_or_crash(jobs: list[Coroutine[Any, Any, str]]) -> list[str]:
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
