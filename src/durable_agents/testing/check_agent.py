"""Check any agent module against the at-most-once contract, at every crash point.

    from durable_agents.testing import check_agent

    def test_agent() -> None:
        report = check_agent(importlib.import_module("agent"))   # the module of src/agent.py
        print(report)   # agent 'refunds': 148 crash points, 752 runs, 528 requests; ...

What it does, for an agent module written against the protocol of
`durable_agents.cloudflare.agent_module` (`AGENT`, `make_deps(env, http)`, optional
`DEV_STUBS`; `make_llm` and `SETTINGS` are not used):

- drives the agent with `TestLLM` (every tool called once per turn, with
  arguments made from its input schema, patterns and formats included, and
  checked against the tool's model first: a field it cannot fill is a
  `ConfigurationError` naming the tool and the field's JSON path; pass
  `arguments=` for it), in both of its modes: all tools in one step, and one
  tool per step (more steps, so more crash points); two turns each, on a
  real SQLite file (`sqlite_store`);
- first without a crash, counting the atomic appends; then once per append
  and per side of it: the process "dies" right before the append lands and,
  in another session, right after (`crash_on_write`), and the turn is
  finished as a caller would: `run(..., message=None)` once the turn's
  message is stored, the message again if it is not;
- each `run()` gets `deps=make_deps(env, http)`: `env` is the config's
  `[vars]` (plus `env=`) as attributes, like a Worker's env (a name it does
  not hold raises `AttributeError`, as a missing binding does in a Worker);
  an empty setting whose name ends in `_URL`, or that `DEV_STUBS` names,
  becomes `https://<name>.check.invalid` so the handlers have somewhere to
  send their requests. `http` is an `httpx.AsyncClient` that sends nothing:
  every request is recorded, with the tool call whose handler made it, and
  answered by `respond(request)` if given, else by the module's own dev stub
  when it went to a setting `DEV_STUBS` names, else `200 {}`;
- an agent with toolsets (`Agent(toolsets=[MCPTools(url_setting="MCP_URL")])`):
  each `run()` also gets `settings=` (as the Worker passes them: the env's
  values of the settings its toolsets name, `Agent.settings`, as strings) and
  `http=` (the same recording client), so a toolset lists its tools, and its
  tools call their server, through the recording client. Requests to a
  toolset's server (a URL one of its settings holds, or `MCPTools(url=...)`)
  are the exception to "sends nothing": they are recorded, then forwarded
  over real HTTP (a plain `httpx.AsyncClient`) to that server, its answer
  streamed back. So a toolset's server must be running: point `MCP_URL` at
  yours (`env={"MCP_URL": "http://127.0.0.1:8000/mcp"}`), or at one your test
  starts; a toolset that cannot list its tools before the check starts is a
  `ConfigurationError` saying so. The server's own `tools/list` answers are
  read on the way (each tool's annotations), and every `tools/call` that
  reached it is counted by the idempotency key in its `_meta`.

It asserts, for every crash point (an `AssertionError` naming the crash
point, with the stored history and the requests, on the first breach):

- the handler of a tool that is not `safe_to_retry` ran at most once per
  call, and at most once per turn (`TestLLM` calls each tool once a turn,
  so a second run means the call was made again: a step the store lost);
  so none of its requests was sent twice. A toolset's call is judged by the
  policy stored with it (`ToolCall.policy`, what the kit decided at write #1);
- a `safe_to_retry` call that ran more than once sent each POST/PATCH with
  its idempotency key in a header (the same key on every re-invocation,
  e.g. `Idempotency-Key: ctx.idempotency_key`); else the re-invocation
  repeated a side effect, and the tool is not safe to retry;
- an MCP call (a `tools/call` a toolset's server received) reached the
  server at most once across the session's runs, unless the server itself
  lists the tool `readOnlyHint: true` (then a lost result is sent again, as
  for any safe orphan): a call sent twice by one run of its handler, or sent
  again because the toolset stored a side effect as `safe_to_retry`, fails;
- every history is well formed: only user, assistant and tool messages (and
  the kit's summaries); each turn's user message stored once, in order; a
  step's calls followed directly by exactly one result each, in the order
  the kit stores them (those of calls that waited for a decision after the
  others, wherever the gated tool is declared); each turn ending with a
  final reply; call ids unique; every handler run was for a stored call;
- an unsafe call left without a result by a crash (an orphan) ends with a
  `tool-durability-error` result; a safe orphan is run again and gets a
  real result; a durability error never answers a safe tool's call;
- every run finishes the turn (`status == "complete"`) once resumed;
- with tools declared `requires_approval` (or a toolset's gated tools,
  `MCPTools(approve_destructive=True)`): when `run()` answers
  `awaiting_approval`, every waiting call is decided with `approve()` (a write
  through the crashing store, so a crash point, as the claim before an
  approved call runs is) and the turn goes on with `run(..., message=None)`.
  `decide=` says how: `"all"` (the default) runs the whole sweep three times,
  approving every call, denying every call, and approving every call with
  edited arguments (once in all when no tool needs approval); `"approve"`,
  `"deny"`, `"edit"`, `"both"` (approve and deny), or a callable
  `decide(PendingApproval) -> bool | dict` (a dict approves with those
  arguments). `"edit"` makes arguments that differ from the model's the way
  `TestLLM` makes its own (another value of each field), checked against the
  tool's input schema. Then no call of such a tool ran without a stored
  approval of that exact call (its digest) claimed before it ran; an approved
  one ran at most once (unless `safe_to_retry`: then a claimed orphan runs
  again, as any safe orphan); a denied one never ran and has a `tool-denied`
  result; every stored decision is the one `decide` gave. An edited approval
  is stored with the edit (the `approved` event's `arguments` and their own
  digest); its handler ran only with the edited arguments, never the model's
  (and an MCP call sent the server those); a result of a run of it carries
  `edited_arguments` (a `tool-durability-error` for a lost one need not).

Each failure says whose rule broke. "your agent broke a rule: ..." is about
what the agent decides: a tool declared `safe_to_retry` whose re-invocation
repeats a side effect, `make_deps` failing, a setting that stops the turn, a
tool TestLLM's call never reaches, a run that writes differently each time,
a toolset of its own that marks a side effect safe or sends a call twice.
"the kit broke a rule: ... — please report this" is about what the kit alone
is responsible for: the stored history, when a call runs (at most once, only
once approved and claimed, with the approver's arguments), what answers an
orphan, and what the kit's `MCPTools` decides and sends. (With `store=`, the
store given may be the culprit as well: the message says so.)

`check_agent` runs its own event loop; in async code, `await check_agent_async(...)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import dataclasses
import datetime
import importlib
import inspect
import io
import json
import os
import re
import tempfile
import time
import tomllib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import httpx
from pydantic import BaseModel

from .._http.json_guard import refuse_deep_json
from .._http.sse import sse_events, sse_lines
from .._schema.values import variant_arguments
from ..agent import Agent
from ..approvals import ApprovalState, PendingApproval, approval_digest, approval_states, approve
from ..errors import ConfigurationError, ToolArgumentsError, ToolDurabilityError
from ..llm.offline import TestLLM, arguments_for
from ..mcp import IDEMPOTENCY_KEY_META, MCPTools
from ..messages import Message, ToolCall, ToolErrorKind, tool_error
from ..run import idempotency_key, pending_tool_calls, run
from ..stores.base import ApprovalChange, Store
from ..tools import RunContext, Tool, ToolContext, Toolset
from . import CrashingStore, SimulatedCrash

__all__ = ["AgentCheckReport", "RecordedRequest", "check_agent", "check_agent_async"]

Responder = Callable[[httpx.Request], httpx.Response | Awaitable[httpx.Response]]
Decision = bool | Mapping[str, Any]
"""What `decide` answers for a waiting call: approve (True), deny (False), or approve with
these arguments instead of the model's (a dict)."""
Decide = Callable[[PendingApproval], Decision]
DecidePolicy = Literal["all", "approve", "deny", "edit", "both"] | Decide
_NON_IDEMPOTENT = frozenset({"POST", "PATCH"})
_HANDLER_NOT_CALLED = frozenset(
    {ToolErrorKind.INVALID_ARGUMENTS, ToolErrorKind.UNKNOWN_TOOL, ToolErrorKind.TOOL_DENIED}
)
_SIDES: tuple[Literal["before", "after"], ...] = ("before", "after")
_MAX_RUNS_PER_TURN = 50  # resumes of one turn before giving up (max_steps agents resume)
_EDIT_VARIANTS = 8  # other values tried per field for decide="edit"
# Headers of a forwarded request or answer that describe one hop, not the message.
_HOP_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "content-encoding"}
)
_LISTING_BYTES = 4_000_000  # of a server's tools/list answer, kept to read its annotations
# Statuses only the agent's own code or settings can cause with TestLLM, and where to look.
_AGENT_STATUSES = {
    "error": ": TestLLM does not fail, so something of the agent's did (its "
    "history_processor or summarize, or a toolset: is its server still up?)",
    "budget_exceeded": ": the agent's max_session_tokens is too small for the check's turns",
}


