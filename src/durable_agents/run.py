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

Leases. Two runs of one session at once cannot both store a step (every
append is conditional), but the second would see the first's in-flight call
as an orphan and repair it. So a durable run first takes the session's lease
(one conditional write, the turn's only extra one): a second run waits for it
(up to `wait_seconds`, then `SessionBusyError`) instead of repairing live
calls. Every append renews the lease in its own transaction and the turn's
last write releases it, so holding it costs no write per step. A lease left
by a run that died expires after `lease_seconds`, at once if that process
ran on this host, and the next run repairs as usual.

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
import contextlib
import datetime
import hashlib
import inspect
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, Literal

import httpx

from . import _json, _timeouts, context
from . import budget as _budget
from .agent import Agent, OutputT
from .approvals import (
    ApprovalState,
    PendingApproval,
    approval_digest,
    approval_states,
    waiting_calls,
)
from .errors import (
    ApprovalPendingError,
    ConfigurationError,
    DurableAgentsError,
    MemoryStoreNotDurableError,
    MessageTooLargeError,
    ModelRetry,
    RequestKeyReusedError,
    SessionBusyError,
    SessionNotFoundError,
    ToolArgumentsError,
    ToolDurabilityError,
    ToolFailure,
    ToolsetError,
    describe_exception,
)
from .events import CancelToken, MessageStored, OnEvent, RunEvent, RunFinished
from .llm.base import LLM
from .messages import (
    CALL_ID,
    ORIGINS,
    OUTPUT_TOOL,
    LLMResponse,
    MalformedToolCall,
    Message,
    MessageOrigin,
    TextDelta,
    ToolCall,
    ToolErrorKind,
    ToolSpec,
    Usage,
    tool_error,
    tool_error_content,
)
from .messages import (
    pending_tool_calls as pending_tool_calls,  # re-exported: it lived here first
)
from .output import OutputSchema
from .schedules import ScheduleRoom, StepSchedules, room_left
from .stores.base import ApprovalChange, Lease, LeaseHolder, Schedule, Store
from .stores.memory import memory_store
from .tools import DepsT, Handler, RunContext, Tool, ToolContext, Toolset

RunStatus = Literal[
    "complete",
    "max_steps",
    "error",
    "awaiting_approval",
    "cancelled",
    "budget_exceeded",
    "deferred",
]

_log = logging.getLogger("durable_agents")
# The reason stored with a call the kit deferred to a fresh Workers invocation.
DEFERRED_REASON = (
    "deferred by durable-agents: over what this Workers invocation may still fetch; "
    "it runs in the next invocation"
)


@dataclass(frozen=True, slots=True)
class RunResult(Generic[OutputT]):
    """What `run()` returns.

    `status` is `"complete"` (the LLM gave a final reply, in `response`),
    `"max_steps"` (stopped after `agent.max_steps` LLM calls), `"error"`
    (the LLM call failed; `error` says why), `"awaiting_approval"` (calls
    of tools declared `requires_approval` wait for a person's decision; they
    are in `pending`, see `durable_agents.approvals`) or `"cancelled"` (its
    `CancelToken` was cancelled; it stopped at a step boundary) or
    `"budget_exceeded"` (the session's stored usage reached
    `agent.max_session_tokens` before an LLM call; `error` says how far) or
    `"deferred"` (inside a Workers invocation, `durable_agents.budget`: a step's
    calls did not all fit what the invocation may still fetch; those that did ran,
    the others are recorded as not started, and `message=None` in a fresh
    invocation runs them: the session's Durable Object does that at once).
    With `"error"`, `error_code` says which: `"llm-error"` (the call failed),
    `"llm-response-too-large"` (the reply is over the store's limit for one
    message, `MAX_ROW_BYTES`, so it was not kept), `"toolset-error"` (a toolset,
    e.g. an MCP server, could not list its tools) or `"invalid-output"` (the
    model's answer broke `agent.output_type` more than `max_output_retries`
    times). In every
    case but the first the stored history is consistent and
    `run(..., message=None)` continues the turn (once waiting calls are decided).
    `messages` is the whole conversation as the LLM sees it, system message
    first. `steps` counts this run's LLM calls and `usage` their tokens.
    `output` is the typed answer of an agent with `output_type` (status
    `"complete"`; None otherwise): the final message's JSON, validated.
    """

    status: RunStatus
    response: str
    session_id: str
    messages: list[Message]
    steps: int
    usage: Usage
    error: str | None = None
    pending: list[PendingApproval] = field(default_factory=list)
    error_code: str | None = None
    output: OutputT | None = None


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
    client over `fetch`.

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
    `ApprovalPendingError` (a new message while calls wait for approval);
    later, `SessionBusyError`, `SessionConflictError` (another run wrote to
    the session first; nothing of this write landed) and `StoreError`. LLM failures do not raise:
    they end the run with status `"error"`. Tool failures are results.
    """
    events = _Events(on_event)
    result = await _run(
        agent, llm, message, session_id, store, tools, deps, new_id, request_key,
        lease_seconds, wait_seconds, events, cancel, session_name, origin, clock, _lease_run_id,
        _Setup(os.environ if settings is None else settings, http),
    )  # fmt: skip
    await events.emit(RunFinished(result))
    return result


async def _run(
    agent: Agent[DepsT],
    llm: LLM,
    message: str | None,
    session_id: str | None,
    store: Store | None,
    tools: Mapping[str, Handler] | None,
    deps: DepsT | None,
    new_id: Callable[[], str] | None,
    request_key: str | None,
    lease_seconds: float | None,
    wait_seconds: float,
    events: _Events,
    cancel: CancelToken | None,
    session_name: str | None = None,
    origin: MessageOrigin | None = None,
    clock: Callable[[], float] | None = None,
    lease_run_id: str | None = None,
    setup: _Setup | None = None,
) -> RunResult[Any]:
    make_id = new_id or _random_id
    if origin is not None and origin not in ORIGINS:
        raise ConfigurationError(f"origin must be one of {ORIGINS} or None, got {origin!r}")
    if message is not None:
        _check_user_message(agent, session_id, message)
        message = _json.repair_text(message)  # stored as UTF-8: no lone surrogates
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
        session = _Session(agent, store, make_id(), [], bound, deps, make_id, None, events, cancel)
        session.name, session.origin, session.clock = session_name, origin, clock or time.time
        session.setup = setup or session.setup
        return await session.run(message, llm, request_key)
    if not store.durable:
        raise MemoryStoreNotDurableError(session_id)
    if message is None:  # reading a finished turn back needs no lease
        base, history = await store.load_context(session_id)
        if not history:
            raise SessionNotFoundError(session_id)
        if history[-1].is_final_reply:
            session = _Session(agent, store, session_id, history, bound, deps, make_id, base=base)
            return session.result("complete", history[-1].content, 0, Usage())
    lease = None
    if lease_seconds is not None:
        run_id = lease_run_id or _random_id()
        lease = await _take_lease(store, session_id, run_id, lease_seconds, wait_seconds)
    try:
        # Loaded under the lease: whatever the previous holder stored is in it. Only
        # what the turn needs: the latest summary's tail (`context`), however long
        # the history.
        base, history = await store.load_context(session_id)
        if message is None and not history:
            raise SessionNotFoundError(session_id)
        session = _Session(
            agent, store, session_id, history, bound, deps, make_id, lease, events, cancel,
            base=base,
        )  # fmt: skip
        session.name, session.origin, session.clock = session_name, origin, clock or time.time
        session.setup = setup or session.setup
        start = None if request_key is None or message is None else (
            await session.find_request(request_key, message)
        )  # fmt: skip
        if start is not None:
            earlier = await session.earlier_turn_result(start)
            if earlier is not None:
                return earlier
            message = None  # a retry of the last turn: finish it, as message=None does
        return await session.run(message, llm, request_key)
    finally:
        if lease is not None and not lease.released:
            # Off the happy path (an error, a crash in this process, a lost
            # race): the turn's last write did not release it. Best effort: a
            # lease that stays behind expires.
            with contextlib.suppress(Exception):
                await store.release_lease(session_id, lease.owner)


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
        lease = await _take_lease(store, session_id, _random_id(), lease_seconds, wait_seconds)
    try:
        base, history = await store.load_context(session_id)
        if not history:
            raise SessionNotFoundError(session_id)
        session = _Session(
            agent, store, session_id, history, {}, None, _random_id, lease, base=base
        )
        if history[-1].is_final_reply:  # (the lease goes in `finally`)
            return session.result("complete", history[-1].content, 0, Usage())
        states = approval_states(await store.load_approvals(session_id))
        lost = [
            Message.tool_result(c, _stopped(c, states.get(c.id)))
            for c in pending_tool_calls(history)
        ]
        note = Message("assistant", reason, origin="stopped")
        await session.append([*lost, note], release=True)
        return session.result("error", "", 0, Usage(), reason, error_code="turn-stopped")
    finally:
        if lease is not None and not lease.released:
            with contextlib.suppress(Exception):
                await store.release_lease(session_id, lease.owner)


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


@dataclass(slots=True)
class _RunLease:
    owner: str
    ttl_ms: int
    released: bool = False


async def _take_lease(
    store: Store, session_id: str, run_id: str, lease_seconds: float, wait_seconds: float
) -> _RunLease:
    """Take the session's lease, waiting (bounded) while another live run holds it."""
    if lease_seconds <= 0 or wait_seconds < 0:
        raise ConfigurationError("lease_seconds must be > 0 and wait_seconds >= 0")
    lease = _RunLease(_lease_owner(run_id), int(lease_seconds * 1000))
    started = time.monotonic()
    delay = 0.005
    take_from: str | None = None
    while True:
        holder = await store.acquire_lease(
            session_id, lease.owner, lease.ttl_ms, take_from=take_from
        )
        if holder is None:
            return lease
        take_from = holder.owner if _died_on_this_host(holder) else None
        if take_from is not None:
            continue  # its process is gone: take the lease over now, not at expiry
        waited = time.monotonic() - started
        if waited >= wait_seconds:
            raise SessionBusyError(session_id, holder.owner, holder.expires_at, waited)
        await asyncio.sleep(min(delay, wait_seconds - waited))
        delay = min(delay * 2, 0.25)


def _lease_owner(run_id: str) -> str:
    """The lease owner of a run of this process: `host/pid/run_id` (`_died_on_this_host`)."""
    return f"{socket.gethostname()}/{os.getpid()}/{run_id}"


def _died_on_this_host(holder: LeaseHolder) -> bool:
    """Whether the lease's owner was a process on this host that no longer runs."""
    host, _, rest = holder.owner.partition("/")
    pid_text = rest.partition("/")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (OSError, AttributeError):  # not ours to signal, or no signals here
        return False
    try:  # a killed child its parent has not reaped yet is a zombie: dead
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].startswith("Z")


