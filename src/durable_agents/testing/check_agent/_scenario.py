"""One scenario of the check: a session played through its turns with one crash point (or
none), and everything recorded in it (handler runs, requests, MCP calls, appends); the
child sessions its agent tools ran, each a scenario of its own (`Scenario.children`)."""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ...approvals import ApprovalState
from ...messages import Message
from ...stores.base import ApprovalChange
from ._report import RecordedRequest

SIDES: tuple[Literal["before", "after"], ...] = ("before", "after")


@dataclass(slots=True)
class Invocation:
    """One run of a tool's handler."""

    turn: int
    tool_name: str
    call_id: str
    key: str
    run_number: int
    approval: ApprovalState | None = None  # for a requires_approval tool: the store's, as it ran
    arguments: Any = None  # what the handler was given, as JSON
    outcome: str | None = None  # "completed", "retried" (ModelRetry), "failed"; None: running
    detail: str = ""  # what a run that did not complete ended in: "ModelRetry('...')"
    session: str | None = None  # the session it ran in (a child's, for a child agent's tool)


@dataclass(frozen=True, slots=True)
class Crash:
    """A crash point: the `n`-th append of the uncrashed play, and the side of it to die on."""

    n: int
    when: Literal["before", "after"]
    label: str

    def __str__(self) -> str:
        return f"a crash {self.when} append #{self.n} ({self.label})"


@dataclass(frozen=True, slots=True)
class ServerCall:
    """A `tools/call` that reached a toolset's server (it was forwarded, and not refused
    for want of a connection)."""

    server: str  # the toolset's URL it went to
    tool: str  # the tool's name on the server
    arguments: Any
    key: str | None  # the idempotency key in its `_meta`
    call_id: str | None  # the call whose handler sent it
    run_number: int | None


@dataclass(slots=True)
class Scenario:
    """One session played through its turns; what happened in it."""

    name: str
    mode: str
    crash: Crash | None
    policy: str = "approve"
    turn: int = 0
    runs: int = 0
    crashed: bool = False
    invocations: list[Invocation] = field(default_factory=list)
    requests: list[RecordedRequest] = field(default_factory=list)
    server_calls: list[ServerCall] = field(default_factory=list)
    orphaned: dict[str, str] = field(default_factory=dict)  # call id -> tool, after a crash
    appends: list[list[Message]] = field(default_factory=list)
    approval_writes: list[list[ApprovalChange]] = field(default_factory=list)
    # (session id, agent name) of each append: the scenario's own, or a child session's
    append_sessions: list[tuple[str, str | None]] = field(default_factory=list)
    children: dict[str, Scenario] = field(default_factory=dict)  # child session id -> its own
    decisions: dict[str, bool] = field(default_factory=dict)  # call id -> approved, as asked
    edits: dict[str, dict[str, Any]] = field(default_factory=dict)  # call id -> edit sent

    def child(self, session_id: str) -> Scenario:
        """The scenario of a child session an agent tool of this one ran (made when first
        asked for): its handler runs and requests, checked as the session's own."""
        found = self.children.get(session_id)
        if found is None:
            found = self.children[session_id] = Scenario(session_id, self.mode, None, self.policy)
        return found

    def requests_of(self, tool_name: str, turn: int) -> list[str]:
        """The requests the handler of `tool_name` sent in `turn`, as a failure lists them."""
        return [str(r) for r in self.requests if r.tool_name == tool_name and r.turn == turn]


@dataclass(slots=True)
class Stage:
    """The scenario being played now: where the recorders put what they see."""

    scenario: Scenario | None = None

    def now(self, session_id: str | None = None) -> Scenario:
        """The scenario being played, or that of its child session `session_id`."""
        assert self.scenario is not None, "nothing is being played"
        if session_id is None or session_id == self.scenario.name:
            return self.scenario
        return self.scenario.child(session_id)

    def of(self, invocation: Invocation | None) -> Scenario:
        """The scenario a handler run belongs to (a request it sends is recorded there)."""
        return self.now(None if invocation is None else invocation.session)


CURRENT: contextvars.ContextVar[Invocation | None] = contextvars.ContextVar(
    "durable_agents_check_call", default=None
)
"""The handler run a request is sent from (set around each handler, so concurrent
handlers keep theirs apart)."""


def append_labels(
    appends: list[list[Message]],
    approval_writes: Sequence[Sequence[ApprovalChange]] = (),
    sessions: Sequence[tuple[str, str | None]] = (),
) -> list[str]:
    """Name each append of an uncrashed play: which write of which step of which turn, or
    for a child session's (`sessions`: each append's (session id, agent); the first
    session is the scenario's own) which write of which child: "child refunds write #1"."""
    labels = []
    turn = step = 0
    changes = list(approval_writes) or [[] for _ in appends]
    where = list(sessions) or [("", None) for _ in appends]
    own = where[0][0] if where else ""
    child_writes: dict[str, int] = {}
    child_agents: dict[str, str] = {}  # (a decision, `approve()`'s write, names no agent)
    for messages, approvals, (session, agent) in zip(appends, changes, where, strict=True):
        if session != own:
            child_writes[session] = n = child_writes.get(session, 0) + 1
            name = child_agents.setdefault(session, agent or session)
            labels.append(f"child {name} write #{n}: {_held(messages, approvals)}")
            continue
        if any(m.role == "user" for m in messages):
            turn, step = turn + 1, 0
        if not messages:  # a decision or a claim: approval events only
            labels.append(f"turn {turn} step {step}: {_approval_write(approvals)}")
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


def _approval_write(approvals: Sequence[ApprovalChange]) -> str:
    """A decision's or a claim's write: "approval write (approved call_1)"."""
    what = ", ".join(f"{a.event} {a.tool_call_id}" for a in approvals) or "nothing"
    return f"approval write ({what})"


def _held(messages: Sequence[Message], approvals: Sequence[ApprovalChange]) -> str:
    """What a child's write holds, in the words of the parent's labels."""
    last = messages[-1] if messages else None
    if last is None:  # a decision (made from the parent's session) or a claim
        return _approval_write(approvals)
    if last.role == "assistant" and last.tool_calls:
        return "calls " + ", ".join(c.name for c in last.tool_calls)
    if last.role == "tool":
        return f"{len(messages)} result(s)"
    return "the final reply" if last.role == "assistant" else f"{last.role} message"
