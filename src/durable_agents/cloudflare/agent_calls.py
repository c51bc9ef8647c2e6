"""Agent tools in a Worker: a child turn runs in the child session's own Durable Object.

`run(..., agents=ObjectAgents(names, send))` is what a session's object gives its
turns: an agent tool's call (`agent_tool`) becomes one command to the object of
the child's session (`send(agent, session_name, command)`: `src/entry.py` sends it
to `getByName(f"{agent}:{name}")`), a subrequest of the parent's invocation; the
child's turn has its own invocation and budget. The command carries the parent
call's idempotency key as its request key and the child's depth, so a command sent
again after a crash (the call is re-invoked on resume) finds the turn it started
and answers with it: the child runs once.

A child turn deferred to a later invocation (HTTP 202) is asked for again with
`Resume` until it ends (the child's object runs one turn at a time: a resume
waits for its alarm's). Cancelling the parent sends the child `Cancel`. A child
waiting for approvals names them in its answer: the parent waits for them too, and
lists and decides them where the sessions are (`approvals.py`, on the Worker's D1).

While someone watches the parent (`AgentTurn.on_event`), the command asks for the
child's turn as a stream: each of its events goes to the parent's, and its result is
its `done` event's. A stream that breaks off (the child's object reset) loses nothing:
the command is sent again unstreamed, and its request key makes it the same turn.
`stored_events` replays a child session's stored messages for a parent's `GET
.../events` (reads.py). The guide: docs/several-agents.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from .. import budget
from ..agent import Agent
from ..agent_tools import AgentTurn, AgentTurnOutcome, child_session_name
from ..approvals import LastStep, PendingApproval
from ..events import EventReporter, OnEvent, RunEvent
from ..messages import ParentCall, Usage
from ..session_links import agent_tool_agents
from .commands import (
    Approve,
    Cancel,
    Command,
    Decision,
    Events,
    ListApprovals,
    Resume,
    SendMessage,
)
from .live import decode_event, stream_events
from .wire import Reply

__all__ = ["MAX_RESUMES", "ChildObjects", "ObjectAgents", "SendToAgent"]

SendToAgent = Callable[[str, str, Command], Awaitable[Reply]]
"""`send(agent, session_name, command)`: the command to that session's object; its reply."""

# How many times a deferred child turn is asked to go on before the call gives up (each
# ask is one subrequest of the parent's invocation, and one invocation of the child's).
MAX_RESUMES = 20


