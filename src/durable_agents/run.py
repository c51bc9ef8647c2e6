"""The durable agent loop. The at-most-once contract lives here and only here.

One turn, as stored (every arrow is one atomic, conditional append):

    load history ─► repair orphans ──────────────► (one write: a result for every orphan)
    loop:
      LLM call
      ├─ tool calls ─► write #1: [user message of the turn, if not yet stored] + assistant(calls)
      │                handlers run (concurrently)
      │                write #2: the results of the calls that ran, in call order (a call
      │                that waits for approval is answered by a later write, after its decision)
      └─ text only ──► final write: [user message, if not yet stored] + assistant(text)

A durable run first takes the session's lease (one conditional write, renewed by
every append and released by the turn's last), so a second run waits instead of
repairing live calls; why write #1 comes before any handler, what an orphan
gets, and every crash window: docs/contract.md.

This module keeps the turn's writes and their order; what happens between them
has a module of its own: the calls' handlers and results (`_turn.tool_execution`),
approvals at resume (`_turn.approval_settling`), typed answers (`_turn.output_retries`),
calls deferred to a fresh Workers invocation (`_turn.deferral`), the lease
(`_turn.leases`), ids (`_turn.ids`), the append itself (`_turn.session_log`), compaction
(`_turn.compaction`), the LLM call (`_turn.llm_call`) and the turn's tools and
instructions (`_turn.setup`). The guide: docs/contract.md.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import budget
from ._turn.approval_settling import ApprovalSettler
from ._turn.compaction import Compactor
from ._turn.deferral import DEFERRED_REASON as DEFERRED_REASON  # re-exported: it lived here first
from ._turn.deferral import deferral_events
from ._turn.delegation import AgentRunner, Delegation, LocalAgent, delegation_for
from ._turn.ids import CallIds, random_id
from ._turn.ids import idempotency_key as idempotency_key  # re-exported: it lived here first
from ._turn.leases import RunLease, release_left_lease, take_lease
from ._turn.llm_call import ask_unless_cancelled, processed
from ._turn.output_retries import OutputRetries, output_schema
from ._turn.run_result import RunResult, RunStatus
from ._turn.session_log import SessionLog
from ._turn.setup import (
    RunClient,
    Setup,
    add_toolset_tools,
    bind_tools,
    checked_message,
    instructions_for_turn,
    turn_instructions,
)
from ._turn.tool_execution import ToolExecutor
from .agent import Agent, OutputT
from .approvals import ApprovalState, PendingApproval, approval_states
from .errors import (
    ConfigurationError,
    MemoryStoreNotDurableError,
    MessageTooLargeError,
    RequestKeyReusedError,
    SessionNotFoundError,
    ToolDurabilityError,
    ToolsetError,
    describe_exception,
)
from .events import CancelToken, EventReporter, OnEvent, RunFinished
from .llm.base import LLM
from .messages import (
    LLMResponse,
    Message,
    MessageOrigin,
    ParentCall,
    ToolCall,
    ToolErrorKind,
    ToolSpec,
    Usage,
    tool_error_content,
)
from .messages import (
    pending_tool_calls as pending_tool_calls,  # re-exported: it lived here first
)
from .stores.base import ApprovalChange, Store
from .tools import DepsT, Handler, RunContext, Tool

if TYPE_CHECKING:
    import httpx

__all__ = [
    "DEFERRED_REASON",
    "RunResult",
    "RunStatus",
    "idempotency_key",
    "pending_tool_calls",
    "run",
    "stop_reason",
    "stop_turn",
]


async def run(
    agent: Agent[DepsT, OutputT],
    *,
    llm: LLM,
    message: str | None = None,
    session_id: str | None = None,
    store: Store | None = None,
    tools: Mapping[str, Handler] | None = None,
    deps: DepsT | None = None,
    new_id: Callable[[], str] | None = None,
    request_key: str | None = None,
    lease_seconds: float | None = 30.0,
    wait_seconds: float = 30.0,
    on_event: OnEvent | None = None,
    cancel: CancelToken | None = None,
    session_name: str | None = None,
    origin: MessageOrigin | None = None,
    clock: Callable[[], float] | None = None,
    settings: Mapping[str, str] | None = None,
    http: httpx.AsyncClient | None = None,
    agents: AgentRunner | Mapping[str, Agent[Any, Any] | LocalAgent] | None = None,
    parent_call: ParentCall | None = None,
    _lease_run_id: str | None = None,
) -> RunResult[OutputT]:
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

    - Run one session from several places (processes, tasks): a durable run
      takes the session's lease first and holds it for the turn, renewed by
      each write; another run waits up to `wait_seconds`, then raises
      `SessionBusyError`. A lease left by a dead run expires after
      `lease_seconds` (at once if its process ran on this host); a step's
      write #1 extends it by the longest `timeout` of the step's tools, so
      give slow side-effecting tools a `timeout`. `lease_seconds=None` takes
      no lease, for a caller that already runs one turn at a time per session
      (the Worker's Durable Object does).

    - Watch it go: `on_event(event)` (a function or a coroutine function) gets
      a `TextDelta` for each piece of the reply's text (the LLM streams when
      it has `stream()`, as every adapter of the kit does), a
      `MessageStored(position, message)` for each message once its write has
      landed, and last a `RunFinished(result)` (see `durable_agents.events`).
      It adds no write. If `on_event` raises, the error is logged and it is
      not called again: a watcher never breaks a turn.
    - Stop it: `cancel=CancelToken()`, then `token.cancel()`. The run stops
      at its next step boundary with status `"cancelled"`: an LLM call in
      progress is abandoned, a step whose write #1 landed first runs its
      handlers and stores their results. `message=None` goes on from there.

    `session_name` is stored with a new session (the write that creates it)
    and never changed after; default: the session id. Listings show it and
    `store.find_sessions(name)` finds the session by it.

    `origin` marks every message this run stores (`Message.origin`): the kit
    passes "scheduled" when it fires a schedule and "self-resumed" when it
    resumes a turn nobody asked it to. `clock` (seconds; default `time.time`,
    read at call time) dates what handlers schedule (`ToolContext.schedule`)
    and is the turn's `RunContext.now`.

    `settings` (default `os.environ`) and `http` reach the turn's `RunContext`:
    what `agent.instructions` (a function) and `agent.toolsets` read. In a
    Worker the kit passes the agent module's settings from `env` and its
    client over `fetch`. Without `http`, a run of an agent with toolsets makes
    a client for them and closes it when it returns.

    `agents` are the agents its agent tools (`agent_tool`) call, by name: `Agent`s
    or `LocalAgent`s (an agent with its own LLM, deps or tools), each child turn a
    `run()` on the same store, the LLM the parent's unless given; or an
    `AgentRunner` that runs them elsewhere. See `durable_agents.agent_tools`.
    `parent_call` is what an `AgentRunner` passes for a child turn: the parent's call
    it answers, stored on the turn's user message (`Message.parent_call`), every message
    of the run marked origin "agent-tool", so the child session links back to it.

    `tools` supplies or overrides handlers by tool name. `deps` reaches every
    handler as `ctx.deps`. `new_id` makes session and tool call ids (default:
    random UUIDs, drawn at call time).

    `_lease_run_id` is the kit's own plumbing (`durable_agents.worker`): the
    lease owner is `host/pid/<_lease_run_id>` instead of a random one, so a
    caller that took the lease under that owner first keeps it (and can read
    what it wrote there if this process dies).

    Raises, before any LLM call, `ConfigurationError` (bad agent, tools or
    arguments; `SessionNotFoundError` for `message=None` on an empty session),
    `MessageTooLargeError` (a message over `agent.max_message_bytes`) and
    `ApprovalPendingError` (a new message while calls wait for approval, the
    session's own or an agent tool's child's);
    later, `SessionBusyError`, `SessionConflictError` (another run wrote to
    the session first; nothing of this write landed) and `StoreError`. LLM failures do not raise:
    they end the run with status `"error"`. Tool failures are results.
    """
    events = EventReporter(on_event)
    if parent_call is not None:
        if message is None or origin is not None:
            raise ConfigurationError("parent_call goes with a message= and no origin=")
        origin = "agent-tool"
    message = checked_message(agent, session_id, message, request_key, origin)
    if store is None:
        from .stores.memory import memory_store  # a Worker's store is never in memory

        store = memory_store()
    delegation = delegation_for(
        agent, agents, store=store, llm=llm, run=run, events=events, cancel=cancel
    )
    client = RunClient(http)
    options = _TurnOptions(
        agent, bind_tools(agent, tools or {}), deps, new_id or random_id, events, cancel,
        session_name, origin, clock or time.time,
        Setup(os.environ if settings is None else settings, client), delegation, parent_call,
    )  # fmt: skip
    try:
        result = await _run(
            options, llm, message, session_id, store, request_key, lease_seconds,
            wait_seconds, _lease_run_id,
        )  # fmt: skip
    finally:
        await client.aclose()  # the one it made for the toolsets, if any
    await events.emit(RunFinished(result))
    return result


