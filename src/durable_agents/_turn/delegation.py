"""Agents as tools: what a run needs to let one of its tools run a turn of another agent.

An agent tool (`durable_agents.agent_tools.agent_tool`) runs one turn of a named
agent in a session of its own, named for the parent's session and call
(`child_session_name`), started with the call's idempotency key as its request
key: a call run again after a crash finds that turn and finishes it or reads its
reply, never starting a second one. So the tool is `safe_to_retry`.

Who runs the child is an `AgentRunner`: `LocalAgents` on CPython (the child's
`run()` on the parent's store), another one in a Worker (the child's Durable
Object). The run loop builds a `Delegation` for the turn (`delegation_for`) and
hands it to each handler on `ToolContext.delegation`; the child's usage goes back
on the call's result message (`ChildAnswer`), so it counts toward the parent
session's spend. The depth of nested turns travels in a context variable
(`at_depth`), set around each child's run. The guide: docs/python-api.md
(Agents as tools).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from .._child_sessions import child_session_name
from ..agent import Agent
from ..approvals import PendingApproval
from ..errors import ConfigurationError
from ..events import CancelToken, ChildEvent, EventReporter, OnEvent, RunEvent
from ..llm.base import LLM
from ..messages import ParentCall, ToolErrorKind, Usage, tool_error_content
from ..stores.base import Store
from ..tools import Handler, ToolContext
from .run_result import RunResult, RunStatus

__all__ = [
    "DEFAULT_MAX_DEPTH",
    "AgentRunner",
    "AgentToolHandler",
    "AgentTurn",
    "AgentTurnOutcome",
    "ChildAnswer",
    "Delegation",
    "LocalAgent",
    "LocalAgents",
    "at_depth",
    "current_depth",
    "delegation_for",
]

DEFAULT_MAX_DEPTH = 3
"""How deep agent tools nest by default: a top-level turn is depth 0, the turn its agent
tool runs depth 1, and so on; a call that would run a turn deeper is refused."""

_DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("durable_agents_depth", default=0)


def current_depth() -> int:
    """The depth of the turn `run()` starts here: 0, or the child's inside `at_depth`."""
    return _DEPTH.get()


@contextlib.contextmanager
def at_depth(depth: int) -> Iterator[None]:
    """Run the block's `run()` calls as child turns at `depth` (what an `AgentRunner` does
    around the child's run; in a Worker, with the depth the parent sent)."""
    token = _DEPTH.set(depth)
    try:
        yield
    finally:
        _DEPTH.reset(token)


@dataclass(frozen=True, slots=True)
class AgentTurn:
    """One child turn to run, as an agent tool asks an `AgentRunner` for it.

    `session_name` is `child_session_name(parent_session_id, tool_call_id)`;
    `request_key` is the parent call's idempotency key: a runner must start the turn
    with it, so that asking again finishes (or reads back) the same turn. `depth` is
    the child's (1 under a top-level turn). `on_event` (None when nobody watches the
    parent) takes the child's events, and `cancel` is the parent's token: cancelling
    the parent cancels the child. A runner passes `parent_session_id` and
    `tool_call_id` on as the child's `run(parent_call=)`: stored with the child's first
    write, they link the child session back to the call.
    """

    agent: str
    session_name: str
    message: str
    request_key: str
    depth: int
    parent_session_id: str
    tool_call_id: str
    on_event: OnEvent | None = None
    cancel: CancelToken | None = None


@dataclass(frozen=True, slots=True)
class AgentTurnOutcome:
    """How a child turn ended: its status and answer (the final reply's text, or the typed
    output's JSON), its session's id, and the tokens its session has used in all
    (one session per call, so the whole turn, however many runs it took). A turn
    that ended `awaiting_approval` says which calls wait (`RunResult.pending`, as the
    child's run returned them: its own untagged); the parent's call then waits too."""

    status: RunStatus
    answer: str
    usage: Usage
    session_id: str
    error: str | None = None
    pending: Sequence[PendingApproval] = ()