class ObjectAgents:
    """The `AgentRunner` of a session's Durable Object: each child turn is a command to the
    child session's object (see the module docstring)."""

    def __init__(
        self, names: Collection[str], send: SendToAgent, served: Mapping[str, str] | None = None
    ) -> None:
        self._names = tuple(names)
        self._send = send
        self._served = dict(served or {})  # AGENT.name -> the served name, for links

    def served_agent(self, agent_name: str | None) -> str | None:
        """The served name of the agent whose sessions are stored with `agent_name`
        (`AGENT.name`); None for the default agent's (or one this Worker does not serve)."""
        return None if agent_name is None else self._served.get(agent_name)

    @property
    def names(self) -> Collection[str]:
        return self._names

    async def run_turn(self, turn: AgentTurn) -> AgentTurnOutcome:
        streamed = turn.on_event is not None
        command: Command = SendMessage(
            message=turn.message, request_key=turn.request_key, depth=turn.depth,
            stream=streamed, parent_call=ParentCall(turn.parent_session_id, turn.tool_call_id).key,
        )  # fmt: skip
        for _ in range(MAX_RESUMES + 1):
            reply = await self._until_cancelled(turn, command)
            if reply.run_status != "deferred":
                return _outcome(turn, reply)
            command = Resume(depth=turn.depth, stream=streamed)
        return _outcome(turn, reply)

    async def waiting_below(
        self, step: LastStep, agent_tools: Mapping[str, str]
    ) -> dict[str, list[PendingApproval]]:
        """By call of a parent's last `step` that ran an agent tool's child turn (`agent_tools`:
        tool name -> agent): the calls waiting for a decision in the child's session and
        below it, as the child's object lists them (`GET .../approvals`: a subrequest each),
        tagged with their session. Wherever the sessions are stored: a Durable Object's
        own storage holds no other session (`approvals.waiting_below` reads one store)."""
        below: dict[str, list[PendingApproval]] = {}
        for call in step.calls:
            agent = agent_tools.get(call.name)
            if agent is None or call.id in step.states:  # not an agent tool's, or its own
                continue
            name = child_session_name(step.session_id, call.id)
            budget.spend(subrequests=1)
            reply = await self._send(agent, name, ListApprovals())
            body = reply.body if reply.status == 200 and isinstance(reply.body, dict) else {}
            child = str(body.get("session_id") or name)
            waiting = [
                _tagged(_pending(p), child)
                for p in body.get("pending") or ()
                if isinstance(p, dict)
            ]
            if waiting:
                below[call.id] = waiting
        return below

    async def decide_below(
        self, step: LastStep, agent_tools: Mapping[str, str], decision: Decision
    ) -> Reply | None:
        """A person's decision on a call waiting below the parent's `step` (a child's, or a
        grandchild's), sent to the object of the child it was listed through, which
        decides it (and goes on with its turn after its step's last decision): its answer;
        None when no child of the step has that call waiting."""
        below = await self.waiting_below(step, agent_tools)
        holders = [
            (call_id, p) for call_id, waiting in below.items() for p in waiting
            if p.tool_call_id == decision.tool_call_id
        ]  # fmt: skip
        if not holders:
            return None
        # One call id may wait in two children: the digest tells which the person saw.
        call_id, _ = next(((c, p) for c, p in holders if p.digest == decision.digest), holders[0])
        call = next(c for c in step.calls if c.id == call_id)
        name = child_session_name(step.session_id, call_id)
        budget.spend(subrequests=1)
        return await self._send(agent_tools[call.name], name, Approve(decision=decision))

    async def stored_events(self, agent: str, session_name: str) -> AsyncIterator[RunEvent]:
        """The events of the child session's stored messages, as its object replays them
        (`Events(follow=False)`: a grandchild's, nested, with them), for a parent's `GET
        .../events` mid-call. Best effort: a child with nothing stored, or whose answer
        breaks off, replays what came (its live events reach the parent's turn anyway)."""
        budget.spend(subrequests=1)
        with contextlib.suppress(Exception):
            reply = await self._send(agent, session_name, Events(follow=False))
            if reply.stream is None:  # no such session yet
                return
            async for event in stream_events(reply.stream):
                decoded = decode_event(event)
                if decoded is not None:
                    yield decoded

    async def _exchange(self, turn: AgentTurn, command: Command) -> Reply:
        """The child's reply to `command`; a streamed one's events handed to the parent's
        `on_event` and its end read as the reply; a stream that breaks off before its end:
        the command again, unstreamed (the same turn: its request key)."""
        budget.spend(subrequests=1)  # the parent's invocation's: one fetch to the child
        reply = await self._send(turn.agent, turn.session_name, command)
        if reply.stream is None or turn.on_event is None:
            return reply
        ended = await _followed(reply.stream, turn.on_event)
        if ended is not None:
            return ended
        budget.spend(subrequests=1)
        again = command.model_copy(update={"stream": False})
        return await self._send(turn.agent, turn.session_name, again)

    async def _until_cancelled(self, turn: AgentTurn, command: Command) -> Reply:
        """The child's reply to `command`; when the parent is cancelled meanwhile, the
        child is sent `Cancel` and its reply (its turn, stopped) is awaited all the same."""
        sent = asyncio.ensure_future(self._exchange(turn, command))
        if turn.cancel is None:
            return await sent
        cancelled = asyncio.ensure_future(turn.cancel.wait())
        try:
            await asyncio.wait((sent, cancelled), return_when=asyncio.FIRST_COMPLETED)
            if not sent.done():
                with contextlib.suppress(Exception):  # no turn running: nothing to stop
                    await self._send(turn.agent, turn.session_name, Cancel())
            return await sent
        finally:
            cancelled.cancel()