@dataclass(frozen=True, slots=True)
class _TurnOptions:
    """What `run()` was given that every part of the turn reads."""

    agent: Agent[Any, Any]
    tools: dict[str, Tool]
    deps: Any
    new_id: Callable[[], str]
    events: EventReporter = field(default_factory=lambda: EventReporter(None))
    cancel: CancelToken | None = None
    name: str | None = None  # stored by the append that creates the session
    origin: MessageOrigin | None = None  # stamped on every message it stores
    clock: Callable[[], float] = time.time
    setup: Setup = field(default_factory=lambda: Setup(os.environ, RunClient(None)))
    delegation: Delegation | None = None  # for agent tools (`run(agents=)`)
    parent_call: ParentCall | None = None  # the agent-tool call a child turn answers


async def _run(
    options: _TurnOptions,
    llm: LLM,
    message: str | None,
    session_id: str | None,
    store: Store,
    request_key: str | None,
    lease_seconds: float | None,
    wait_seconds: float,
    lease_run_id: str | None,
) -> RunResult[Any]:
    """The turn `run()` asked for, its arguments checked: on a new session, the last turn
    read back if it has ended, or the turn run under the session's lease."""
    if session_id is None:
        if message is None:
            raise ConfigurationError(
                "a new session needs a message (or pass an existing session_id)"
            )
        turn = _Turn(options, store, options.new_id(), [])
        return await turn.run(message, llm, request_key)
    if not store.durable:
        raise MemoryStoreNotDurableError(session_id)
    if message is None:  # reading a finished turn back needs no lease
        finished = await _finished_turn(options, store, session_id)
        if finished is not None:
            return finished
    lease = None
    if lease_seconds is not None:
        run_id = lease_run_id or random_id()
        lease = await take_lease(store, session_id, run_id, lease_seconds, wait_seconds)
    try:
        return await _leased_run(options, llm, store, session_id, lease, message, request_key)
    finally:
        await release_left_lease(store, session_id, lease)