class _AgentBreach(AssertionError):
    """A check failed on something the agent decides (a tool's declaration, a handler)."""


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request a handler (or `make_deps`, or a toolset) sent through the check's `http`
    client.

    `tool_name`, `tool_call_id`, `idempotency_key` and `invocation` say which
    handler run sent it (`invocation` counts that call's runs from 1); all
    None for a request made outside any handler (a toolset listing its tools).
    `forwarded`: it went to a toolset's server, for real (see the module docstring).
    """

    scenario: str
    turn: int
    tool_name: str | None
    tool_call_id: str | None
    idempotency_key: str | None
    invocation: int | None
    method: str
    url: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    forwarded: bool = False

    def carries(self, text: str) -> bool:
        """Whether `text` is one of the request's header values, or the idempotency key in
        the `_meta` of the MCP `tools/call` it is."""
        if any(text in value for _, value in self.headers):
            return True
        message = _json_rpc(self.body)
        return message is not None and _meta_key(message) == text

    def __str__(self) -> str:
        who = (
            f"{self.tool_name}#{self.tool_call_id} (run {self.invocation})"
            if self.tool_name
            else "outside any tool call"
        )
        body = self.body[:120].decode(errors="replace")
        to = " (forwarded)" if self.forwarded else ""
        return f"{self.method} {self.url}{to} {body!r} from {who}"


@dataclass(frozen=True, slots=True)
class AgentCheckReport:
    """What `check_agent` ran. Every count is over all crash points and both modes.

    `mcp_calls` counts the `tools/call` requests that reached a toolset's
    server; `edited` the approved calls that ran (or were lost) with an
    approver's edited arguments."""

    agent: str
    safe_tools: tuple[str, ...]
    unsafe_tools: tuple[str, ...]
    crash_points: int
    runs: int
    requests: int
    durability_errors: int
    safe_reinvocations: int
    unkeyed_unsafe_requests: tuple[str, ...] = ()
    approval_tools: tuple[str, ...] = ()
    approved: int = 0
    denied: int = 0
    edited: int = 0
    toolset_tools: tuple[str, ...] = ()
    mcp_calls: int = 0
    seconds: float = 0.0

    def __str__(self) -> str:
        text = (
            f"agent {self.agent!r}: {self.crash_points} crash points, {self.runs} runs, "
            f"{self.requests} requests; {self.durability_errors} durability errors stored, "
            f"{self.safe_reinvocations} safe re-invocations; no unsafe request sent twice, "
            "every history well formed"
        )
        if self.toolset_tools:
            text += (
                f"; {self.mcp_calls} MCP calls reached the servers of its toolsets' tools "
                f"({', '.join(self.toolset_tools)}): none of a side effect twice"
            )
        if self.approval_tools:
            text += (
                f"; {self.approved} approved ({self.edited} with edited arguments) and "
                f"{self.denied} denied calls of {', '.join(self.approval_tools)}: none ran "
                "unapproved, none twice, no denied one ran, every edited one with the edit"
            )
        if self.unkeyed_unsafe_requests:
            text += (
                "; note: requests of unsafe tools without the call's idempotency key in a "
                f"header: {', '.join(self.unkeyed_unsafe_requests)}"
            )
        if self.seconds:
            text += f" ({self.seconds:.1f} s)"
        return text


class CheckEnv:
    """A Worker-like env over plain settings: `env.NAME`; a missing name raises AttributeError."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_settings", dict(settings))

    def __getattr__(self, name: str) -> Any:
        settings: dict[str, Any] = object.__getattribute__(self, "_settings")
        if name in settings:
            return settings[name]
        raise AttributeError(
            f"env has no {name!r}: check_agent's env holds the config's [vars] "
            f"({', '.join(sorted(settings)) or 'none'}); "
            f"pass check_agent(..., env={{{name!r}: ...}})"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("the env is read-only")

    def __dir__(self) -> list[str]:
        return sorted(object.__getattribute__(self, "_settings"))

    def __repr__(self) -> str:
        return f"CheckEnv({sorted(object.__getattribute__(self, '_settings'))})"


# -- running the agent --------------------------------------------------------------


@dataclass(slots=True)
class _Invocation:
    turn: int
    tool_name: str
    call_id: str
    key: str
    run_number: int
    approval: ApprovalState | None = None  # for a requires_approval tool: the store's, as it ran
    arguments: Any = None  # what the handler was given, as JSON


@dataclass(frozen=True, slots=True)
class _Crash:
    n: int
    when: Literal["before", "after"]
    label: str

    def __str__(self) -> str:
        return f"a crash {self.when} append #{self.n} ({self.label})"


@dataclass(frozen=True, slots=True)
class _ServerCall:
    """A `tools/call` that reached a toolset's server (it was forwarded, and not refused
    for want of a connection)."""

    server: str  # the toolset's URL it went to
    tool: str  # the tool's name on the server
    arguments: Any
    key: str | None  # the idempotency key in its `_meta`
    call_id: str | None  # the call whose handler sent it
    run_number: int | None


@dataclass(slots=True)
class _Scenario:
    """One session played through its turns; what happened in it."""

    name: str
    mode: str
    crash: _Crash | None
    policy: str = "approve"
    turn: int = 0
    runs: int = 0
    crashed: bool = False
    invocations: list[_Invocation] = field(default_factory=list)
    requests: list[RecordedRequest] = field(default_factory=list)
    server_calls: list[_ServerCall] = field(default_factory=list)
    orphaned: dict[str, str] = field(default_factory=dict)  # call id -> tool, after a crash
    appends: list[list[Message]] = field(default_factory=list)
    approval_writes: list[list[ApprovalChange]] = field(default_factory=list)
    decisions: dict[str, bool] = field(default_factory=dict)  # call id -> approved, as asked
    edits: dict[str, dict[str, Any]] = field(default_factory=dict)  # call id -> edit sent


_CURRENT: contextvars.ContextVar[_Invocation | None] = contextvars.ContextVar(
    "durable_agents_check_call", default=None
)


class _RecordingStore(CrashingStore):
    """`crash_on_write`, also keeping what each append carried (to name the crash points)."""

    def __init__(
        self,
        store: Store,
        crash: _Crash | None,
        appends: list[list[Message]],
        approval_writes: list[list[ApprovalChange]],
    ) -> None:
        super().__init__(store, crash.n if crash else None, crash.when if crash else "before")
        self._log = appends
        self._approval_log = approval_writes

    async def append_messages_atomic(
        self, session_id: str, expected_seq: int, messages: Sequence[Message], **kwargs: Any
    ) -> int:
        self._log.append(list(messages))
        self._approval_log.append(list(kwargs.get("approvals", ())))
        return await super().append_messages_atomic(session_id, expected_seq, messages, **kwargs)


class _RecordingToolset:
    """A toolset of the agent, as the check runs it: listed as it lists, each tool's handler
    recorded like the agent's own (`_Checker._recording`)."""

    def __init__(self, inner: Toolset, checker: _Checker) -> None:
        self.inner = inner
        self.checker = checker

    @property
    def settings(self) -> tuple[str, ...]:
        return tuple(getattr(self.inner, "settings", ()))

    async def list_tools(self, ctx: RunContext[Any]) -> Sequence[Tool]:
        listed = await self.inner.list_tools(ctx)
        return [
            t.with_handler(self.checker._recording(t)) if t.handler is not None else t
            for t in listed
        ]