class AgentRunner(Protocol):
    """Runs child turns for agent tools: `run(..., agents=runner)`.

    `LocalAgents` (what `agents={name: agent}` becomes) runs them with `run()` on the
    parent's store; a Worker's runner reaches the child's Durable Object. `names` are
    the agents it can run (an agent tool naming another is refused: at run start
    when it can be told then, else with an `unknown-agent` result).
    """

    @property
    def names(self) -> Collection[str]: ...

    async def run_turn(self, turn: AgentTurn) -> AgentTurnOutcome: ...


@dataclass(frozen=True)
class LocalAgent:
    """An agent for `run(..., agents={name: LocalAgent(agent, llm=..., deps=...)})`, with
    what its turns need besides the parent's: its own LLM (default: the parent's),
    `deps` and `tools` (as `run()` takes them). A bare `Agent` in `agents=` is
    `LocalAgent(agent)`."""

    agent: Agent[Any, Any]
    llm: LLM | None = None
    deps: Any = None
    tools: Mapping[str, Handler] | None = None


RunFunction = Callable[..., Awaitable[RunResult[Any]]]


class LocalAgents:
    """The `AgentRunner` of CPython: each child turn is a `run()` on the parent's store,
    in the session named for the call (its id is that name on a durable store; a
    memory store, not durable, runs it as a new session of that name)."""

    def __init__(
        self,
        agents: Mapping[str, Agent[Any, Any] | LocalAgent],
        *,
        store: Store,
        llm: LLM,
        run: RunFunction,
    ) -> None:
        self.agents = {
            name: entry if isinstance(entry, LocalAgent) else LocalAgent(entry)
            for name, entry in agents.items()
        }
        for name, entry in self.agents.items():
            if not isinstance(entry.agent, Agent):
                raise ConfigurationError(
                    f"agents[{name!r}] must be an Agent or a LocalAgent, got {entry.agent!r}"
                )
        self.store = store
        self.llm = llm
        self.run = run  # durable_agents.run.run, passed in: this module never imports it

    @property
    def names(self) -> Collection[str]:
        return self.agents.keys()

    async def run_turn(self, turn: AgentTurn) -> AgentTurnOutcome:
        entry = self.agents[turn.agent]
        durable = self.store.durable
        with at_depth(turn.depth):
            result = await self.run(
                entry.agent,
                llm=self.llm if entry.llm is None else entry.llm,
                message=turn.message,
                session_id=turn.session_name if durable else None,
                session_name=turn.session_name,
                store=self.store,
                request_key=turn.request_key,
                tools=entry.tools,
                deps=entry.deps,
                on_event=turn.on_event,
                cancel=turn.cancel,
                agents=self,  # its own agent tools call the same agents
                parent_call=ParentCall(turn.parent_session_id, turn.tool_call_id),
            )
        info = await self.store.get_session(result.session_id)
        usage = result.usage if info is None else Usage(info.input_tokens, info.output_tokens)
        return AgentTurnOutcome(
            result.status, result.response, usage, result.session_id, result.error,
            result.pending,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Delegation:
    """What a run's agent tools use: who runs the children, the parent's events and cancel
    token, and the depth of the parent's turn."""

    runner: AgentRunner
    events: EventReporter
    cancel: CancelToken | None
    depth: int


@dataclass(frozen=True, slots=True)
class ChildAnswer:
    """What an agent tool's handler returns: the content of the call's result, and the
    tokens the child used, which the run loop stores on the result message. Or, while
    the child's turn waits for a person's decision, the calls that wait (`waiting`,
    each tagged with its session): then the call gets no result yet, and the parent's
    turn waits for them as for its own (`ToolExecutor.waiting_children`)."""

    content: str
    usage: Usage
    waiting: Sequence[PendingApproval] = ()


def delegation_for(
    agent: Agent[Any, Any],
    agents: AgentRunner | Mapping[str, Agent[Any, Any] | LocalAgent] | None,
    *,
    store: Store,
    llm: LLM,
    run: RunFunction,
    events: EventReporter,
    cancel: CancelToken | None,
) -> Delegation | None:
    """The run's `Delegation` (None without `agents=`); ConfigurationError if the agent's
    agent tools name an agent that `agents` does not have, or if it has none."""
    wanted = sorted({h.agent for t in agent.tools if isinstance(h := t.handler, AgentToolHandler)})
    if agents is None:
        if wanted:
            raise ConfigurationError(
                f"agent {agent.name!r} has agent tools for {wanted}; pass run(..., "
                "agents={name: agent}) with them"
            )
        return None
    runner: AgentRunner = (
        LocalAgents(agents, store=store, llm=llm, run=run)
        if isinstance(agents, Mapping)
        else agents
    )
    known = set(runner.names)
    missing = [name for name in wanted if name not in known]
    if missing:
        raise ConfigurationError(
            f"agent {agent.name!r} has agent tools for {missing}, which run(agents=) does "
            f"not have; it has {sorted(known)}"
        )
    return Delegation(runner, events, cancel, current_depth())


@dataclass(frozen=True, slots=True)
class AgentToolHandler:
    """The handler of an agent tool: one turn of `agent`, nested at most `max_depth` deep."""

    agent: str
    max_depth: int

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> ChildAnswer:
        scope = ctx.delegation
        if not isinstance(scope, Delegation):
            raise ConfigurationError(
                f"agent tool {ctx.tool_name!r} runs agent {self.agent!r} through run(..., "
                "agents=...); it cannot be called without"
            )
        refused = self.refusal(scope)
        if refused is not None:
            return ChildAnswer(refused, Usage())
        name = child_session_name(ctx.session_id, ctx.tool_call_id)
        turn = AgentTurn(
            self.agent, name, args["message"], ctx.idempotency_key, scope.depth + 1,
            ctx.session_id, ctx.tool_call_id, _forwarder(scope, self.agent, name, ctx),
            scope.cancel,
        )  # fmt: skip
        outcome = await scope.runner.run_turn(turn)
        if outcome.status == "awaiting_approval" and outcome.pending:
            waiting = [
                p if p.session is not None else replace(p, session=outcome.session_id)
                for p in outcome.pending
            ]
            return ChildAnswer("", outcome.usage, waiting)
        return ChildAnswer(_answer(self.agent, name, outcome), outcome.usage)

    def refusal(self, scope: Delegation) -> str | None:
        """The result of a call that runs no turn: an unknown agent, or one too deep."""
        known = scope.runner.names
        if self.agent not in known:
            return tool_error_content(
                ToolErrorKind.UNKNOWN_AGENT,
                f"There is no agent named {self.agent!r} to call; the agents are {sorted(known)}.",
                agent=self.agent,
            )
        depth = scope.depth + 1
        if depth > self.max_depth:
            return tool_error_content(
                ToolErrorKind.AGENT_DEPTH_EXCEEDED,
                f"Agent {self.agent!r} was not called: its turn would run at depth {depth}, "
                f"past the limit of {self.max_depth} agents calling agents (max_depth). "
                "Answer with what you have, without calling another agent.",
                agent=self.agent,
            )
        return None


def _forwarder(scope: Delegation, agent: str, name: str, ctx: ToolContext) -> OnEvent | None:
    """The child's `on_event`: each of its events to the parent's, tagged (None when nobody
    watches the parent)."""
    if not scope.events.watched:
        return None

    async def forward(event: RunEvent) -> None:
        await scope.events.emit(ChildEvent(agent, name, ctx.tool_call_id, event))

    return forward


_UNFINISHED: dict[str, str] = {
    "error": "its turn ended with an error",
    "budget_exceeded": "its session reached its spend limit (max_session_tokens)",
    "cancelled": "its turn was cancelled",
    "max_steps": "its turn stopped after its most LLM calls (max_steps)",
    "deferred": "its turn was deferred to a later invocation",
    # (A runner that lists the calls makes the parent's call wait for them instead.)
    "awaiting_approval": "its turn waits for a person's approval of a call, not listed",
}


def _answer(agent: str, name: str, outcome: AgentTurnOutcome) -> str:
    """The content of the call's result: the child's answer, or why there is none."""
    if outcome.status == "complete":
        return outcome.answer
    why = _UNFINISHED.get(outcome.status, f"its turn ended with status {outcome.status}")
    detail = f" ({outcome.error})" if outcome.error else ""
    return tool_error_content(
        ToolErrorKind.AGENT_FAILED,
        f"Agent {agent!r} gave no answer: {why}{detail}. What it did is kept in its "
        f"session {name!r}; do not assume it acted or did not.",
        agent=agent,
        status=outcome.status,
        session=name,
    )