async def _finished_turn(
    options: _TurnOptions, store: Store, session_id: str
) -> RunResult[Any] | None:
    """The result of the session's last turn if it has ended (for `message=None`)."""
    base, history = await store.load_context(session_id)
    if not history:
        raise SessionNotFoundError(session_id)
    if not history[-1].is_final_reply:
        return None
    plain = _TurnOptions(options.agent, options.tools, options.deps, options.new_id)
    turn = _Turn(plain, store, session_id, history, base=base)
    return turn.result("complete", history[-1].content, 0, Usage())


async def _leased_run(
    options: _TurnOptions,
    llm: LLM,
    store: Store,
    session_id: str,
    lease: RunLease | None,
    message: str | None,
    request_key: str | None,
) -> RunResult[Any]:
    """The turn of an existing session, run under its lease (if the run takes one)."""
    # Loaded under the lease: whatever the previous holder stored is in it. Only
    # what the turn needs: the latest summary's tail (`context`), however long
    # the history.
    base, history = await store.load_context(session_id)
    if message is None and not history:
        raise SessionNotFoundError(session_id)
    turn = _Turn(options, store, session_id, history, base=base, lease=lease)
    start = None if request_key is None or message is None else (
        await turn.find_request(request_key, message)
    )  # fmt: skip
    if start is not None:
        earlier = await turn.earlier_turn_result(start)
        if earlier is not None:
            return earlier
        message = None  # a retry of the last turn: finish it, as message=None does
    return await turn.run(message, llm, request_key)