class _Relay(httpx.AsyncByteStream):
    """A forwarded answer's body, streamed on as it comes (an MCP server's event stream
    too), kept (up to a bound) when the check wants to read it once it is closed."""

    def __init__(
        self, response: httpx.Response, keep: Callable[[bytes], Awaitable[None]] | None = None
    ) -> None:
        self.response = response
        self.keep = keep
        self.seen: list[bytes] = []
        self.size = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.response.aiter_bytes():
            if self.keep is not None and self.size < _LISTING_BYTES:
                self.seen.append(chunk)
                self.size += len(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self.response.aclose()
        if self.keep is not None:
            keep, self.keep = self.keep, None
            await keep(b"".join(self.seen))


class _Checker:
    def __init__(
        self,
        agent: Agent,
        make_deps: Callable[[Any, httpx.AsyncClient], Any],
        env: CheckEnv,
        store: Store,
        *,
        turns: int,
        respond: Responder | None,
        arguments: Mapping[str, Mapping[str, Any]],
        stubs: Mapping[str, Callable[..., Any]],
        own_store: bool = False,
        settings: Mapping[str, str] | None = None,
        servers: Mapping[str, Toolset] | None = None,
        forward: httpx.AsyncClient | None = None,
    ) -> None:
        self.agent = agent
        # What run() is given: the agent, its toolsets listing through the recorder.
        self.run_agent = (
            dataclasses.replace(
                agent, toolsets=[_RecordingToolset(ts, self) for ts in agent.toolsets]
            )
            if agent.toolsets
            else agent
        )
        self.decide: Decide | Literal["edit"] = lambda pending: True
        self.stubs = dict(stubs)  # placeholder URL -> the agent's dev stub for it
        self.make_deps = make_deps
        self.env = env
        self.store = store
        self.settings = dict(settings or {})  # run(settings=): what the toolsets read
        self.servers = dict(servers or {})  # a toolset's server URL -> that toolset
        self.forward = forward  # sends requests to those servers, for real
        self.server_tools: dict[tuple[str, str], dict[str, Any]] = {}  # their annotations
        self.messages = [f"check_agent turn {i + 1}" for i in range(turns)]
        self.respond = respond
        self.own_store = own_store
        self.arguments = {name: dict(value) for name, value in arguments.items()}
        self.given = set(self.arguments)
        self.tools = {t.name: t for t in agent.tools}
        self.listed: dict[str, Tool] = {}  # the toolsets' tools, as listed before the check
        if not agent.toolsets:  # (else once they are listed: `list_toolsets`)
            self._check_given()
        missing = sorted(name for name, t in self.tools.items() if t.handler is None)
        if missing:
            raise ConfigurationError(
                f"tools {missing} of agent {agent.name!r} have no handler; an agent module's "
                "AGENT must carry its handlers"
            )
        for name, t in self.tools.items():  # made once, checked against the tool's model
            if name not in self.arguments:
                validate = t.input_model.model_validate if t.input_model else t.parse_arguments
                self.arguments[name] = arguments_for(
                    t.input_schema, tool_name=name, validate=validate
                )
        self.handlers = {name: self._recording(t) for name, t in self.tools.items()}
        self.edits: dict[str, dict[str, Any] | None] = {}  # decide="edit", made once per call
        self.scenario: _Scenario | None = None
        self.runs = 0
        self.requests = 0
        self.durability_errors = 0
        self.safe_reinvocations = 0
        self.crash_points = 0
        self.unkeyed: set[str] = set()
        self.approved = 0
        self.denied = 0
        self.edited = 0
        self.mcp_calls = 0

    async def list_toolsets(self) -> None:
        """List every toolset once before the check (through the recorder, so its server is
        reached as in the runs): its tools' names, and TestLLM's arguments for them, made
        and checked now. `ConfigurationError` if one cannot list, or if `arguments=` names a
        tool nobody has."""
        if self.agent.toolsets:
            self.scenario = _Scenario("check-listing", "listing the toolsets", None)
            async with self._client() as http:
                try:
                    deps = self.make_deps(self.env, http)
                except Exception:
                    deps = None  # (the first run says why)
                ctx: RunContext[Any] = RunContext(
                    "check-listing",
                    None,
                    datetime.datetime.now(datetime.UTC),
                    deps,
                    settings=self.settings,
                    http=http,
                )
                for toolset in self.agent.toolsets:
                    try:
                        listed = await toolset.list_tools(ctx)
                    except Exception as exc:
                        raise ConfigurationError(self._unlisted(toolset, exc)) from exc
                    for t in listed:
                        if t.name in self.tools or t.name in self.listed:
                            raise ConfigurationError(
                                f"agent {self.agent.name!r}: its toolset {toolset!r} lists a "
                                f"tool named {t.name!r}, which it has already"
                            )
                        self.listed[t.name] = t
            self.scenario = None
        self._check_given()
        for name, t in self.listed.items():
            if name not in self.arguments:
                self.arguments[name] = arguments_for(
                    t.input_schema, tool_name=name, validate=t.parse_arguments
                )

    def _check_given(self) -> None:
        unknown = sorted(self.given - set(self.tools) - set(self.listed))
        if unknown:
            raise ConfigurationError(
                f"arguments= names tools {self.agent.name!r} does not have: {unknown}"
            )

    def _unlisted(self, toolset: Toolset, exc: Exception) -> str:
        names = tuple(getattr(toolset, "settings", ()))
        values = ", ".join(
            f"{n}={self.settings[n]!r}" if n in self.settings else f"{n} not set" for n in names
        )
        return (
            f"check_agent: the toolset {_name(toolset)} of agent {self.agent.name!r} could not "
            f"list its tools ({type(exc).__name__}: {exc}). check_agent sends a toolset's requests "
            f"to the real server its settings name ({values or 'none'}): start that server "
            "(your test may start one) and point the setting at it, e.g. "
            f"check_agent(..., env={{{(names or ('MCP_URL',))[0]!r}: "
            "'http://127.0.0.1:8000/mcp'})"
        )

    # -- handlers and http, recorded --------------------------------------------

    def _recording(self, t: Tool) -> Callable[[Any, ToolContext], Awaitable[Any]]:
        handler = t.handler
        assert handler is not None

        async def recorded(args: Any, ctx: ToolContext) -> Any:
            scenario = self.scenario
            assert scenario is not None
            invocation = _Invocation(
                scenario.turn, ctx.tool_name, ctx.tool_call_id, ctx.idempotency_key, 0
            )
            invocation.run_number = 1 + sum(
                1 for i in scenario.invocations if i.call_id == ctx.tool_call_id
            )
            invocation.arguments = _plain(args)
            if t.requires_approval:  # what the store says about this call as it runs
                states = approval_states(await self.store.load_approvals(scenario.name))
                invocation.approval = states.get(ctx.tool_call_id)
            scenario.invocations.append(invocation)
            token = _CURRENT.set(invocation)
            try:
                value = handler(args, ctx)
                return await value if inspect.isawaitable(value) else value
            finally:
                _CURRENT.reset(token)

        return recorded

    def _client(self) -> httpx.AsyncClient:
        """The `http` a run's handlers and toolsets get: records, answers or forwards."""
        return httpx.AsyncClient(
            transport=httpx.MockTransport(self._answer),
            event_hooks={"response": [refuse_deep_json]},
        )

    async def _answer(self, request: httpx.Request) -> httpx.Response:
        scenario = self.scenario
        assert scenario is not None
        invocation = _CURRENT.get()
        url = str(request.url)
        server = next((base for base in self.servers if _under(url, base)), None)
        recorded = RecordedRequest(
            scenario=scenario.name,
            turn=scenario.turn,
            tool_name=invocation.tool_name if invocation else None,
            tool_call_id=invocation.call_id if invocation else None,
            idempotency_key=invocation.key if invocation else None,
            invocation=invocation.run_number if invocation else None,
            method=request.method,
            url=url,
            headers=tuple((k.lower(), v) for k, v in request.headers.items()),
            body=request.content,
            forwarded=server is not None,
        )
        scenario.requests.append(recorded)
        if server is not None:
            return await self._forward(request, server, invocation)
        if self.respond is not None:
            answer = self.respond(request)
            return await answer if inspect.isawaitable(answer) else answer
        for base, stub in self.stubs.items():
            if _under(url, base):
                path = url[len(base) :] or "/"
                headers = {k.lower(): v for k, v in request.headers.items()}
                with contextlib.redirect_stdout(io.StringIO()):  # a dev server's log lines
                    reply = stub(request.method, path, request.content, headers)
                    status, body = await reply if inspect.isawaitable(reply) else reply
                return httpx.Response(status, json=body)
        return httpx.Response(200, json={})

    async def _forward(
        self, request: httpx.Request, server: str, invocation: _Invocation | None
    ) -> httpx.Response:
        """Send `request` to the toolset's server for real; its answer, streamed back. A
        `tools/call` that reached it is counted; a `tools/list` answer is read for the
        tools' annotations (what the server itself says of them)."""
        assert self.forward is not None
        assert self.scenario is not None
        scenario = self.scenario
        message = _json_rpc(request.content)
        method = message.get("method") if message is not None else None
        timeout = request.extensions.get("timeout")
        sent = self.forward.build_request(
            request.method,
            request.url,
            headers=[(k, v) for k, v in request.headers.multi_items() if k not in _HOP_HEADERS],
            content=request.content,
            timeout=httpx.Timeout(**timeout) if isinstance(timeout, dict) else 30.0,
        )
        try:
            response = await self.forward.send(sent, stream=True)
        except httpx.ConnectError:
            raise  # it never reached the server
        except httpx.TransportError:
            self._count_call(scenario, server, method, message, invocation)
            raise
        self._count_call(scenario, server, method, message, invocation)
        keep = None
        if method == "tools/list" and response.status_code == 200:
            keep = lambda body: self._read_listing(server, body)  # noqa: E731
        return httpx.Response(
            response.status_code,
            headers=[(k, v) for k, v in response.headers.multi_items() if k not in _HOP_HEADERS],
            stream=_Relay(response, keep),
            request=request,
        )

    def _count_call(
        self,
        scenario: _Scenario,
        server: str,
        method: Any,
        message: dict[str, Any] | None,
        invocation: _Invocation | None,
    ) -> None:
        if method != "tools/call" or message is None:
            return
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        scenario.server_calls.append(
            _ServerCall(
                server=server,
                tool=str(params.get("name")),
                arguments=params.get("arguments"),
                key=_meta_key(message),
                call_id=invocation.call_id if invocation else None,
                run_number=invocation.run_number if invocation else None,
            )
        )

    async def _read_listing(self, server: str, body: bytes) -> None:
        for message in await _messages_in(body):
            result = message.get("result")
            tools = result.get("tools") if isinstance(result, dict) else None
            for entry in tools if isinstance(tools, list) else ():
                if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                    hints = entry.get("annotations")
                    self.server_tools[(server, entry["name"])] = (
                        dict(hints) if isinstance(hints, dict) else {}
                    )

    # -- playing ------------------------------------------------------------------

    def llm(self, one_per_step: bool) -> TestLLM:
        return TestLLM(one_per_step=one_per_step, arguments=self.arguments)

    async def play(self, scenario: _Scenario, one_per_step: bool) -> list[Message]:
        """Play every turn on the scenario's session, crashing once, resuming until done."""
        self.scenario = scenario
        crashing = _RecordingStore(
            self.store, scenario.crash, scenario.appends, scenario.approval_writes
        )
        session_id = scenario.name
        for turn, text in enumerate(self.messages):
            scenario.turn = turn
            for _ in range(_MAX_RUNS_PER_TURN):
                history = await self.store.load_messages(session_id)
                started = any(m.role == "user" and m.content == text for m in history)
                status, error = await self._run_once(
                    scenario, crashing, session_id, None if started else text, one_per_step
                )
                if status == "crashed":
                    await self._note_orphans(scenario, session_id)
                    continue
                if status == "complete":
                    break
                if status == "awaiting_approval":
                    if await self._decide(scenario, crashing, session_id) == "crashed":
                        await self._note_orphans(scenario, session_id)
                    continue
                if status != "max_steps":
                    agents = status in _AGENT_STATUSES
                    raise self._breach(
                        scenario,
                        f"run() ended with status {status!r} (error: {error}); with TestLLM "
                        "every turn should complete" + (_AGENT_STATUSES[status] if agents else ""),
                        await self.store.load_messages(session_id),
                        blame="agent" if agents else "kit",
                    )
            else:
                raise self._breach(
                    scenario,
                    f"turn {turn + 1} did not complete in {_MAX_RUNS_PER_TURN} runs (each "
                    f"ran up to max_steps={self.agent.max_steps} steps)",
                    await self.store.load_messages(session_id),
                )
        if scenario.crash is not None and not scenario.crashed:
            raise self._breach(
                scenario,
                "the crash point was never reached: it wrote less than without a crash. Does "
                "it behave differently from one run to the next (state kept between runs, the "
                "clock, randomness in a handler or in make_deps)? If not, the kit broke a rule "
                "here; please report this",
                await self.store.load_messages(session_id),
                blame="agent",
            )
        return await self.store.load_messages(session_id)

    async def _run_once(
        self,
        scenario: _Scenario,
        crashing: CrashingStore,
        session_id: str,
        message: str | None,
        one_per_step: bool,
    ) -> tuple[str, str | None]:
        scenario.runs += 1
        self.runs += 1
        target: Store = self.store if scenario.crashed else crashing
        async with self._client() as http:
            try:
                deps = self.make_deps(self.env, http)
            except Exception as exc:
                raise AssertionError(
                    f"your agent broke a rule: make_deps(env, http) raised "
                    f"{type(exc).__name__}: {exc}\n"
                    f"env: {self.env!r}; pass the settings it needs as "
                    "check_agent(..., env={...})"
                ) from exc
            try:
                result = await run(
                    self.run_agent,
                    llm=self.llm(one_per_step),
                    message=message,
                    session_id=session_id,
                    store=target,
                    tools=self.handlers,
                    deps=deps,
                    settings=self.settings,
                    http=http,
                )
            except SimulatedCrash:
                scenario.crashed = True
                return "crashed", None
            except Exception as exc:  # the check controls the call: the kit's to answer for
                raise self._breach(
                    scenario,
                    f"run() raised {type(exc).__name__}: {exc}",
                    await self.store.load_messages(session_id),
                ) from exc
        return result.status, result.error

    async def _decide(self, scenario: _Scenario, crashing: CrashingStore, session_id: str) -> str:
        """Decide every waiting call of the session with `approve()`, as a person would (through
        the crashing store: a decision is an append, and a crash point)."""
        target: Store = self.store if scenario.crashed else crashing
        history = await self.store.load_messages(session_id)
        states = approval_states(await self.store.load_approvals(session_id))
        for call in pending_tool_calls(history):
            state = states.get(call.id)
            if state is None or state.decision is not None:
                continue
            pending = PendingApproval(call.id, call.name, dict(call.arguments), state.digest)
            if self.decide == "edit":
                decision: Any = self.edit_for(call)
                decision = True if decision is None else decision  # no other arguments fit
            else:
                decision = self.decide(pending)
            if isinstance(decision, Mapping):
                edit: dict[str, Any] | None = copy.deepcopy(dict(decision))
                approved = True
            elif isinstance(decision, bool):
                edit, approved = None, decision
            else:
                raise ConfigurationError(
                    f"decide() must return True, False or a dict of edited arguments; for "
                    f"{call.name}#{call.id} it returned {type(decision).__name__}"
                )
            scenario.decisions[call.id] = approved
            if edit is not None and not _same_call(session_id, call, edit):
                scenario.edits[call.id] = edit
            verdict = "approved" if approved else "denied"
            try:
                await approve(
                    target,
                    session_id,
                    call.id,
                    digest=state.digest,
                    approved=approved,
                    reason=f"check_agent: {verdict}{' with an edit' if edit else ''}",
                    arguments=edit,
                    agent=self.agent,
                )
            except SimulatedCrash:
                scenario.crashed = True
                return "crashed"
            except ToolArgumentsError as exc:
                raise ConfigurationError(
                    f"decide= gave arguments for {call.name}#{call.id} that do not fit its "
                    f"input schema: {exc}"
                ) from exc
            except Exception as exc:
                raise self._breach(
                    scenario,
                    f"approve() of {call.name}#{call.id} raised {type(exc).__name__}: {exc}",
                    history,
                ) from exc
        return "decided"

    def edit_for(self, call: ToolCall) -> dict[str, Any] | None:
        """An approver's edit of `call` for decide="edit": arguments made from the tool's
        input schema as TestLLM makes them, but another value of each field (the first
        variant that fits the schema, the tool's model, and differs from the model's
        arguments). None when the schema allows no other arguments."""
        made = json.dumps([call.name, call.arguments], sort_keys=True)
        if made in self.edits:
            return copy.deepcopy(self.edits[made])
        checker = _tool_checking(call, self.tools)
        schema = checker.input_schema
        found = None
        for variant in range(1, _EDIT_VARIANTS + 1):
            value = variant_arguments(schema, variant)
            if not isinstance(value, dict) or value == call.arguments:
                continue
            try:
                checker.parse_arguments(value)
            except ToolArgumentsError:
                continue
            found = value
            break
        self.edits[made] = found
        return copy.deepcopy(found)

    async def _note_orphans(self, scenario: _Scenario, session_id: str) -> None:
        """The calls a crash left without a result and that may have run: a call waiting
        for a decision, or decided and not claimed yet, is no orphan (it never ran)."""
        states = approval_states(await self.store.load_approvals(session_id))
        for call in pending_tool_calls(await self.store.load_messages(session_id)):
            state = states.get(call.id)
            if state is None or state.claimed:
                scenario.orphaned[call.id] = call.name

    # -- the checks ---------------------------------------------------------------

    async def check(self, scenario: _Scenario, history: list[Message]) -> None:
        states = approval_states(await self.store.load_approvals(scenario.name))
        try:
            _assert_well_formed(history, self.messages)
            self._assert_approvals(scenario, history, states)
            self._assert_calls(scenario, history)
            self._assert_server_calls(scenario, history, states)
        except _AgentBreach as exc:
            raise self._breach(scenario, str(exc), history, blame="agent") from None
        except AssertionError as exc:
            raise self._breach(scenario, str(exc), history) from None

    def _rules(self, call: ToolCall) -> tuple[bool, bool] | None:
        """(safe_to_retry, requires_approval) as the kit decides a stored call: by the policy
        stored with a toolset's call, else by the agent's own tool; None for no such tool."""
        if call.policy is not None:
            policy = call.policy
            return policy.get("safe_to_retry") is True, policy.get("requires_approval") is True
        tool = self.tools.get(call.name)
        return None if tool is None else (tool.safe_to_retry, tool.requires_approval)

    def _safe_by_name(self, history: Sequence[Message]) -> dict[str, bool]:
        """Each tool's safe_to_retry, by name: the agent's declaration, or for a toolset's
        tool what the kit stored with its calls (the listing's, before any call)."""
        safe = {name: t.safe_to_retry for name, t in self.listed.items()}
        for message in history:
            for call in message.tool_calls:
                rules = self._rules(call)
                if call.policy is not None and rules is not None:
                    safe[call.name] = rules[0]
        safe.update({name: t.safe_to_retry for name, t in self.tools.items()})
        return safe

    def _assert_approvals(
        self, scenario: _Scenario, history: list[Message], states: Mapping[str, ApprovalState]
    ) -> None:
        """No call of a requires_approval tool ran without a stored approval of that exact
        call (claimed before it ran); an approved one ran at most once; a denied one never
        ran and was answered `tool-denied`; an edited one ran with the edit only."""
        calls = {c.id: c for m in history for c in m.tool_calls}
        results = {m.tool_call_id: m for m in history if m.role == "tool"}
        for invocation in scenario.invocations:
            call = calls.get(invocation.call_id)
            if call is not None:
                rules = self._rules(call)
            else:  # (_assert_calls says it ran for no stored call)
                ran = self.tools.get(invocation.tool_name) or self.listed.get(invocation.tool_name)
                rules = None if ran is None else (ran.safe_to_retry, ran.requires_approval)
            if rules is None or not rules[1]:
                continue
            state = invocation.approval
            where = f"{invocation.tool_name}#{invocation.call_id} (run {invocation.run_number})"
            had = "no approval request" if state is None else state.decision
            unapproved = f"requires_approval tool {where} ran without a stored approval"
            assert state is not None, f"{unapproved} (the store had: {had})"
            assert state.decision == "approved", f"{unapproved} (the store had: {had})"
            assert state.claimed, f"approved call {where} ran before its claim was stored"
            if call is not None:
                digest = approval_digest(scenario.name, call.id, call.name, call.arguments)
                assert digest == state.digest, (
                    f"approved call {where} ran with arguments other than the approved ones"
                )
        runs = Counter(i.call_id for i in scenario.invocations)
        for call_id, call in calls.items():
            rules = self._rules(call)
            if rules is None or not rules[1]:
                continue
            safe = rules[0]
            state = states.get(call_id)
            error = tool_error(results[call_id].content)
            kind = error.get("kind") if error else None
            if state is None:  # answered at once: a call that could not run
                assert kind in _HANDLER_NOT_CALLED - {ToolErrorKind.TOOL_DENIED}, (
                    f"call {call.name}#{call_id} of a requires_approval tool has no approval "
                    f"request stored, and its result is {kind or 'a result'}"
                )
                continue
            if call_id in scenario.decisions:
                want = "approved" if scenario.decisions[call_id] else "denied"
                assert state.decision == want, (
                    f"call {call.name}#{call_id} was {want} with approve(); the store says "
                    f"{state.decision}"
                )
            if state.decision == "denied":
                self.denied += 1
                assert runs[call_id] == 0, (
                    f"denied call {call.name}#{call_id} ran {runs[call_id]} time(s)"
                )
                assert kind == ToolErrorKind.TOOL_DENIED, (
                    f"denied call {call.name}#{call_id} got {kind or 'a result'}, not tool-denied"
                )
                continue
            assert state.decision == "approved", (
                f"call {call.name}#{call_id} has a result but no decision was stored"
            )
            self.approved += 1
            if not safe:
                assert runs[call_id] <= 1, (
                    f"approved call {call.name}#{call_id} ran {runs[call_id]} times"
                )
            assert kind != ToolErrorKind.TOOL_DENIED or runs[call_id] == 0, (
                f"approved call {call.name}#{call_id} ran and was answered tool-denied"
            )
            lost = ToolDurabilityError.from_message(results[call_id]) is not None
            if lost:
                assert state.claimed, (
                    f"call {call.name}#{call_id} got a tool-durability-error though it was "
                    "never claimed (an unclaimed approved call never ran: it must run)"
                )
            self._assert_edit(scenario, call, state, results[call_id], lost)

    def _assert_edit(
        self,
        scenario: _Scenario,
        call: ToolCall,
        state: ApprovalState,
        result: Message,
        lost: bool,
    ) -> None:
        """An approval with edited arguments: stored with the edit as sent and its digest;
        every run of the call's handler had the edit (never the model's arguments); a result
        of a run says so, with the edit."""
        where = f"{call.name}#{call.id}"
        sent = scenario.edits.get(call.id)
        if sent is not None:
            assert state.arguments == sent, (
                f"call {where} was approved with edited arguments {sent!r}; the stored "
                f"approval has {state.arguments!r}"
            )
        if state.arguments is None:
            return
        self.edited += 1
        assert state.arguments_digest == approval_digest(
            scenario.name, call.id, call.name, state.arguments
        ), f"the edited approval of {where} is stored with a digest that is not its edit's"
        checker = _tool_checking(call, self.tools)
        wanted = _plain(checker.parse_arguments(state.arguments))
        models = _plain(checker.parse_arguments(call.arguments))
        for invocation in scenario.invocations:
            if invocation.call_id != call.id or invocation.arguments == wanted:
                continue
            which = "the model's arguments" if invocation.arguments == models else "other arguments"
            raise AssertionError(
                f"approved call {where} (run {invocation.run_number}) ran with {which}, not the "
                f"approver's edit: {invocation.arguments!r}, where the edit is {wanted!r}"
            )
        ran = any(i.call_id == call.id for i in scenario.invocations)
        if ran and not lost:
            content = _json_value(result.content)
            said = content.get("edited_arguments") if isinstance(content, dict) else None
            assert said == state.arguments, (
                f"the result of {where}, which ran with an approver's edit, does not say so "
                f"(edited_arguments {state.arguments!r}): {result.content[:200]!r}"
            )

    def _assert_calls(self, scenario: _Scenario, history: list[Message]) -> None:
        calls = {c.id: c for m in history for c in m.tool_calls}
        results = {m.tool_call_id: m for m in history if m.role == "tool"}
        runs = Counter(i.call_id for i in scenario.invocations)
        per_turn = Counter((i.turn, i.tool_name) for i in scenario.invocations)
        for invocation in scenario.invocations:
            call = calls.get(invocation.call_id)
            stored_as = call.name if call is not None else None
            assert stored_as == invocation.tool_name, (
                f"the handler of {invocation.tool_name!r} ran for call {invocation.call_id!r}, "
                "which the history does not store: a call must be stored before it runs"
            )
        safe_by_name = self._safe_by_name(history)
        for (turn, name), count in per_turn.items():
            if not safe_by_name.get(name, False):
                assert count <= 1, (
                    f"unsafe tool {name!r} ran {count} times in turn {turn + 1} (TestLLM calls "
                    "it once a turn: a stored call was lost and the call made again). Its "
                    f"requests: {_requests_of(scenario, name, turn)}"
                )
        for call_id, call in calls.items():
            result = results[call_id]
            durability = ToolDurabilityError.from_message(result)
            error = tool_error(result.content)
            n = runs[call_id]
            # (A handler may answer invalid-arguments itself, e.g. an MCP server's -32602:
            # then it ran, and is checked as any call that ran.)
            not_run = error is not None and error.get("kind") in _HANDLER_NOT_CALLED and n == 0
            rules = self._rules(call)
            if rules is None or not_run:
                continue
            safe = rules[0]
            if durability is not None:
                self.durability_errors += 1
                assert not safe, (
                    f"call {call.name}#{call_id} of a safe_to_retry tool got a "
                    "tool-durability-error: a safe orphan must be run again"
                )
                assert (durability.tool_name, durability.tool_call_id) == (call.name, call_id), (
                    f"the durability error answering {call.name}#{call_id} names "
                    f"{durability.tool_name}#{durability.tool_call_id}"
                )
            if safe:
                assert n >= 1, f"safe call {call.name}#{call_id} has a result but never ran"
                if n > 1:
                    self.safe_reinvocations += n - 1
                    self._assert_keyed(scenario, call_id)
                continue
            assert n <= 1, (
                f"unsafe call {call.name}#{call_id} ran {n} times; its requests: "
                f"{[str(r) for r in scenario.requests if r.tool_call_id == call_id]}"
            )
            if call_id in scenario.orphaned:
                assert durability is not None, (
                    f"unsafe call {call.name}#{call_id} lost its result in a crash but its "
                    "stored result is not a tool-durability-error"
                )
            elif durability is None:
                assert n == 1, (
                    f"unsafe call {call.name}#{call_id} has a result of its own but its "
                    "handler never ran"
                )
            for request in scenario.requests:
                if request.tool_call_id == call_id and not request.carries(
                    request.idempotency_key or "\x00"
                ):
                    self.unkeyed.add(f"{call.name}: {request.method} {request.url}")

    def _assert_server_calls(
        self, scenario: _Scenario, history: list[Message], states: Mapping[str, ApprovalState]
    ) -> None:
        """Each MCP call (a `tools/call` a toolset's server received) belongs to a stored
        call, and reached the server once, unless the server lists its tool read-only; an
        edited call sent the server the edit."""
        calls = {c.id: c for m in history for c in m.tool_calls}
        by_key = {idempotency_key(scenario.name, c.id): c.id for c in calls.values()}
        sent: dict[str, list[_ServerCall]] = {}
        for server_call in scenario.server_calls:
            call_id = by_key.get(server_call.key or "") or server_call.call_id
            if call_id not in calls:
                raise self._toolset_fault(
                    server_call.server,
                    f"a tools/call of {server_call.tool!r} reached {server_call.server} for no "
                    f"stored call (its _meta key: {server_call.key!r})",
                )
            sent.setdefault(call_id, []).append(server_call)
        runs = Counter(i.call_id for i in scenario.invocations)
        for call_id, reached in sent.items():
            self.mcp_calls += len(reached)
            call = calls[call_id]
            first = reached[0]
            state = states.get(call_id)
            if state is not None and state.arguments is not None:
                for server_call in reached:
                    assert server_call.arguments == state.arguments, (
                        f"approved call {call.name}#{call_id} sent the MCP server the "
                        f"arguments {server_call.arguments!r}, not the approver's edit "
                        f"{state.arguments!r}"
                    )
            if len(reached) == 1:
                continue
            server_says = self.server_tools.get((first.server, first.tool))
            read_only = server_says is not None and server_says.get("readOnlyHint") is True
            rules = self._rules(call)
            if rules is not None and rules[0] and (read_only or server_says is None):
                # A read the server calls read-only: a lost result is sent again. (Of a tool
                # whose listing the check could not read, it takes the stored policy's word.)
                continue
            times = f"the MCP server at {first.server} got call {call.name}#{call_id} " + (
                f"({first.tool!r} on the server) {len(reached)} times"
            )
            if rules is not None and rules[0]:
                stored = dict(call.policy or {})
                raise self._toolset_fault(
                    first.server,
                    f"{times}: the kit sent it again after a crash because the toolset stored "
                    f"{call.name!r} as safe_to_retry (with annotations "
                    f"{stored.get('annotations')!r}), but the server lists it with annotations "
                    f"{server_says!r}, not readOnlyHint: true. A side effect marked safe runs "
                    "twice",
                )
            if runs[call_id] <= 1:
                raise self._toolset_fault(
                    first.server,
                    f"{times} from {runs[call_id]} run(s) of its handler: the toolset's handler "
                    "sent one call more than once (a retry of a side effect)",
                )
            raise AssertionError(f"{times}: the kit ran its handler {runs[call_id]} times")

    def _toolset_fault(self, server: str, what: str) -> AssertionError:
        """A toolset's mistake: the kit's when it is the kit's own `MCPTools`, else the
        agent's (a toolset of its own, or a wrapper)."""
        toolset = self.servers.get(server)
        if type(toolset) is MCPTools:
            return AssertionError(f"{what} (toolset {toolset!r})")
        return _AgentBreach(f"{what} (toolset {_name(toolset)}, the agent's own)")

    def _assert_keyed(self, scenario: _Scenario, call_id: str) -> None:
        sent = [r for r in scenario.requests if r.tool_call_id == call_id]
        for request in sent:
            if _json_rpc(request.body) is not None and request.forwarded:
                continue  # an MCP server's: judged by what it says of the tool (above)
            if request.method in _NON_IDEMPOTENT and not request.carries(
                request.idempotency_key or "\x00"
            ):
                raise _AgentBreach(
                    f"tool {request.tool_name!r} is declared safe_to_retry, so the kit ran "
                    f"call {call_id!r} again after a crash, and it re-sent {request.method} "
                    f"{request.url} without its idempotency key in a header: the "
                    "re-invocation repeats that side effect. "
                    "Send ctx.idempotency_key (e.g. an Idempotency-Key header) to a server "
                    "that deduplicates by it, or drop safe_to_retry. Requests of the call: "
                    f"{[str(r) for r in sent]}"
                )

    def _breach(
        self,
        scenario: _Scenario,
        what: str,
        history: list[Message],
        *,
        blame: Literal["agent", "kit"] = "kit",
    ) -> AssertionError:
        """The failure, saying whose rule broke: the agent's (its tools, their
        declarations, make_deps) or the kit's (what it stores, and when it runs a call)."""
        where = f"after {scenario.crash}" if scenario.crash else "without a crash"
        requests = "\n".join(f"    {r}" for r in scenario.requests) or "    (none)"
        if blame == "agent":
            rule = f"your agent broke a rule: {what}"
        elif self.own_store:
            rule = (
                "the kit, or the store given as store=, broke a rule (check_agent cannot tell "
                f"them apart): {what} — please report this if that store is the kit's own"
            )
        else:
            rule = f"the kit broke a rule: {what} — please report this"
        return AssertionError(
            f"check_agent: agent {self.agent.name!r}, TestLLM({scenario.mode}), {where}, "
            f"session {scenario.name!r}:\n  {rule}\n"
            f"  stored history:\n{format_history(history)}\n  requests:\n{requests}"
        )


def _requests_of(scenario: _Scenario, tool_name: str, turn: int) -> list[str]:
    return [str(r) for r in scenario.requests if r.tool_name == tool_name and r.turn == turn]


def _under(url: str, base: str) -> bool:
    """Whether `url` is `base` or below it (a path under it, or it with a query)."""
    base = base.rstrip("/")
    return url.rstrip("/") == base or url.startswith((base + "/", base + "?"))


def _json_rpc(body: bytes) -> dict[str, Any] | None:
    """The JSON-RPC message a request's body is (an MCP client's), or None."""
    if not body.lstrip().startswith(b"{"):
        return None
    try:
        message = json.loads(body)
    except ValueError:
        return None
    ok = isinstance(message, dict) and message.get("jsonrpc") == "2.0"
    return message if ok else None


def _meta_key(message: Mapping[str, Any]) -> str | None:
    """The idempotency key a `tools/call` carries in its `_meta` (`MCPTools` sends it)."""
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    key = meta.get(IDEMPOTENCY_KEY_META) if isinstance(meta, dict) else None
    return key if isinstance(key, str) else None


async def _messages_in(body: bytes) -> list[dict[str, Any]]:
    """The JSON-RPC messages of an MCP server's answer: a JSON body, or an event stream's
    events (read as the kit's own SSE reader reads them)."""
    text = body.decode("utf-8", "replace")
    whole = _json_value(text)
    if whole is not None:
        return [m for m in (whole if isinstance(whole, list) else [whole]) if isinstance(m, dict)]

    async def chunks() -> AsyncIterator[bytes]:
        yield body

    found = []
    async for event in sse_events(sse_lines(chunks())):
        value = _json_value(event.data)
        if isinstance(value, dict):
            found.append(value)
    return found


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _name(toolset: object) -> str:
    """A toolset in a message: its repr, or its class's name when it has no repr of its own."""
    if type(toolset).__repr__ is object.__repr__:
        return type(toolset).__name__
    return repr(toolset)


def _plain(args: Any) -> Any:
    """A handler's `args` as JSON values, to compare with arguments as stored."""
    if isinstance(args, BaseModel):
        return args.model_dump(mode="json")
    return copy.deepcopy(args)


def _same_call(session_id: str, call: ToolCall, arguments: Mapping[str, Any]) -> bool:
    """Whether `arguments` are the model's own (the same digest: `approve()` then stores a
    plain approval)."""
    try:
        edited = approval_digest(session_id, call.id, call.name, arguments)
    except (TypeError, ValueError):
        return False
    return edited == approval_digest(session_id, call.id, call.name, call.arguments)


def _tool_checking(call: ToolCall, tools: Mapping[str, Tool]) -> Tool:
    """What checks arguments for `call`, as `approve()` checks an edit: the input schema
    stored with a toolset's call, else the agent's own tool."""
    if call.policy is not None:
        schema = call.policy.get("input_schema")
        return Tool(call.name, "", schema if isinstance(schema, dict) else {"type": "object"})
    return tools[call.name]


def _label_appends(
    appends: list[list[Message]], approval_writes: Sequence[Sequence[ApprovalChange]] = ()
) -> list[str]:
    """Name each append of an uncrashed play: which write of which step of which turn."""
    labels = []
    turn = step = 0
    changes = list(approval_writes) or [[] for _ in appends]
    for messages, approvals in zip(appends, changes, strict=True):
        if any(m.role == "user" for m in messages):
            turn, step = turn + 1, 0
        if not messages:  # a decision or a claim: approval events only
            what = ", ".join(f"{a.event} {a.tool_call_id}" for a in approvals) or "nothing"
            labels.append(f"turn {turn} step {step}: approval write ({what})")
            continue
        last = messages[-1]
        if last.role == "assistant" and last.tool_calls:
            step += 1
            names = ", ".join(c.name for c in last.tool_calls)
            labels.append(f"turn {turn} step {step} write #1: calls {names}")
        elif last.role == "tool":
            labels.append(f"turn {turn} step {step} write #2: {len(messages)} result(s)")
        elif last.role == "assistant":
            labels.append(f"turn {turn}: the final reply")
        else:
            labels.append(f"turn {turn}: {last.role} message")
    return labels


def _assert_well_formed(history: Sequence[Message], user_messages: Sequence[str]) -> None:
    """The shape every stored session must have: turns of user, steps, final reply.

    A step is an assistant message with calls, followed directly by exactly one
    result per call, in the order the kit stored them: a step's write #2 holds the
    results of the calls that need no decision, in call order; those of calls that
    waited for a person's decision (or that the kit deferred, or that a crash left
    as orphans) come in a later write, after them. So a gated call declared first
    is answered last, and any order of one result per call is well formed. A
    summary (`durable_agents.context`) may stand between a turn's steps or before
    its user message."""
    users = []
    seen: set[str] = set()
    i = 0
    assert history, "the history is empty"
    while i < len(history):
        while i < len(history) - 1 and history[i].is_summary:
            i += 1
        user = history[i]
        assert user.role == "user", (
            f"message {i}: expected a turn's user message, got {user.role!r}"
        )
        users.append(user.content)
        i += 1
        reply = None
        while i < len(history):
            message = history[i]
            if message.is_summary:  # stored at a step boundary, before the next LLM call
                i += 1
                continue
            assert message.role == "assistant", (
                f"message {i}: expected an assistant message, got {message.role!r} (a user "
                "message may only follow a final reply)"
            )
            i += 1
            if not message.tool_calls:
                reply = message
                break
            calls = {}
            for call in message.tool_calls:
                assert call.id, f"message {i - 1}: a stored tool call has no id"
                assert call.id not in seen, f"message {i - 1}: tool call id {call.id!r} is reused"
                seen.add(call.id)
                calls[call.id] = call
            step, answered = i - 1, set[str]()
            while i < len(history) and history[i].role == "tool":
                result = history[i]
                call_id = result.tool_call_id or ""
                answers = calls.get(call_id)
                assert answers is not None, (
                    f"message {i}: the result of {result.tool_name}#{call_id} follows message "
                    f"{step}, which made no such call (each result must follow its own step)"
                )
                assert call_id not in answered, (
                    f"message {i}: a second result for {answers.name}#{call_id} (a call gets "
                    "exactly one)"
                )
                assert result.tool_name == answers.name, (
                    f"message {i}: the result of call {call_id} names tool "
                    f"{result.tool_name!r}, the call {answers.name!r}"
                )
                answered.add(call_id)
                i += 1
            missing = [f"{c.name}#{c.id}" for c in message.tool_calls if c.id not in answered]
            assert not missing, (
                f"message {step}: {len(calls)} calls, but only {len(answered)} results follow it "
                f"directly (none for {', '.join(missing)})"
                + (f"; message {i} ({history[i].role}) comes next" if i < len(history) else "")
            )
        assert reply is not None, f"turn {len(users)} has no final reply"
    assert users == list(user_messages), (
        f"the stored user messages are {users!r}; sent (each once): {list(user_messages)!r}"
    )


def format_history(messages: Sequence[Message]) -> str:
    """A numbered, one-line-per-message rendering of a stored history."""
    lines = []
    for seq, m in enumerate(messages):
        if m.role == "assistant" and m.tool_calls:
            calls = ", ".join(f"{c.name}#{c.id}" for c in m.tool_calls)
            lines.append(f"    {seq:3} assistant calls [{calls}]")
        elif m.role == "tool":
            error = tool_error(m.content)
            kind = error.get("kind", "error") if error else "result"
            lines.append(f"    {seq:3} tool {m.tool_name}#{m.tool_call_id}: {kind}")
        else:
            lines.append(f"    {seq:3} {m.role}: {m.content[:70]!r}")
    return "\n".join(lines) or "    (empty)"


# -- the entry points -----------------------------------------------------------------


def _settings(
    config: str | os.PathLike[str] | None, env: Mapping[str, Any] | None, module_file: str | None
) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    if config is not None:
        path = _find_config(Path(config), module_file)
        if not path.is_file():
            raise FileNotFoundError(
                f"check_agent: no config at {path.resolve()}; pass config= (the project's "
                "wrangler.toml) or config=None"
            )
        vars_ = tomllib.loads(path.read_text()).get("vars", {})
        settings.update(vars_)  # as a Worker sees them: strings, or JSON values as they are
    settings.update(env or {})
    return settings


def _find_config(config: Path, module_file: str | None) -> Path:
    """A relative config path from the current directory, else from the nearest folder above
    the agent module that has it (src/agent.py finds the project's wrangler.toml)."""
    if config.is_absolute() or config.exists() or module_file is None:
        return config
    for directory in Path(module_file).resolve().parents:
        if (directory / config).is_file():
            return directory / config
    return config


def _placeholder(name: str) -> str:
    host = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "setting"
    return f"https://{host}.check.invalid"


def _load(
    module: ModuleType | str,
) -> tuple[Agent, Callable[..., Any], Mapping[str, Any], str | None]:
    if isinstance(module, str):
        module = importlib.import_module(module)
    where = getattr(module, "__file__", None) or module.__name__
    agent = getattr(module, "AGENT", None)
    if not isinstance(agent, Agent):
        raise ConfigurationError(f"{where}: AGENT must be an Agent, got {type(agent).__name__}")
    make_deps = getattr(module, "make_deps", None)
    if not callable(make_deps):
        raise ConfigurationError(f"{where}: make_deps(env, http) is missing")
    stubs = getattr(module, "DEV_STUBS", None) or {}
    return agent, make_deps, stubs, getattr(module, "__file__", None)


async def check_agent_async(
    module: ModuleType | str,
    *,
    config: str | os.PathLike[str] | None = "wrangler.toml",
    env: Mapping[str, Any] | None = None,
    turns: int = 2,
    respond: Responder | None = None,
    arguments: Mapping[str, Mapping[str, Any]] | None = None,
    store: Callable[[Path], Store] | None = None,
    decide: DecidePolicy = "all",
) -> AgentCheckReport:
    """`check_agent`, awaitable (for async tests). Same arguments, same report."""
    started = time.monotonic()
    agent, make_deps, stubs, module_file = _load(module)
    settings = _settings(config, env, module_file)
    given = dict(settings)
    answering = {}
    placeholders = set()
    for name in {*settings, *stubs}:
        value = settings.get(name, "")
        empty = isinstance(value, str) and not value.strip()
        if empty and (name.endswith("_URL") or name in stubs):
            settings[name] = _placeholder(name)
            placeholders.add(name)
            if name in stubs:
                answering[settings[name]] = stubs[name]
    # What the Worker passes run(settings=): the values of the settings the toolsets read
    # (an empty one as it is, unless a dev stub answers at its placeholder).
    run_settings = {
        n: str(v)
        for n in agent.settings
        if (v := settings.get(n) if n in stubs else given.get(n)) is not None
    }
    servers = _toolset_servers(agent, settings, placeholders)
    with tempfile.TemporaryDirectory(prefix="check-agent-") as directory:
        if store is None:
            from ..stores.sqlite import sqlite_store

            backend: Store = sqlite_store(Path(directory) / "check_agent.db")
        else:
            backend = store(Path(directory))
        forward = httpx.AsyncClient(timeout=30.0) if servers else None
        try:
            checker = _Checker(
                agent,
                make_deps,
                CheckEnv(settings),
                backend,
                turns=turns,
                respond=respond,
                arguments=arguments or {},
                stubs=answering,
                own_store=store is not None,
                settings=run_settings,
                servers=servers,
                forward=forward,
            )
            await checker.list_toolsets()
            gated = any(t.requires_approval for t in (*agent.tools, *checker.listed.values()))
            for policy, decider in _policies(gated, decide):
                checker.decide = decider
                for one_per_step in (False, True):
                    await _sweep(checker, one_per_step, policy)
        finally:
            if forward is not None:
                await forward.aclose()
            close = getattr(backend, "close", None)
            if close is not None:
                await close()
    tools = [*agent.tools, *checker.listed.values()]
    return AgentCheckReport(
        agent=agent.name,
        safe_tools=tuple(sorted(t.name for t in tools if t.safe_to_retry)),
        unsafe_tools=tuple(sorted(t.name for t in tools if not t.safe_to_retry)),
        crash_points=checker.crash_points,
        runs=checker.runs,
        requests=checker.requests,
        durability_errors=checker.durability_errors,
        safe_reinvocations=checker.safe_reinvocations,
        unkeyed_unsafe_requests=tuple(sorted(checker.unkeyed)),
        approval_tools=tuple(sorted(t.name for t in tools if t.requires_approval)),
        approved=checker.approved,
        denied=checker.denied,
        edited=checker.edited,
        toolset_tools=tuple(sorted(checker.listed)),
        mcp_calls=checker.mcp_calls,
        seconds=time.monotonic() - started,
    )


def _toolset_servers(
    agent: Agent, settings: Mapping[str, Any], placeholders: set[str]
) -> dict[str, Toolset]:
    """The servers of the agent's toolsets, whose requests are forwarded: a URL a toolset
    was given (`MCPTools(url=...)`), or that a setting it reads holds (not an empty one
    the check filled with a placeholder)."""
    servers: dict[str, Toolset] = {}
    for toolset in agent.toolsets:
        urls = [getattr(toolset, "url", None)]
        urls += [settings.get(n) for n in getattr(toolset, "settings", ()) if n not in placeholders]
        for url in urls:
            if isinstance(url, str) and url.strip().startswith(("http://", "https://")):
                servers.setdefault(url.strip(), toolset)
    return servers


def _policies(gated: bool, decide: DecidePolicy) -> list[tuple[str, Decide | Literal["edit"]]]:
    """The sweeps to run: (name, decision per waiting call). "all" sweeps approving every
    call, denying every call and approving every call with edited arguments, "both" the
    first two, when the agent has a tool that needs approval (else one sweep)."""
    if callable(decide):
        return [("decide", decide)]
    approve_all: Decide = lambda pending: True  # noqa: E731
    deny_all: Decide = lambda pending: False  # noqa: E731
    named: dict[str, list[tuple[str, Decide | Literal["edit"]]]] = {
        "approve": [("approve", approve_all)],
        "deny": [("deny", deny_all)],
        "edit": [("edit", "edit")],
        "both": [("approve", approve_all), ("deny", deny_all)],
        "all": [("approve", approve_all), ("deny", deny_all), ("edit", "edit")],
    }
    if decide not in named:
        raise ConfigurationError(
            "decide= must be 'all', 'approve', 'deny', 'edit', 'both' or a callable, got "
            f"{decide!r}"
        )
    if decide in ("both", "all") and not gated:
        return named["approve"]
    return named[decide]


async def _sweep(checker: _Checker, one_per_step: bool, policy: str = "approve") -> None:
    mode = f"one_per_step={one_per_step}"
    if policy != "approve":
        mode += f", decisions: {policy}"
    prefix = f"check-{policy}-{'steps' if one_per_step else 'batch'}"
    baseline = _Scenario(f"{prefix}-baseline", mode, None, policy)
    history = await checker.play(baseline, one_per_step)
    await checker.check(baseline, history)
    checker.requests += len(baseline.requests)
    ran = {i.tool_name for i in baseline.invocations}
    denied = {
        c.name for m in history for c in m.tool_calls if not baseline.decisions.get(c.id, True)
    }
    for name in sorted({*checker.tools, *checker.listed} - ran - denied):
        result = next((m.content for m in history if m.tool_name == name), "no call")
        hint = (
            "the arguments= given for it do not fit its input schema"
            if name in checker.given
            else "see why in its result"
        )
        raise checker._breach(
            baseline,
            f"TestLLM's call of tool {name!r} never reached its handler ({result}); so it "
            f"would go unchecked: {hint}",
            history,
            blame="agent",
        )
    labels = _label_appends(baseline.appends, baseline.approval_writes)
    for n, label in enumerate(labels, 1):
        for when in _SIDES:
            crash = _Crash(n, when, label)
            scenario = _Scenario(f"{prefix}-{n}-{when}", mode, crash, policy)
            history = await checker.play(scenario, one_per_step)
            await checker.check(scenario, history)
            checker.crash_points += 1
            checker.requests += len(scenario.requests)


def check_agent(
    module: ModuleType | str,
    *,
    config: str | os.PathLike[str] | None = "wrangler.toml",
    env: Mapping[str, Any] | None = None,
    turns: int = 2,
    respond: Responder | None = None,
    arguments: Mapping[str, Mapping[str, Any]] | None = None,
    store: Callable[[Path], Store] | None = None,
    decide: DecidePolicy = "all",
) -> AgentCheckReport:
    """Run an agent module at every crash point and check the at-most-once contract.

    `module`: the agent module (or its import name), e.g.
    `importlib.import_module("agent")` for `src/agent.py`. `config`: the
    wrangler.toml whose `[vars]` make the env (None: no settings; a relative
    path not found from the current directory is looked for in the folders
    above the module); `env`: settings added or overriding them (a toolset's
    server URL, e.g. `env={"MCP_URL": ...}`: its requests are forwarded to it).
    `turns`: turns per session. `respond(request) -> httpx.Response` answers
    the handlers' requests other than a toolset server's (default: the
    module's `DEV_STUBS` for the settings they serve, else `200 {}`).
    `arguments`: `{tool name: arguments}` for tools whose arguments `TestLLM`
    cannot make from the schema (it says which field, e.g. a pattern with a
    lookahead), or that you want fixed. `store(dir)`: the
    store to run on (default: a SQLite file in a temporary directory).
    `decide`: how waiting calls of `requires_approval` tools are decided:
    `"all"` (default: one sweep approving them all, one denying them all, one
    approving them all with edited arguments), `"approve"`, `"deny"`, `"edit"`,
    `"both"` (approve, then deny), or `decide(PendingApproval) -> bool | dict`
    (a dict approves the call with those arguments instead of the model's).

    Returns an `AgentCheckReport`; raises `AssertionError` with the crash
    point, the stored history and the requests on the first breach (see the
    module docstring for what is checked). Runs its own event loop: from
    async code, `await check_agent_async(...)`.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError(
            "check_agent() runs its own event loop; in async code use "
            "`await check_agent_async(...)`"
        )
    return asyncio.run(
        check_agent_async(
            module,
            config=config,
            env=env,
            turns=turns,
            respond=respond,
            arguments=arguments,
            store=store,
            decide=decide,
        )
    )