async def _followed(stream: Any, on_event: OnEvent) -> Reply | None:
    """Read a child's streamed turn: each of its events to `on_event` (a watcher that raises
    is dropped, as `run()` drops it), and its end as a reply: `done`'s result, or `error`'s
    body as a 502 (the child's turn failed after its stream began); None if the stream
    ends or breaks off before either."""
    events = EventReporter(on_event)
    try:
        async for event in stream_events(stream):
            if event.event in ("done", "error"):
                return Reply(200 if event.event == "done" else 502, json.loads(event.data))
            decoded = decode_event(event)
            if decoded is not None:
                await events.emit(decoded)
    except Exception:  # the child's object reset mid-stream: no end will come
        return None
    return None


def _outcome(turn: AgentTurn, reply: Reply) -> AgentTurnOutcome:
    """The child's reply as the agent tool reads it: its status, answer and session usage,
    or, for a reply that is no turn's result (a 4xx/5xx), an error saying what came."""
    body: Any = reply.body
    if reply.run_status is None or not isinstance(body, dict):
        error = body.get("error") if isinstance(body, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        return AgentTurnOutcome(
            "error", "", Usage(), turn.session_name,
            f"HTTP {reply.status} from the child's session: {message or 'no turn result'}",
        )  # fmt: skip
    used = body.get("session_usage") or body.get("usage") or {}
    usage = Usage(int(used.get("input_tokens", 0)), int(used.get("output_tokens", 0)))
    error = body.get("error")
    return AgentTurnOutcome(
        body["status"],
        str(body.get("response") or ""),
        usage,
        str(body.get("session_id") or turn.session_name),
        error.get("message") if isinstance(error, dict) else None,
        [_pending(p) for p in body.get("pending") or () if isinstance(p, dict)],
    )


@dataclass(frozen=True, slots=True)
class ChildObjects:
    """The child sessions' objects of one session object's agent tools (`agent_tools`: tool
    name -> agent), for what waits in them: listed (`waiting`) and decided (`decide`)."""

    runner: ObjectAgents
    agent_tools: Mapping[str, str]

    @classmethod
    def of(cls, agents: object, agent: Agent[Any, Any]) -> ChildObjects | None:
        """Those of `agent`'s agent tools, when `agents` (the object's runner) reaches
        them; None for an agent without agent tools, or off the Workers runtime."""
        tools = agent_tool_agents(agent)
        return cls(agents, tools) if isinstance(agents, ObjectAgents) and tools else None

    async def waiting(self, step: LastStep) -> dict[str, list[PendingApproval]]:
        return await self.runner.waiting_below(step, self.agent_tools)

    async def decide(self, step: LastStep, decision: Decision) -> Reply | None:
        return await self.runner.decide_below(step, self.agent_tools, decision)


def _tagged(pending: PendingApproval, session: str) -> PendingApproval:
    """`pending` as its parent lists it: tagged with the child session holding it, unless
    a grandchild's (tagged with its own already)."""
    return pending if pending.session is not None else replace(pending, session=session)


def _pending(wire: dict[str, Any]) -> PendingApproval:
    """A call the child's turn waits on, as its answer lists it (`PendingApproval.to_dict`):
    the parent waits for it too, and lists it (`approvals.py`)."""
    return PendingApproval(
        str(wire["tool_call_id"]), str(wire["tool_name"]), dict(wire.get("arguments") or {}),
        str(wire["digest"]), wire.get("session"),
    )  # fmt: skip