async def stop_turn(
    agent: Agent[Any],
    *,
    store: Store,
    session_id: str,
    reason: str,
    lease_seconds: float | None = 30.0,
    wait_seconds: float = 30.0,
) -> RunResult:
    """End the session's unfinished turn without running anything more, in one write:
    each call of its last step still without a result is answered as lost (a
    `tool-durability-error`, safe_to_retry or not: running them again is what kept
    failing), or as not run (`tool-denied`) if it only waited for a person's decision;
    then an assistant message with origin "stopped" says why (`reason`, e.g.
    `stop_reason(n)`). For a turn whose resumes keep crashing; the next message starts
    a new turn. A turn that has ended already is left as it is (status "complete")."""
    lease = None
    if lease_seconds is not None:
        lease = await take_lease(store, session_id, random_id(), lease_seconds, wait_seconds)
    try:
        base, history = await store.load_context(session_id)
        if not history:
            raise SessionNotFoundError(session_id)
        options = _TurnOptions(agent, {}, None, random_id)
        turn = _Turn(options, store, session_id, history, base=base, lease=lease)
        if history[-1].is_final_reply:  # (the lease goes in `finally`)
            return turn.result("complete", history[-1].content, 0, Usage())
        states = approval_states(await store.load_approvals(session_id))
        lost = [
            Message.tool_result(c, _stopped(c, states.get(c.id)))
            for c in pending_tool_calls(history)
        ]
        note = Message("assistant", reason, origin="stopped")
        await turn.log.append([*lost, note], release=True)
        return turn.result("error", "", 0, Usage(), reason, error_code="turn-stopped")
    finally:
        await release_left_lease(store, session_id, lease)


def stop_reason(resumes: int) -> str:
    """The note `stop_turn` stores when the kit gives up on a turn after `resumes`
    self-resumes (the session's Durable Object alarm, or `durable-agents worker`)."""
    return (
        f"This turn was stopped by durable-agents: it was resumed {resumes} times and each "
        "time the process running it stopped before the turn ended (a crash, a reset or "
        "running out of memory or time). Nothing more of it was run; calls without a result "
        "are marked as lost (tool-durability-error). Send a new message to go on."
    )


def _stopped(call: ToolCall, approval: ApprovalState | None) -> str:
    """What `stop_turn` answers a call without a result: it may have run (lost), or it
    certainly did not (it waited for a person's decision, or was denied: never claimed)."""
    if approval is not None and not approval.claimed:
        return tool_error_content(
            ToolErrorKind.TOOL_DENIED,
            f"Tool {call.name!r} was not run: its turn was stopped while the call "
            f"{'waited for a decision' if approval.decision is None else 'was decided'}.",
        )
    return ToolDurabilityError(
        call.name,
        call.id,
        f"Tool '{call.name}' (call {call.id}) was requested, but its turn was stopped before "
        "its result was stored: it may or may not have taken effect, and it was not run "
        "again. Check whether the effect happened before trying again, or ask the user.",
    ).to_content()


