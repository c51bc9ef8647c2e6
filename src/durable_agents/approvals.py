"""Human approval bound to the exact call: approve once, run once, never run what was not approved.

The public side of approvals: the digest a decision carries (`approval_digest`),
what waits for a decision (`pending_approvals`, `PendingApproval`: a session's
own calls and those of its agent tools' child sessions), deciding (`approve`, with
edited arguments checked against the tool's schema), and the
stored events folded into one state per call (`approval_states`). Settling the
decided calls when the turn goes on is the run loop's (`_turn.approval_settling`).
How it works, edited approvals, the digest's exact definition and the crash
windows: docs/approvals.md.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import _json
from ._child_sessions import child_session_id
from .errors import (
    ApprovalAlreadyDecidedError,
    ApprovalDigestMismatchError,
    ApprovalNotFoundError,
    ConfigurationError,
    SessionConflictError,
    SessionNotFoundError,
    ToolArgumentsError,
)
from .limits import MAX_ROW_BYTES
from .messages import ToolCall, pending_tool_calls
from .stores.base import ApprovalChange, ApprovalEvent, Store
from .tools import Tool

if TYPE_CHECKING:
    from .agent import Agent


def approval_digest(session_id: str, tool_call_id: str, tool_name: str, arguments: Any) -> str:
    """The digest a decision must carry; its exact definition: docs/approvals.md (The digest)."""
    canonical = json.dumps(
        [session_id, tool_call_id, tool_name, arguments],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class PendingApproval:
    """A call waiting for a person's decision: what to show them, and the digest to send back.

    `session` is None for a call of the session it was listed from (or of the run's own
    session), else the id of the agent tool's child session (or grandchild's ...) whose
    call it is: the session its digest is computed with, and where `approve` stores the
    decision (whether it is given that session or the parent's)."""

    tool_call_id: str
    tool_name: str
    arguments: dict[str, Any]
    digest: str
    session: str | None = None

    def to_dict(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "tool_call_id": self.tool_call_id,
            "tool_name": self.tool_name,
            "arguments": self.arguments,
            "digest": self.digest,
        }
        if self.session is not None:  # a child's call: the wire stays as it was for the rest
            wire["session"] = self.session
        return wire


@dataclass(frozen=True, slots=True)
class ApprovalState:
    """What the stored events say about one call that needed approval."""

    tool_call_id: str
    tool_name: str
    digest: str
    decision: str | None  # "approved" | "denied" | None (waiting)
    reason: str | None
    claimed: bool
    arguments: dict[str, Any] | None = None  # edited by the approver: it runs with these
    arguments_digest: str | None = None


def approval_states(events: Iterable[ApprovalEvent]) -> dict[str, ApprovalState]:
    """Fold a session's approval events into one state per call."""
    states: dict[str, ApprovalState] = {}
    for e in events:
        if e.event == "requested":
            states[e.tool_call_id] = ApprovalState(
                e.tool_call_id, e.tool_name, e.digest, None, None, False
            )
            continue
        state = states.get(e.tool_call_id)
        if state is None:
            continue
        if e.event == "claimed":
            states[e.tool_call_id] = _replace(state, claimed=True)
        else:
            states[e.tool_call_id] = _replace(
                state,
                decision=e.event,
                reason=e.reason,
                arguments=e.arguments,
                arguments_digest=e.arguments_digest,
            )
    return states


def _replace(state: ApprovalState, **changes: Any) -> ApprovalState:
    fields = {f: getattr(state, f) for f in ApprovalState.__slots__}
    fields.update(changes)
    return ApprovalState(**fields)


def waiting_calls(
    session_id: str,
    calls: Sequence[ToolCall],
    states: dict[str, ApprovalState],
    *,
    session: str | None = None,
) -> list[PendingApproval]:
    """The calls among `calls` (unanswered ones) that wait for a decision, in call order,
    tagged with `session` (a child's id, when listed from its parent)."""
    return [
        PendingApproval(c.id, c.name, dict(c.arguments), states[c.id].digest, session)
        for c in calls
        if c.id in states and states[c.id].decision is None
    ]


async def pending_approvals(store: Store, session_id: str) -> list[PendingApproval]:
    """The calls that wait for a decision: the session's own (none, unless its last step
    asked for approval), then those of its agent tools' child sessions, and theirs, whose
    calls are still unanswered, each tagged with its `session`."""
    step = await unanswered_step(store, session_id)
    return waiting_in(step, await waiting_below(store, step))


def waiting_in(step: LastStep, below: Mapping[str, list[PendingApproval]]) -> list[PendingApproval]:
    """What waits for a decision in `step`: its own calls, then, call by call, what waits
    below them (in their child sessions: `waiting_below`, or a Worker's `ChildObjects`)."""
    own = waiting_calls(step.session_id, step.calls, step.states)
    return [*own, *(p for c in step.calls for p in below.get(c.id, ()))]


@dataclass(frozen=True, slots=True)
class LastStep:
    """A session's calls without a result (its last step's), and its approval states."""

    session_id: str
    calls: list[ToolCall]
    states: dict[str, ApprovalState]


async def unanswered_step(store: Store, session_id: str) -> LastStep:
    """The session's calls without a result (its last step's), and its approval states."""
    _, history = await store.load_context(session_id)  # the last step is in the tail
    calls = pending_tool_calls(history)
    if not calls:
        return LastStep(session_id, [], {})
    return LastStep(session_id, calls, approval_states(await store.load_approvals(session_id)))


async def waiting_below(store: Store, step: LastStep) -> dict[str, list[PendingApproval]]:
    """By call of `step` that ran an agent tool's child turn: what waits for a decision
    in the child's session and below it, tagged (a call with none is left out).

    A call waiting for its own decision runs nothing, so only the others can have a
    child: the session `child_session_name` names for the call, if `store` has it."""
    below: dict[str, list[PendingApproval]] = {}
    for top in _child_calls(step):
        waiting = [
            p
            for child in await _steps_below(store, step.session_id, top)
            for p in waiting_calls(
                child.session_id, child.calls, child.states, session=child.session_id
            )
        ]
        if waiting:
            below[top.id] = waiting
    return below


def _child_calls(step: LastStep) -> list[ToolCall]:
    return [c for c in step.calls if c.id not in step.states]


async def _steps_below(store: Store, session_id: str, call: ToolCall) -> list[LastStep]:
    """The unfinished last steps of the call's child session and of its children, depth
    first (each call's child turn runs in a session of its own: no session comes twice)."""
    child = await child_session_id(store, session_id, call.id)
    if child is None:
        return []
    step = await unanswered_step(store, child)
    if not step.calls:
        return []
    steps = [step]
    for top in _child_calls(step):
        steps += await _steps_below(store, child, top)
    return steps


async def approve(
    store: Store,
    session_id: str,
    tool_call_id: str,
    *,
    digest: str,
    approved: bool,
    reason: str | None = None,
    arguments: dict[str, Any] | None = None,
    agent: Agent[Any] | None = None,
) -> None:
    """Store a person's decision on a waiting call, in one atomic conditional write.

    `digest` is the one the approver was shown with the call (`PendingApproval.
    digest`, or computed by `approval_digest`); a decision for other
    arguments is refused. `reason` is kept with the decision (who decided,
    and why) and, for a denial, shown to the model. Raises, with nothing
    written: `SessionNotFoundError` (no such session, or it was deleted),
    `ApprovalNotFoundError` (no such call waits), `ApprovalDigestMismatchError`,
    `ApprovalAlreadyDecidedError` (a decision exists; of racing approvers
    exactly one wins and the others get this). The turn goes on with
    `run(..., message=None)` once every waiting call of the step is decided.

    A call of an agent tool's child session (`PendingApproval.session`, listed
    from the parent) is decided from the parent's `session_id` too: the decision
    is stored in the child session holding the call (the errors name that one),
    and an edit is checked against the child's agent (pass it as `agent`).

    `arguments` (with `approved=True` only, else `ConfigurationError`) are the
    approver's edit of the call: it runs with these instead of the model's.
    They are checked against the tool's input schema first: the one stored with
    the call (`ToolCall.policy`) for a toolset's tool, else `agent`'s own tool of
    that name (then `agent` is required: `ConfigurationError` without it, or
    when it has no such tool); arguments that do not fit raise
    `ToolArgumentsError`. Stored as sent, with their own digest
    (`approval_digest` of the call with them). An edit equal to the model's
    arguments (the same digest) is a plain approval: nothing extra is stored.
    """
    if arguments is not None and not approved:
        raise ConfigurationError(
            f"approve(..., arguments=...) of call {tool_call_id!r}: only an approval carries "
            "edited arguments; a denial runs nothing"
        )
    states = approval_states(await store.load_approvals(session_id))
    state = states.get(tool_call_id)
    base, history = await store.load_context(session_id)  # the last step is in the tail
    if not history:  # never started, or deleted (also while this decision was on its way)
        raise SessionNotFoundError(session_id)
    unanswered = pending_tool_calls(history)
    call = next((c for c in unanswered if c.id == tool_call_id), None)
    if state is None or call is None:  # not the session's own: a child session's call?
        step = LastStep(session_id, unanswered, states)
        holder = await _holding_child(store, step, tool_call_id, digest)
        if holder is None:
            if state is not None and state.decision is not None:
                raise ApprovalAlreadyDecidedError(session_id, tool_call_id, state.decision)
            raise ApprovalNotFoundError(session_id, tool_call_id)
        return await approve(
            store, holder, tool_call_id, digest=digest, approved=approved, reason=reason,
            arguments=arguments, agent=agent,
        )  # fmt: skip
    if state.decision is not None:
        raise ApprovalAlreadyDecidedError(session_id, tool_call_id, state.decision)
    if not hmac.compare_digest(digest.encode(), state.digest.encode()):
        raise ApprovalDigestMismatchError(session_id, tool_call_id)
    edited, edited_digest = _edit(session_id, call, state, arguments, agent)
    change = ApprovalChange(
        tool_call_id, "approved" if approved else "denied", state.digest, reason=reason,
        arguments=edited, arguments_digest=edited_digest,
    )  # fmt: skip
    try:
        await store.append_messages_atomic(session_id, base + len(history), [], approvals=[change])
    except SessionConflictError:
        # Another approver got there first (the schema let exactly one decision land),
        # or the session was deleted meanwhile.
        if await store.get_session(session_id) is None:
            raise SessionNotFoundError(session_id) from None
        now = approval_states(await store.load_approvals(session_id)).get(tool_call_id)
        raise ApprovalAlreadyDecidedError(
            session_id, tool_call_id, (now.decision if now else None) or "decided"
        ) from None


async def _holding_child(
    store: Store, step: LastStep, tool_call_id: str, digest: str
) -> str | None:
    """The child session (or grandchild's ...) below `step` whose unanswered call
    `tool_call_id` waited for a decision (the one whose digest matches first), if any."""
    holders = [
        below
        for top in _child_calls(step)
        for below in await _steps_below(store, step.session_id, top)
        if tool_call_id in below.states and any(c.id == tool_call_id for c in below.calls)
    ]
    matching = (
        h
        for h in holders
        if hmac.compare_digest(digest.encode(), h.states[tool_call_id].digest.encode())
    )
    found = next(matching, holders[0] if holders else None)
    return None if found is None else found.session_id


def _edit(
    session_id: str,
    call: ToolCall,
    state: ApprovalState,
    arguments: dict[str, Any] | None,
    agent: Agent[Any] | None,
) -> tuple[dict[str, Any] | None, str | None]:
    """The approver's edit of `call` as it is stored, and its digest; (None, None) for no
    edit, or one equal to the model's arguments (a plain approval)."""
    if arguments is None:
        return None, None
    edited = _checked_edit(call, arguments, agent)
    edited_digest = approval_digest(session_id, call.id, state.tool_name, edited)
    if edited_digest == state.digest:
        return None, None
    return edited, edited_digest


def _checked_edit(call: ToolCall, arguments: Any, agent: Agent[Any] | None) -> dict[str, Any]:
    """The approver's `arguments` for `call`, as they will be stored; `ToolArgumentsError`
    if they do not fit the tool's input schema or cannot be stored as strict JSON."""
    if not isinstance(arguments, dict):
        raise ToolArgumentsError(
            f"edited arguments must be a JSON object, not {type(arguments).__name__}",
            tool_name=call.name,
        )
    try:
        cleaned: dict[str, Any] = _json.clean(arguments)
        size = len(json.dumps(cleaned, ensure_ascii=False).encode())
    except (ValueError, TypeError) as exc:
        raise ToolArgumentsError(
            f"edited arguments must be JSON ({exc})", tool_name=call.name
        ) from None
    if size > MAX_ROW_BYTES:
        raise ToolArgumentsError(
            f"edited arguments are {size:,} bytes of JSON, over the {MAX_ROW_BYTES:,} a "
            "stored row may hold",
            tool_name=call.name,
        )
    _tool_for(call, agent).parse_arguments(cleaned)  # ToolArgumentsError if they do not fit
    return cleaned


def _tool_for(call: ToolCall, agent: Agent[Any] | None) -> Tool:
    """What checks an edit of `call`: a toolset tool's schema as stored with the call
    (what the kit decided by, not what the toolset lists today), else the agent's tool."""
    if call.policy is not None:
        schema = call.policy.get("input_schema")
        return Tool(call.name, "", schema if isinstance(schema, dict) else {"type": "object"})
    if agent is None:
        raise ConfigurationError(
            f"approve(..., arguments=...) of call {call.id!r} needs agent=: the edit is checked "
            f"against the input schema of the agent's tool {call.name!r}"
        )
    tool = next((t for t in agent.tools if t.name == call.name), None)
    if tool is None:
        raise ConfigurationError(
            f"agent {agent.name!r} has no tool {call.name!r} to check the edit of call "
            f"{call.id!r} against; pass the agent whose call it is"
        )
    return tool