def _check_user_message(agent: Agent[Any], session_id: str | None, message: object) -> None:
    if not isinstance(message, str):
        raise ConfigurationError(f"message must be a string, got {type(message).__name__}")
    size = len(message.encode("utf-8", "surrogatepass"))
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


def _bind_tools(agent: Agent[Any], handlers: Mapping[str, Handler]) -> dict[str, Tool]:
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


def idempotency_key(session_id: str, tool_call_id: str) -> str:
    """The key handed to a tool call's handler: stable per call, distinct across calls."""
    digest = hashlib.sha256(f"{session_id}\x00{tool_call_id}".encode()).hexdigest()
    return f"da-{digest[:40]}"


class _Session:
    """One run's view of a session: the loaded history and the next position to write.

    `history` holds the session's messages from position `base` on (the latest
    summary's tail, see `durable_agents.context`); a new session's base is 0."""

    def __init__(
        self,
        agent: Agent[Any],
        store: Store,
        session_id: str,
        history: list[Message],
        tools: dict[str, Tool],
        deps: Any,
        new_id: Callable[[], str],
        lease: _RunLease | None = None,
        events: _Events | None = None,
        cancel: CancelToken | None = None,
        *,
        base: int = 0,
    ) -> None:
        self.agent = agent
        self.base = base
        self.lease = lease
        self.events = events or _Events(None)
        self.cancel = cancel
        self.store = store
        self.session_id = session_id
        self.history = history
        self.tools = tools
        self.deps = deps
        self.new_id = new_id
        self.setup = _Setup(os.environ, None)
        fixed = agent.instructions if isinstance(agent.instructions, str) else None
        self.system = Message.system(
            fixed if fixed is not None else _turn_instructions(history) or ""
        )
        # A function's instructions for the turn this run starts: stored with its message.
        self.instructions: str | None = None
        self.output = _output_schema(agent.output_type) if agent.output_type is not None else None
        self.specs = self.tool_specs()
        self.answer: tuple[Any] | None = None  # a final_result call of this step accepted
        self.nudge: list[Message] = []  # a text answer sent back (never stored)
        self.meter: context.WindowMeter | None = None  # what compact() measures with
        # Answers sent back in this turn (output_type): those stored before this run
        # (counted when first needed), and this run's own, text ones included.
        self.rejected: int | None = None
        self.carried = Usage()  # the usage of LLM replies that were sent back, unstored
        self.retries: dict[str, int] = {}  # tool -> its calls answered tool-retry this turn
        # Every id a call of the session has (or had, from its provider): a repeat is a
        # duplicate. Provider ids the kit replaced never match CALL_ID, so never a kit id.
        self.call_ids = {
            i for m in history for c in m.tool_calls for i in (c.id, c.provider_id) if i
        }
        self.name: str | None = None  # stored by the append that creates the session
        self.origin: MessageOrigin | None = None  # stamped on every message it stores
        self.clock: Callable[[], float] = time.time
        self.tokens_used: int | None = None  # the session's, for max_session_tokens
        # The Workers invocation's budget (None on CPython): a step's calls that do not
        # fit it are deferred to a fresh invocation (`durable_agents.budget`).
        self.budget = _budget.current()
        self.deferred_left = False  # settle() left deferred calls for another invocation
        self.unstarted: list[ToolCall] = []  # dispatch(budgeted=True) did not start these
        # What this step's handlers scheduled: stored with their results (write #2).
        self.scheduled: list[Schedule] = []
        # Room for more in the session (a durable store's): counted before a handler first runs.
        self.schedule_room: ScheduleRoom | None = None

    @property
    def position(self) -> int:
        """The position the next append writes at."""
        return self.base + len(self.history)

    def tool_specs(self) -> list[ToolSpec]:
        specs = [t.spec for t in self.tools.values()]
        return specs if self.output is None else [*specs, self.output.spec]

    async def prepare(self, message: str | None) -> None:
        """The turn's tools and instructions: its toolsets listed (ToolsetError if one
        cannot be), and a function's instructions made for a new turn, or read back
        from the turn's first write when it is resumed."""
        agent = self.agent
        if not agent.toolsets and isinstance(agent.instructions, str):
            return
        now = datetime.datetime.fromtimestamp(self.clock(), datetime.UTC)
        ctx: RunContext[Any] = RunContext(
            self.session_id, self.name, now, self.deps, self.setup.settings, self.setup.http
        )
        if not isinstance(agent.instructions, str):
            stored = None if message is not None else _turn_instructions(self.history)
            text = stored if stored is not None else await _make_instructions(agent, ctx)
            self.instructions = text if message is not None else None
            self.system = Message.system(text)
        for toolset in agent.toolsets:
            for listed in await _listed(toolset, ctx):
                if listed.name in self.tools or (self.output and listed.name == OUTPUT_TOOL):
                    # What a remote server lists is no programming mistake: the turn ends
                    # as a toolset-error (its message kept), and a resume tries again.
                    raise ToolsetError(
                        listed.source or type(toolset).__name__,
                        f"it lists a tool named {listed.name!r}, which agent {agent.name!r} "
                        "has already; give the toolset a prefix= or leave the tool out "
                        "(allow=)",
                    )
                self.tools[listed.name] = listed
        self.specs = self.tool_specs()

    def user_message(self, message: str, request_key: str | None) -> Message:
        """The message that starts the turn, with the instructions made for it."""
        return Message("user", message, request_key=request_key, instructions=self.instructions)

    def with_policy(self, call: ToolCall) -> ToolCall:
        """`call` with what the kit decided for it, if its tool came from a toolset."""
        tool = self.tools.get(call.name)
        policy = None if tool is None else tool.policy
        return call if policy is None else replace(call, policy=policy)

    def send_back(self, response: LLMResponse, problems: str) -> None:
        """Ask again for an answer the model gave as text that is not a valid one; nothing
        is stored (the reply's usage is, with the next stored reply)."""
        self.rejected = self.rejections() + 1
        self.carried += response.usage or Usage()
        self.nudge = [
            Message.assistant(response.text),
            Message.user(
                f"That answer was not accepted: {problems}. Give your final answer by calling "
                f"the tool {OUTPUT_TOOL!r} with it."
            ),
        ]

    def stored_usage(self, usage: Usage | None) -> Usage | None:
        """A reply's usage as stored: with that of the replies sent back before it."""
        if not self.carried.total_tokens:
            return usage
        total, self.carried = (usage or Usage()) + self.carried, Usage()
        return total

    def output_gave_up(self, problems: str) -> str:
        return (
            f"the model's answer did not match the agent's output_type after "
            f"{self.agent.max_output_retries} retries (max_output_retries): {problems}"
        )

    def final_answer(self) -> list[Message]:
        """The turn's final message, if this step's final_result call was accepted."""
        if self.answer is None or self.output is None:
            return []
        (value,), self.answer = self.answer, None
        return [Message.assistant(self.output.dump(value))]

    def answer_output(self, call: ToolCall) -> str:
        """The result of a final_result call: accepted (the turn ends with its write), or
        sent back with what is wrong."""
        assert self.output is not None
        last = next(m for m in reversed(self.history) if m.role == "assistant")
        if len(last.tool_calls) != 1:
            return tool_error_content(
                ToolErrorKind.TOOL_FAILED,
                f"{OUTPUT_TOOL} was not accepted: call it on its own, once the results of your "
                "other tool calls are in.",
            )
        try:
            value = self.output.validate(dict(call.arguments))
        except ValueError as exc:
            self.rejected = self.rejections() + 1
            return tool_error_content(
                ToolErrorKind.INVALID_ARGUMENTS,
                f"Your final answer was not accepted: {exc}. Call {OUTPUT_TOOL} again with a "
                "corrected answer.",
            )
        self.answer = (value,)
        return "Final answer accepted."

    async def find_request(self, request_key: str, message: str) -> int | None:
        """The position of the user message stored with `request_key`, if any."""
        found = await self.store.find_request(self.session_id, request_key)
        if found is None:
            return None
        position, content = found
        if content != message:
            raise RequestKeyReusedError(self.session_id, request_key)
        return position

    async def earlier_turn_result(self, start: int) -> RunResult | None:
        """The result of the turn begun at `start`, if later turns followed it (else None)."""
        if start >= self.base:
            turn = self.history[start - self.base :]
        else:  # before the loaded tail: a retry of a turn the context has moved past
            turn = await self.store.load_messages(self.session_id, start=start)
        end = next((i for i, m in enumerate(turn) if i > 0 and m.role == "user"), None)
        if end is None:
            return None
        reply = next((m.content for m in reversed(turn[:end]) if m.is_final_reply), "")
        return self.result("complete", reply, 0, Usage())

    async def run(self, message: str | None, llm: LLM, request_key: str | None = None) -> RunResult:
        try:
            await self.prepare(message)
        except ToolsetError as exc:
            if message is not None:  # keep the turn's message, as for a failed LLM call
                await self.append([self.user_message(message, request_key)], release=True)
            return self.result(
                "error", "", 0, Usage(), describe_exception(exc), error_code="toolset-error"
            )
        orphans = pending_tool_calls(self.history)
        if orphans:
            waiting = await self.settle(orphans, message)
            if waiting:
                return self.result("awaiting_approval", "", 0, Usage(), pending=waiting)
            if self.deferred_left:
                return self.result("deferred", "", 0, Usage())
        if message is None and self.history[-1].is_final_reply:
            return self.result("complete", self.history[-1].content, 0, Usage())

        unstored = [self.user_message(message, request_key)] if message is not None else []
        steps, usage = 0, Usage()
        while steps < self.agent.max_steps:
            try:
                # A step boundary: every write so far has landed, none is due.
                if self.cancel is not None and self.cancel.cancelled:
                    raise _Stopped("cancelled", self.cancel.reason)
                await self.check_budget()
                usage += await self.compact(llm, unstored)
                sent = [*context.window(self.system, self.history, unstored), *self.nudge]
                response = await self.call_llm(llm, await self.processed(sent))
            except _Stopped as stop:
                if unstored:  # keep the turn's message, so message=None can finish the turn
                    await self.append(unstored, release=True)
                return self.result(stop.status, "", steps, usage, stop.reason)
            except Exception as exc:  # an LLM failure ends the run; the history stays consistent
                if unstored:
                    # The turn's first call failed for good: keep its message (one
                    # write, on this path only), so message=None can finish the turn.
                    await self.append(unstored, release=True)
                error = f"{type(exc).__name__}: {exc}"
                return self.result("error", "", steps, usage, error, error_code="llm-error")
            steps += 1
            usage += response.usage or Usage()
            calls = [self.with_policy(c) for c in self.assign_ids(response.tool_calls)]
            text = response.text
            if not calls and self.output is not None:  # a text answer: is it a valid one?
                try:
                    text = self.output.dump(self.output.from_text(response.text))
                except ValueError as exc:
                    if self.rejections() < self.agent.max_output_retries:
                        self.send_back(response, str(exc))
                        continue
                    if unstored:
                        await self.append(unstored, release=True)
                    return self.result(
                        "error", "", steps, usage, self.output_gave_up(str(exc)),
                        error_code="invalid-output",
                    )  # fmt: skip
            assistant = Message.assistant(text, calls, self.stored_usage(response.usage))
            self.nudge = []
            gated = self.needing_approval(calls)
            free = [c for c in calls if c.id not in gated]
            # write #1 (with the approval requests; the lease held through the
            # handlers' timeouts), or the final write
            try:
                await self.append(
                    [*unstored, assistant],
                    hold=self.step_seconds(free),
                    release=not free,
                    approvals=list(gated.values()),
                )
            except MessageTooLargeError as exc:
                if exc.role != "assistant":
                    raise
                # The store cannot hold this reply; nothing of it landed. Keep
                # the turn's message, as for a failed LLM call: message=None or
                # a new message goes on from there.
                if unstored:
                    await self.append(unstored, release=True)
                error = (
                    f"the model's reply ({exc.size:,} bytes of text and tool calls) is over "
                    f"the store's {exc.limit:,}-byte limit for one message and was not kept"
                )
                return self.result(
                    "error", "", steps, usage, error, error_code="llm-response-too-large"
                )
            unstored = []
            if not calls:
                return self.result("complete", text, steps, usage)
            deferred: list[ToolCall] = []
            if free:  # write #2 (of the calls that need no approval, when some do)
                results = await self.dispatch(free, budgeted=True)
                deferred = self.unstarted  # over the invocation's budget: never started
                final = self.final_answer()  # an accepted final_result ends the turn here
                gave_up = self.rejections() > self.agent.max_output_retries
                last = steps >= self.agent.max_steps or bool(gated) or bool(deferred)
                await self.append(
                    [*results, *final],
                    release=last or bool(final) or gave_up,
                    approvals=self.deferral(deferred),
                )
                if final:
                    return self.result("complete", final[0].content, steps, usage)
                if gave_up:
                    error = self.output_gave_up("see the last final_result result")
                    return self.result(
                        "error", "", steps, usage, error, error_code="invalid-output"
                    )
            if deferred and not gated:
                return self.result("deferred", "", steps, usage)
            if gated:
                pending = [
                    PendingApproval(c.id, c.name, dict(c.arguments), gated[c.id].digest)
                    for c in calls
                    if c.id in gated
                ]
                return self.result("awaiting_approval", "", steps, usage, pending=pending)
        return self.result("max_steps", "", steps, usage)

    async def call_llm(self, llm: LLM, messages: list[Message]) -> LLMResponse:
        """One LLM call, streamed when someone watches; abandoned if the run is cancelled."""
        if self.cancel is None:
            return await _ask(llm, messages, self.specs, self.events)
        call = asyncio.ensure_future(_ask(llm, messages, self.specs, self.events))
        stop = asyncio.ensure_future(self.cancel.wait())
        try:
            await asyncio.wait({call, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not call.done():  # cancelled, or this run itself was: nothing of it is stored
                call.cancel()
                with contextlib.suppress(BaseException):
                    await call
        if call.cancelled():
            raise _Stopped("cancelled", self.cancel.reason)
        return call.result()

    async def compact(self, llm: LLM, unstored: list[Message]) -> Usage:
        """Fold older messages into a stored summary if the request for the window is over
        the agent's `max_context_tokens` (see `durable_agents.context`): one append, at a
        step boundary, after which the loaded history begins at the cut. At a turn's first
        step the turn's message (`unstored`) is stored in that append, before the summary
        (so a stored summary always follows the message of the turn it was made in), and
        `unstored` is emptied. Returns the summarizer's usage."""
        if self.meter is None or self.meter.llm is not llm:
            self.meter = context.WindowMeter(llm)  # sizes each stored message once
        meter, limit = self.meter, self.agent.max_context_tokens * context.BYTES_PER_TOKEN
        reserved = meter.reserved_size(self.system, [*unstored, *self.nudge], self.specs)
        if reserved + meter.history_size(self.history) <= limit:
            return Usage()
        sizes = meter.sizes(self.history)
        cut = context.cut_position(
            self.base, self.history, sizes, limit // 2 - reserved, turn_unstored=bool(unstored)
        )
        if cut is None:
            return Usage()  # the running turn began before the cut: it is sent whole
        summaries = [m for m in self.history if m.is_summary]
        text, usage = await context.fold(
            lambda previous, chunk: self.summarize(llm, previous, chunk),
            summaries[-1].content if summaries else None,
            [m for m in self.history[: cut - self.base] if not m.is_summary],
            meter,
            limit,
            cut,
        )
        assert text is not None  # (there was something to fold: the cut is past a step)
        summary = Message(
            "system",
            text,
            usage=usage.bounded() if usage.total_tokens else None,
            summary_of=cut,
            # the turn's instructions, for a resume that no longer loads its first message
            instructions=None if isinstance(self.agent.instructions, str) else self.system.content,
        )
        await self.append([*unstored, summary])
        unstored.clear()  # stored now: what follows sends and stores it as history
        self.history = self.history[cut - self.base :]
        self.base = cut
        return usage

    async def summarize(
        self, llm: LLM, previous: str | None, messages: Sequence[Message]
    ) -> tuple[str, Usage | None]:
        if self.agent.summarize is not None:
            return await context.call_summarizer(self.agent.summarize, previous, messages)
        return await context.summarize_with_llm(llm, previous, messages)

    async def processed(self, messages: list[Message]) -> list[Message]:
        """`messages` through the agent's `history_processor`, if it has one."""
        process = self.agent.history_processor
        if process is None:
            return messages
        value: Any = process(list(messages))
        if inspect.isawaitable(value):
            value = await value
        if not isinstance(value, list) or not all(isinstance(m, Message) for m in value):
            raise ConfigurationError(
                f"history_processor of agent {self.agent.name!r} must return a list of Message, "
                f"got {type(value).__name__}"
            )
        return value

    async def check_budget(self) -> None:
        """Stop before an LLM call once the session's stored usage reaches its limit."""
        limit = self.agent.max_session_tokens
        if limit is None:
            return
        if self.tokens_used is None:  # the session's totals, kept by its appends
            info = await self.store.get_session(self.session_id)
            self.tokens_used = 0 if info is None else info.input_tokens + info.output_tokens
        used = self.tokens_used
        if used >= limit:
            raise _Stopped(
                "budget_exceeded",
                f"session {self.session_id} has used {used:,} tokens, at or over its limit of "
                f"{limit:,} (max_session_tokens); raise it to go on with message=None",
            )

    def needing_approval(self, calls: Sequence[ToolCall]) -> dict[str, ApprovalChange]:
        """The `requested` events of the calls that wait for a person: those of tools
        declared `requires_approval` whose arguments are valid (a call that cannot
        run is answered at once, with nothing to approve)."""
        requests = {}
        for call in calls[: self.agent.max_tool_calls_per_step]:  # the rest never run
            tool = self.tools.get(call.name)
            if tool is None or not tool.requires_approval or isinstance(call, MalformedToolCall):
                continue
            try:
                tool.parse_arguments(call.arguments)
            except ToolArgumentsError:
                continue
            digest = approval_digest(self.session_id, call.id, call.name, call.arguments)
            requests[call.id] = ApprovalChange(call.id, "requested", digest, tool_name=call.name)
        return requests

    async def settle(self, orphans: list[ToolCall], message: str | None) -> list[PendingApproval]:
        """Answer the last step's unanswered calls, or say which wait for a decision.

        An undecided call waits (never an orphan): then only the step's other
        orphans are repaired, and the waiting calls are returned. Otherwise an
        approved, unclaimed call is claimed (one write) and run; a denied one
        gets its `tool-denied` result; a claimed one (it may have run) and a
        call that needed no approval are repaired as orphans. All of their
        results land in one write.
        """
        states = approval_states(await self.store.load_approvals(self.session_id))
        waiting = waiting_calls(self.session_id, orphans, states)
        if waiting and message is not None:
            raise ApprovalPendingError(self.session_id, [p.tool_call_id for p in waiting])
        # An approver's edit goes with its call wherever it is answered: run (a claimed
        # safe orphan runs again with it) or lost (the model is told what was approved).
        edits = {
            c.id: state.arguments
            for c in orphans
            if (state := states.get(c.id)) is not None
            and state.decision == "approved"
            and state.arguments is not None
        }
        if waiting:
            plain = [c for c in orphans if c.id not in states or states[c.id].claimed]
            if plain:
                await self.append(await self.dispatch(plain, resuming=True, edits=edits))
                self.answer = None  # (final_result is never answered beside waiting calls)
            return waiting
        decided = {
            c.id: states[c.id] for c in orphans if c.id in states and not states[c.id].claimed
        }
        runnable, later = self.split_to_fit([
            c for c in orphans if c.id in decided and self.may_run(c, decided[c.id])
        ])  # fmt: skip
        if later and message is not None:  # the turn before is not done: its calls go first
            raise SessionBusyError(self.session_id, "the turn before, running its deferred calls",
                                   0, 0.0)  # fmt: skip
        if runnable:  # the claim: from here on, a crash leaves them as orphans
            claims = [ApprovalChange(c.id, "claimed", decided[c.id].digest) for c in runnable]
            await self.append([], approvals=claims, hold=self.step_seconds(runnable))
        claimed = {c.id for c in runnable}
        # (Approved calls left for a later invocation stay as they are: no result yet.)
        answer = [c for c in orphans if c not in later]
        if answer:
            results = await self.dispatch(
                answer, resuming=True, decided=decided, run=claimed, edits=edits
            )
            await self.append([*results, *self.final_answer()])
        self.deferred_left = bool(later)
        return []

    def may_run(self, call: ToolCall, state: ApprovalState) -> bool:
        """Whether a decided call is approved for exactly what is stored: its digest, and
        the edited arguments' own digest when the approver edited them."""
        if state.decision != "approved":
            return False
        if approval_digest(self.session_id, call.id, call.name, call.arguments) != state.digest:
            return False
        if state.arguments is None:
            return True
        edited = approval_digest(self.session_id, call.id, call.name, state.arguments)
        return edited == state.arguments_digest

    def split_to_fit(self, calls: Sequence[ToolCall]) -> tuple[list[ToolCall], list[ToolCall]]:
        """`calls` as (run now, defer): in a Workers invocation, the calls whose handlers
        its budget cannot start are deferred (a call that runs no handler never is)."""
        if self.budget is None:
            return list(calls), []
        room = self.budget.calls_that_fit()
        now: list[ToolCall] = []
        later: list[ToolCall] = []
        for call in calls:
            runs = not isinstance(call, MalformedToolCall) and call.name in self.tools
            if runs and room <= 0:
                later.append(call)
                continue
            room -= runs
            now.append(call)
        return now, later

    def deferral(self, calls: Sequence[ToolCall]) -> list[ApprovalChange]:
        """The events recording `calls` as deferred: requested and approved by the kit, so
        a later run claims each before it starts it, as an approved call (`settle`): a
        deferred call without a claim is known never to have started."""
        digests = [approval_digest(self.session_id, c.id, c.name, c.arguments) for c in calls]
        # Requests first, then decisions: two runs, each one packed statement for D1.
        return [
            *(
                ApprovalChange(c.id, "requested", d, tool_name=c.name)
                for c, d in zip(calls, digests, strict=True)
            ),
            *(
                ApprovalChange(c.id, "approved", d, reason=DEFERRED_REASON)
                for c, d in zip(calls, digests, strict=True)
            ),
        ]

    def step_seconds(self, calls: Sequence[ToolCall]) -> float:
        """How long a step's handlers may run, as far as their tools declare it."""
        timeouts = [t.timeout for c in calls if (t := self.tools.get(c.name)) and t.timeout]
        return max(timeouts, default=0.0)

    async def append(
        self,
        messages: list[Message],
        *,
        hold: float = 0.0,
        release: bool = False,
        approvals: Sequence[ApprovalChange] = (),
    ) -> None:
        """One atomic append, renewing the run's lease (or releasing it) in the same write."""
        lease = None
        if self.lease is not None:
            lease = Lease(self.lease.owner, self.lease.ttl_ms + int(hold * 1000), release)
        position = self.position
        if self.origin is not None:
            messages = [m if m.origin else replace(m, origin=self.origin) for m in messages]
        await self.store.append_messages_atomic(
            self.session_id,
            position,
            messages,
            agent_name=self.agent.name,
            lease=lease,
            approvals=approvals,
            session_name=self.name,
            # only when there are some: a store written before schedules still works
            **({"schedules": self.scheduled} if self.scheduled else {}),
        )
        self.scheduled = []
        self.history.extend(messages)
        if self.tokens_used is not None:
            self.tokens_used += sum(m.usage.total_tokens for m in messages if m.usage)
        if self.lease is not None and release:
            self.lease.released = True
        for offset, stored in enumerate(messages):
            await self.events.emit(MessageStored(position + offset, stored))

    def assign_ids(self, calls: Sequence[ToolCall]) -> list[ToolCall]:
        """Give every call an id unique in the session, so it can be matched to one result,
        and one a URL carries as it is (`CALL_ID`). A provider's id that is neither keeps
        going back to the provider (`provider_id`); a duplicate does not (the provider
        would get two calls of one id)."""
        assigned = []
        for call in calls:
            if not call.id or call.id in self.call_ids:
                call = replace(call, id=self.fresh_call_id(), provider_id=None)
            elif CALL_ID.fullmatch(call.id) is None or self.base > 0:
                # Past a summary the ids before it are not loaded: a provider's could
                # repeat one of them unseen, so it is kept beside an id of the kit's.
                call = replace(call, id=self.fresh_call_id(), provider_id=call.id)
                self.call_ids.add(call.id if call.provider_id is None else call.provider_id)
            self.call_ids.add(call.id)
            assigned.append(call)
        return assigned

    def fresh_call_id(self) -> str:
        call_id = f"call_{self.new_id()}"
        if CALL_ID.fullmatch(call_id) is None or call_id in self.call_ids:
            raise ConfigurationError(
                f"new_id() made {call_id[5:][:80]!r}, which is not a new tool call id: an id is "
                "1 to 250 of A-Z a-z 0-9 _ . : ~ - and unique in its session"
            )
        return call_id

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
        `self.unstarted`, in call order."""
        decided, run, edits = decided or {}, run or set(), edits or {}
        over = self.beyond_cap()
        slots = asyncio.Semaphore(self.agent.tool_concurrency)
        limit = self.budget if budgeted else None
        in_flight = 0

        async def answer(call: ToolCall) -> str | None:
            nonlocal in_flight
            if call.id in decided and call.id not in run:
                return await _denied(call, decided[call.id])
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
                return content if edited is None else _ran_edited(content, edited)

        runs = any(call.id not in decided or call.id in run for call in calls)
        if runs and self.store.durable and self.schedule_room is None:
            # Before a handler first runs (one read a run): ctx.schedule counts against it.
            self.schedule_room = await room_left(self.store, self.session_id)
        jobs = [answer(call) for call in calls]
        contents = [await jobs[0]] if len(jobs) == 1 else await _all_or_crash(jobs)
        self.unstarted = [c for c, text in zip(calls, contents, strict=True) if text is None]
        return [
            Message.tool_result(c, text)
            for c, text in zip(calls, contents, strict=True)
            if text is not None
        ]

    def beyond_cap(self) -> set[str]:
        """The calls of the last step past `max_tool_calls_per_step`: answered, never run."""
        last = next((m for m in reversed(self.history) if m.role == "assistant"), None)
        if last is None:
            return set()
        return {c.id for c in last.tool_calls[self.agent.max_tool_calls_per_step :]}

    async def result_content(self, call: ToolCall, resuming: bool, over_cap: bool = False) -> str:
        answers = self.output is not None and call.name == OUTPUT_TOOL
        if isinstance(call, MalformedToolCall):  # never run, so never a durability question
            if answers:
                self.rejected = self.rejections() + 1
            return tool_error_content(ToolErrorKind.INVALID_ARGUMENTS, call.arguments_error)
        if answers and not over_cap:  # no side effect: checked again on resume
            return self.answer_output(call)
        tool = self.tools.get(call.name)
        # A toolset's call is judged by what was decided when it was stored.
        safe = tool is not None and tool.safe_to_retry
        if call.policy is not None:
            safe = call.policy.get("safe_to_retry") is True
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
        try:
            args = tool.parse_arguments(call.arguments)
        except ToolArgumentsError as exc:
            return tool_error_content(
                ToolErrorKind.INVALID_ARGUMENTS,
                f"Tool {call.name!r} was not run: its arguments are invalid: {exc}",
            )
        schedules = None
        if self.schedule_room is not None:
            schedules = StepSchedules(
                self.new_id, self.clock, self.agent.max_message_bytes, self.schedule_room
            )
        ctx = ToolContext(
            session_id=self.session_id,
            tool_call_id=call.id,
            tool_name=call.name,
            idempotency_key=idempotency_key(self.session_id, call.id),
            resumed=resuming,
            deps=self.deps,
            schedules=schedules,
            clock=self.clock,
        )
        assert tool.handler is not None  # _bind_tools guarantees it
        timer = _timeouts.timeout(tool.timeout)  # leaves no timer behind (Pyodide)
        try:
            try:
                value = tool.handler(args, ctx)
                if inspect.isawaitable(value):
                    async with timer:
                        value = await value
            except BaseException:
                if schedules is not None:  # a failed call schedules nothing
                    schedules.discard()
                raise
            if schedules is not None:  # it returned: what it scheduled goes with its result
                self.scheduled += schedules.made
        except ModelRetry as exc:
            return self.retry_result(call.name, exc)
        except ToolFailure as exc:
            if exc.outcome_unknown and not safe:
                return _uncertain(call, f"left its outcome unknown ({exc.message.rstrip('.')})")
            return tool_error_content(exc.kind, f"Tool {call.name!r} failed: {exc.message}")
        except Exception as exc:
            timed_out = isinstance(exc, TimeoutError) and timer.expired()
            if not safe and (timed_out or _outcome_unknown(exc)):
                # It may have acted: answer as for a call lost in a crash, so the
                # model checks before acting again instead of making a new call.
                what = (
                    f"did not finish within {tool.timeout} s and was stopped"
                    if timed_out
                    else "lost its connection before an answer came back "
                    f"({describe_exception(exc)})"
                )
                return _uncertain(call, what)
            if timed_out:
                return tool_error_content(
                    ToolErrorKind.TOOL_TIMEOUT,
                    f"Tool {call.name!r} did not finish within {tool.timeout} s and was "
                    "stopped. It is safe to retry.",
                )
            return tool_error_content(
                ToolErrorKind.TOOL_FAILED, f"Tool {call.name!r} failed: {describe_exception(exc)}"
            )
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
        size = len(content.encode())
        if size > self.agent.max_result_bytes:
            return tool_error_content(
                ToolErrorKind.RESULT_TOO_LARGE,
                f"Tool {call.name!r} ran, but its result ({size:,} bytes) is over the "
                f"{self.agent.max_result_bytes:,}-byte limit and was not stored. Ask for less "
                "(a smaller page or a narrower query).",
            )
        return content

    def turn_results(self, kind: ToolErrorKind, name: str) -> int:
        """How many results of tool `name` of the turn in progress, as loaded, are of `kind`."""
        start = max((i for i, m in enumerate(self.history) if m.role == "user"), default=0)
        return sum(
            1
            for m in self.history[start:]
            if m.role == "tool"
            and m.tool_name == name
            and (tool_error(m.content) or {}).get("kind") == kind
        )

    def rejections(self) -> int:
        """The answers of the turn in progress sent back (`output_type`)."""
        if self.rejected is None:  # those stored before this run
            self.rejected = self.turn_results(ToolErrorKind.INVALID_ARGUMENTS, OUTPUT_TOOL)
        return self.rejected

    def retry_result(self, name: str, exc: ModelRetry) -> str:
        """A handler's `ModelRetry`: `tool-retry`, while the tool has retries left in the turn."""
        if name not in self.retries:  # first met in this run: those stored before it
            self.retries[name] = self.turn_results(ToolErrorKind.TOOL_RETRY, name)
        done = self.retries[name]
        if done >= self.agent.max_tool_retries:
            return tool_error_content(
                ToolErrorKind.TOOL_FAILED,
                f"Tool {name!r} failed: it asked for a retry {done + 1} times in this turn, over "
                f"the limit of {self.agent.max_tool_retries} (max_tool_retries): {exc.message}",
            )
        self.retries[name] = done + 1
        return tool_error_content(ToolErrorKind.TOOL_RETRY, exc.message)

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
        output = None
        if status == "complete" and self.output is not None:
            with contextlib.suppress(ValueError):  # a turn that ended before output_type was set
                output = self.output.load(response)
        return RunResult(
            status=status,
            response=response,
            session_id=self.session_id,
            messages=[self.system, *self.history],
            steps=steps,
            usage=usage,
            error=error,
            pending=pending or [],
            error_code=error_code,
            output=output,
        )


@dataclass(frozen=True, slots=True)
class _Setup:
    """What `run()` was given for the turn's `RunContext` besides the session."""

    settings: Mapping[str, str]
    http: httpx.AsyncClient | None


async def _listed(toolset: Toolset, ctx: RunContext[Any]) -> Sequence[Tool]:
    """The toolset's tools this turn. Any failure to list them (its server down, a
    setting missing, a bug in its code) is a `ToolsetError`: the turn ends resumable
    with its message kept, never a crash that loses the message."""
    try:
        return await toolset.list_tools(ctx)
    except ToolsetError:
        raise
    except Exception as exc:
        name = type(toolset).__name__
        problem = describe_exception(exc)
        if isinstance(exc, DurableAgentsError):  # the kit's own words (a setting missing)
            problem = str(exc).removeprefix(f"{name}: ")
        raise ToolsetError(name, f"its tools could not be listed: {problem}") from exc


def _turn_instructions(history: Sequence[Message]) -> str | None:
    """The instructions stored with the turn in progress (or last): on its first message,
    or on a summary that folded it."""
    for message in reversed(history):
        if message.role == "user" or message.is_summary:
            return message.instructions
    return None


async def _make_instructions(agent: Agent[Any, Any], ctx: RunContext[Any]) -> str:
    """The agent's instructions function, called for a new turn."""
    assert not isinstance(agent.instructions, str)
    try:
        value: Any = agent.instructions(ctx)
        if inspect.isawaitable(value):
            value = await value
    except Exception as exc:
        raise ConfigurationError(
            f"the instructions function of agent {agent.name!r} raised {describe_exception(exc)}"
        ) from exc
    if not isinstance(value, str):
        raise ConfigurationError(
            f"the instructions function of agent {agent.name!r} must return a str, "
            f"got {type(value).__name__}"
        )
    return _json.repair_text(value)


_OUTPUT_SCHEMAS: dict[Any, OutputSchema] = {}


def _output_schema(output_type: Any) -> OutputSchema:
    """The output type's schema, made once per type (pydantic builds a validator)."""
    schema = _OUTPUT_SCHEMAS.get(output_type)
    if schema is None:
        schema = _OUTPUT_SCHEMAS[output_type] = OutputSchema(output_type, OUTPUT_TOOL)
    return schema


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


class _Stopped(Exception):
    """Stop at this step boundary: cancelled, or the session's budget is spent."""

    def __init__(self, status: RunStatus, reason: str | None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class _Events:
    """Hands a run's events to its `on_event`, which may be sync or async.

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


async def _ask(
    llm: LLM, messages: list[Message], specs: list[ToolSpec], events: _Events
) -> LLMResponse:
    """The LLM's answer: from `stream()` (reporting its text) when someone watches and
    the LLM can stream, else from `chat()`."""
    stream = getattr(llm, "stream", None) if events.watched else None
    if stream is None:
        response = await llm.chat(messages, specs)
    else:
        response = None
        parts = stream(messages, specs)
        try:
            async for part in parts:
                if isinstance(part, LLMResponse):
                    response = part
                elif isinstance(part, TextDelta) and part.text:
                    await events.emit(part)
        finally:
            closing = getattr(parts, "aclose", None)
            if closing is not None:
                await closing()
        if response is None:
            raise TypeError("stream() ended without an LLMResponse")
    if not isinstance(response, LLMResponse):
        raise TypeError(f"chat() returned {type(response).__name__}, not LLMResponse")
    return response


async def _denied(call: ToolCall, state: ApprovalState) -> str:
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


def _uncertain(call: ToolCall, what: str) -> str:
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