class _Stopped(Exception):
    """Stop at this step boundary: cancelled, or the session's budget is spent."""

    def __init__(self, status: RunStatus, reason: str | None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(slots=True)
class _Tally:
    """This run's LLM calls and their tokens so far."""

    steps: int = 0
    usage: Usage = field(default_factory=Usage)


class _Turn:
    """One run of a turn: the loop of steps, and the writes each step makes in order.

    The session's loaded history and its appends are `log`; the calls' handlers
    `executor`; approvals at resume `settler`; typed answers `output`."""

    def __init__(
        self,
        options: _TurnOptions,
        store: Store,
        session_id: str,
        history: list[Message],
        *,
        base: int = 0,
        lease: RunLease | None = None,
    ) -> None:
        agent = self.agent = options.agent
        self.options = options
        self.cancel = options.cancel
        self.log = SessionLog(
            store, agent.name, session_id, history, base=base, lease=lease,
            events=options.events, name=options.name, origin=options.origin, clock=options.clock,
        )  # fmt: skip
        fixed = agent.instructions if isinstance(agent.instructions, str) else None
        self.system = Message.system(
            fixed if fixed is not None else turn_instructions(history) or ""
        )
        # A function's instructions for the turn this run starts: stored with its message.
        self.instructions: str | None = None
        schema = output_schema(agent.output_type) if agent.output_type is not None else None
        self.output = OutputRetries(schema, agent.max_output_retries, self.log)
        self.ids = CallIds(history, options.new_id)
        # The Workers invocation's budget (None on CPython): a step's calls that do not
        # fit it are deferred to a fresh invocation (`durable_agents.budget`).
        invocation = budget.current()
        self.executor = ToolExecutor(
            agent, options.tools, self.log, self.output,
            deps=options.deps, new_id=options.new_id, clock=options.clock, budget=invocation,
            delegation=options.delegation,
        )  # fmt: skip
        self.settler = ApprovalSettler(
            self.log, self.executor, self.output, invocation, agent.max_tool_calls_per_step
        )
        self.compactor = Compactor(agent, self.log)
        self.specs = self.tool_specs()

    def tool_specs(self) -> list[ToolSpec]:
        specs = [t.spec for t in self.executor.tools.values()]
        schema = self.output.schema
        return specs if schema is None else [*specs, schema.spec]

    async def prepare(self, message: str | None) -> None:
        """The turn's tools and instructions: its toolsets listed (ToolsetError if one
        cannot be), and a function's instructions made for a new turn, or read back
        from the turn's first write when it is resumed."""
        agent = self.agent
        if not agent.toolsets and isinstance(agent.instructions, str):
            return
        options = self.options
        now = datetime.datetime.fromtimestamp(options.clock(), datetime.UTC)
        client = options.setup.client
        ctx: RunContext[Any] = RunContext(
            self.log.session_id, options.name, now, options.deps, options.setup.settings,
            client.for_toolsets() if agent.toolsets else client.given,
        )  # fmt: skip
        if not isinstance(agent.instructions, str):
            text, self.instructions = await instructions_for_turn(
                agent, ctx, self.log.history, message
            )
            self.system = Message.system(text)
        has_output = self.output.schema is not None
        await add_toolset_tools(agent, ctx, self.executor.tools, has_output=has_output)
        self.specs = self.tool_specs()

    def user_message(self, message: str, request_key: str | None) -> Message:
        """The message that starts the turn, with the instructions made for it."""
        parent = self.options.parent_call
        return Message(
            "user", message, tool_call_id=None if parent is None else parent.key,
            request_key=request_key, instructions=self.instructions,
        )  # fmt: skip

    async def find_request(self, request_key: str, message: str) -> int | None:
        """The position of the user message stored with `request_key`, if any."""
        found = await self.log.store.find_request(self.log.session_id, request_key)
        if found is None:
            return None
        position, content = found
        if content != message:
            raise RequestKeyReusedError(self.log.session_id, request_key)
        return position

    async def earlier_turn_result(self, start: int) -> RunResult | None:
        """The result of the turn begun at `start`, if later turns followed it (else None)."""
        log = self.log
        if start >= log.base:
            turn = log.history[start - log.base :]
        else:  # before the loaded tail: a retry of a turn the context has moved past
            turn = await log.store.load_messages(log.session_id, start=start)
        end = next((i for i, m in enumerate(turn) if i > 0 and m.role == "user"), None)
        if end is None:
            return None
        reply = next((m.content for m in reversed(turn[:end]) if m.is_final_reply), "")
        return self.result("complete", reply, 0, Usage())

    async def run(self, message: str | None, llm: LLM, request_key: str | None = None) -> RunResult:
        started = await self.start(message, request_key)
        if started is not None:
            return started
        unstored = [self.user_message(message, request_key)] if message is not None else []
        tally = _Tally()
        while tally.steps < self.agent.max_steps:
            response = await self.next_reply(llm, unstored, tally)
            if isinstance(response, RunResult):
                return response
            tally.steps += 1
            tally.usage += response.usage or Usage()
            ended = await self.step(response, unstored, tally)
            if ended is not None:
                return ended
        return self.result("max_steps", "", tally.steps, tally.usage)

    async def start(self, message: str | None, request_key: str | None) -> RunResult | None:
        """Make the turn ready: its tools and instructions, then the last step's calls
        without a result answered (orphan repair, decided approvals). A result if the
        run ends there."""
        try:
            await self.prepare(message)
        except ToolsetError as exc:
            if message is not None:  # keep the turn's message, as for a failed LLM call
                await self.log.append([self.user_message(message, request_key)], release=True)
            # "configuration" (a setting to set) or "toolset-error" (its server, its code)
            error = str(exc) if exc.code == "configuration" else describe_exception(exc)
            return self.result("error", "", 0, Usage(), error, error_code=exc.code)
        orphans = pending_tool_calls(self.log.history)
        if orphans:
            waiting = await self.settler.settle(orphans, message)
            if waiting:
                return self.result("awaiting_approval", "", 0, Usage(), pending=waiting)
            if self.settler.deferred_left:
                return self.result("deferred", "", 0, Usage())
        if message is None and self.log.history[-1].is_final_reply:
            return self.result("complete", self.log.history[-1].content, 0, Usage())
        return None

    async def next_reply(
        self, llm: LLM, unstored: list[Message], tally: _Tally
    ) -> LLMResponse | RunResult:
        """The LLM's reply for the next step, or the run's result if it ends here."""
        try:
            # A step boundary: every write so far has landed, none is due.
            if self.cancel is not None and self.cancel.cancelled:
                raise _Stopped("cancelled", self.cancel.reason)
            await self.check_budget()
            nudge = self.output.nudge
            tally.usage += await self.compactor.compact(
                llm, self.system, unstored, nudge, self.specs
            )
            sent = self.compactor.window(self.system, [*unstored, *nudge] if nudge else unstored)
            messages = await processed(self.agent, sent)
            response = await ask_unless_cancelled(
                llm, messages, self.specs, self.log.events, self.cancel
            )
            if response is None:
                assert self.cancel is not None
                raise _Stopped("cancelled", self.cancel.reason)
            return response
        except _Stopped as stop:
            # keep the turn's message, so message=None can finish the turn
            return await self.ended(unstored, stop.status, tally, stop.reason)
        except Exception as exc:  # an LLM failure ends the run; the history stays consistent
            # The turn's first call failed for good: keep its message (one
            # write, on this path only), so message=None can finish the turn.
            error = f"{type(exc).__name__}: {exc}"
            return await self.ended(unstored, "error", tally, error, error_code="llm-error")

    async def step(
        self, response: LLMResponse, unstored: list[Message], tally: _Tally
    ) -> RunResult | None:
        """Store the reply (write #1, or the final write), run its calls and store their
        results (write #2). The run's result if the turn ends or waits here."""
        calls = [
            self.executor.with_policy(c)
            for c in self.ids.assign(response.tool_calls, self.log.base)
        ]
        text = response.text
        if not calls and self.output.schema is not None:  # a text answer: is it a valid one?
            try:
                text = self.output.text_answer(response.text)
            except ValueError as exc:
                if self.output.may_retry():
                    self.output.send_back(response, str(exc))
                    return None
                error = self.output.gave_up_error(str(exc))
                return await self.ended(
                    unstored, "error", tally, error, error_code="invalid-output"
                )
        assistant = Message.assistant(text, calls, self.output.stored_usage(response.usage))
        self.output.nudge = []
        gated = self.settler.needing_approval(calls)
        free = [c for c in calls if c.id not in gated]
        too_large = await self.store_reply(unstored, assistant, gated, free, tally)
        if too_large is not None:
            return too_large
        unstored.clear()
        if not calls:
            return self.result("complete", text, tally.steps, tally.usage)
        return await self.run_calls(calls, gated, free, tally)

    async def store_reply(
        self,
        unstored: list[Message],
        assistant: Message,
        gated: dict[str, ApprovalChange],
        free: list[ToolCall],
        tally: _Tally,
    ) -> RunResult | None:
        """Write #1 (with the approval requests; the lease held through the handlers'
        timeouts), or the final write. A result if the store cannot hold the reply."""
        try:
            await self.log.append(
                [*unstored, assistant],
                hold=self.executor.step_seconds(free),
                release=not free,
                approvals=list(gated.values()),
            )
        except MessageTooLargeError as exc:
            if exc.role != "assistant":
                raise
            # The store cannot hold this reply; nothing of it landed. Keep
            # the turn's message, as for a failed LLM call: message=None or
            # a new message goes on from there.
            error = (
                f"the model's reply ({exc.size:,} bytes of text and tool calls) is over "
                f"the store's {exc.limit:,}-byte limit for one message and was not kept"
            )
            return await self.ended(
                unstored, "error", tally, error, error_code="llm-response-too-large"
            )
        return None

    async def run_calls(
        self,
        calls: list[ToolCall],
        gated: dict[str, ApprovalChange],
        free: list[ToolCall],
        tally: _Tally,
    ) -> RunResult | None:
        """Run the calls that need no approval and store their results (write #2). A
        result if the turn ends (an accepted answer), waits or is deferred here."""
        deferred: list[ToolCall] = []
        pending = [
            PendingApproval(c.id, c.name, dict(c.arguments), gated[c.id].digest)
            for c in calls
            if c.id in gated
        ]
        if free:  # write #2 (of the calls that need no approval, when some do)
            results = await self.executor.dispatch(free, budgeted=True)
            deferred = self.executor.unstarted  # over the invocation's budget: never started
            pending += self.executor.waiting_of(free)  # their child turns wait for a person
            final = self.output.final_answer()  # an accepted final_result ends the turn here
            gave_up = self.output.exhausted()
            last = tally.steps >= self.agent.max_steps or bool(pending) or bool(deferred)
            stored = [*results, *final]
            deferrals = deferral_events(self.log.session_id, deferred)
            if stored or deferrals:  # (nothing when the step's one call waits for its child)
                await self.log.append(
                    stored, release=last or bool(final) or gave_up, approvals=deferrals
                )
            if final:
                return self.result("complete", final[0].content, tally.steps, tally.usage)
            if gave_up:
                error = self.output.gave_up_error("see the last final_result result")
                return self.result(
                    "error", "", tally.steps, tally.usage, error, error_code="invalid-output"
                )
        if pending:
            return self.result("awaiting_approval", "", tally.steps, tally.usage, pending=pending)
        if deferred:
            return self.result("deferred", "", tally.steps, tally.usage)
        return None

    async def ended(
        self,
        unstored: list[Message],
        status: RunStatus,
        tally: _Tally,
        error: str | None,
        *,
        error_code: str | None = None,
    ) -> RunResult:
        """The run's result when it ends before its reply is stored; the turn's message,
        if not stored yet, is (one write, releasing the lease), so message=None can
        finish the turn."""
        if unstored:
            await self.log.append(unstored, release=True)
        return self.result(status, "", tally.steps, tally.usage, error, error_code=error_code)

    async def check_budget(self) -> None:
        """Stop before an LLM call once the session's stored usage reaches its limit."""
        limit = self.agent.max_session_tokens
        if limit is None:
            return
        log = self.log
        if log.tokens_used is None:  # the session's totals, kept by its appends
            info = await log.store.get_session(log.session_id)
            log.tokens_used = 0 if info is None else info.input_tokens + info.output_tokens
        used = log.tokens_used
        if used >= limit:
            raise _Stopped(
                "budget_exceeded",
                f"session {log.session_id} has used {used:,} tokens, at or over its limit of "
                f"{limit:,} (max_session_tokens); raise it to go on with message=None",
            )

    def result(
        self,
        status: RunStatus,
        response: str,
        steps: int,
        usage: Usage,
        error: str | None = None,
        *,
        pending: list[PendingApproval] | None = None,
        error_code: str | None = None,
    ) -> RunResult:
        return RunResult(
            status=status,
            response=response,
            session_id=self.log.session_id,
            messages=[self.system, *self.log.history],
            steps=steps,
            usage=usage,
            error=error,
            pending=pending or [],
            error_code=error_code,
            output=self.output.output_of(response) if status == "complete" else None,
        )
