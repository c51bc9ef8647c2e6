"""A session object's turns: one at a time under its lock, each a task of its own that
outlives the request that started it, streamed to whoever follows it, marked on the
object's alarm while it runs; and their results as the API answers them.

What a turn is and how it ends is docs/turns.md; the alarm's part, `alarms.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from .._timeouts import timeout
from ..agent_tools import at_depth
from ..approvals import approve, pending_approvals, unanswered_step, waiting_in
from ..budget import invocation
from ..errors import (
    ConfigurationError,
    DurableAgentsError,
    SessionNotFoundError,
    ToolArgumentsError,
)
from ..events import CancelToken, OnEvent
from ..llm.settings import setting
from ..messages import ParentCall, Usage
from ..run import RunResult, run, stop_turn
from ..stores.base import Store
from .agent_calls import ChildObjects
from .alarms import ObjectAlarm, on_alarm
from .commands import Approve, Cancel, Command, Resume, SendMessage, Stop
from .config import SessionIndex, tools_client, with_budget
from .live import LiveSession, LiveTurn, follow
from .object_context import ObjectContext, handles
from .wire import (
    ERROR_STATUS,
    SSE_HEADERS,
    Reply,
    error_for,
    error_reply,
    internal_error,
    no_session,
)

__all__ = [
    "FIRST_EVENT_WAIT_S",
    "cancel_turn",
    "resume_left_turn",
    "serve_alarm",
    "start_turn",
]

# How long a streamed turn may take to fail before its answer must start: an error
# known at once (a new message while calls wait for approval, say) is an HTTP status.
FIRST_EVENT_WAIT_S = 2.0
Turn = SendMessage | Resume | Approve | Stop


@handles(SendMessage, Resume, Approve, Stop)
async def start_turn(command: Turn, ctx: ObjectContext) -> Reply:
    """Run `command`'s turn as a task of its own (handed to `ctx.keep_alive`, the object's
    `waitUntil`), so a client that goes away does not stop it; answer with its result,
    or, for `command.stream`, with its events as they come."""
    turn = LiveTurn(command.turn_key())
    queue = turn.follow() if command.stream else None
    ctx.live.accept(turn)
    with invocation(ctx.budget):  # the turn's task (and what it starts) counts on it
        task = asyncio.ensure_future(_one_turn(command, ctx, turn))
    ctx.live.tasks.add(task)
    task.add_done_callback(ctx.live.tasks.discard)
    if ctx.keep_alive is not None:
        ctx.keep_alive(task)
    if queue is None:
        return await asyncio.shield(task)  # the request may go; the turn goes on
    try:
        async with timeout(FIRST_EVENT_WAIT_S):
            first = await queue.get()
    except TimeoutError:
        first = None
    ended = first is not None and first[0] == "end" and turn.reply is not None
    if ended and turn.reply is not None and turn.reply.run_status is None:
        return turn.reply  # failed before it began: a status, not a stream
    return Reply(200, None, SSE_HEADERS, stream=_prepend(first, follow(queue, after=-1)))


async def _one_turn(command: Turn, ctx: ObjectContext, turn: LiveTurn) -> Reply:
    """The turn's task: wait for the lock, run it, end it for every follower (also when it
    is torn down: a follower must not hang)."""
    live = ctx.live
    try:
        async with live.lock:
            live.waiting.remove(turn)
            live.turn = turn
            try:
                reply = await _marked_turn(command, ctx, turn)
            finally:
                live.turn = None
            if ctx.index is not None:
                await _mirror(ctx.store, ctx.index, ctx.session_id)
    except BaseException as exc:  # torn down, waiting or mid-turn
        if turn in live.waiting:
            live.waiting.remove(turn)
        if turn.reply is None:
            turn.end(internal_error(exc, f"session {ctx.session_id}"))
        raise
    turn.end(reply)
    return reply


async def _marked_turn(command: Turn, ctx: ObjectContext, turn: LiveTurn) -> Reply:
    """The turn, marked as running on the object's alarm while it runs, so that a turn a
    reset cut short is resumed by the alarm."""
    alarm = ctx.alarm
    if alarm is None:
        return await _turn(command, ctx, turn)
    await alarm.turn_started(command.origin)
    reply = await _turn(command, ctx, turn)
    if reply.run_status == "deferred":
        await alarm.turn_continues()
        return reply
    # A store down or a bug (a 5xx that is no result), or a toolset that could not be
    # listed: the mark stays, so the alarm tries the turn again later (with its
    # back-off; stopped after 3).
    failed = (
        reply.status in (500, 503) and reply.run_status is None
    ) or reply.error_code == "toolset-error"
    await alarm.turn_ended(ctx.store, ctx.session_id, keep_watch=failed)
    return reply


async def _turn(command: Turn, ctx: ObjectContext, turn: LiveTurn) -> Reply:
    """One turn's work; never raises for expected errors."""
    try:
        if isinstance(command, Approve):
            decided = await _decide(command, ctx)
            if decided is not None:
                return decided
            command = Resume()  # the step's last decision: go on with the turn
        if isinstance(command, Stop):
            result = await stop_turn(
                with_budget(ctx.agent, ctx.env), store=ctx.store, session_id=ctx.session_id,
                reason=command.message or "stopped", lease_seconds=None,
            )  # fmt: skip
            return _result_reply(ctx.session_id, result)
        return await _run_turn(command, ctx, on_event=turn.on_event, cancel=turn.cancel)
    except SessionNotFoundError:
        return no_session(ctx.session_id)
    except DurableAgentsError as exc:
        return error_for(exc)
    except Exception as exc:
        return internal_error(exc, f"session {ctx.session_id}")


async def _decide(command: Approve, ctx: ObjectContext) -> Reply | None:
    """Store the decision; None when it was the step's last (the turn goes on), else what
    to answer: the calls still waiting, or why the decision was refused. A call waiting
    in a child session (listed through this one) is decided by the child's object, which
    goes on with its turn after its step's last decision."""
    decision = command.decision
    children = ChildObjects.of(ctx.agents, ctx.agent)
    if children is not None:
        step = await unanswered_step(ctx.store, ctx.session_id)
        if decision.tool_call_id not in step.states:
            decided = await children.decide(step, decision)
            if decided is not None and decided.run_status is None:
                return decided  # refused by the child: a wrong digest, decided already, ...
            if decided is not None:
                return await _still_waiting(ctx, children)
    try:
        await approve(
            ctx.store,
            ctx.session_id,
            decision.tool_call_id,
            digest=decision.digest,
            approved=decision.approved,
            reason=decision.reason,
            arguments=decision.arguments,
            agent=ctx.agent,
        )
    except ToolArgumentsError as exc:
        return _invalid_edit(exc, decision.tool_call_id)
    return await _still_waiting(ctx, children)


async def _still_waiting(ctx: ObjectContext, children: ChildObjects | None) -> Reply | None:
    """After a decision: None when nothing waits any more (the turn goes on), else the calls
    that wait, the session's own and its children's (asked of their objects)."""
    if children is None:
        rest = await pending_approvals(ctx.store, ctx.session_id)
    else:
        step = await unanswered_step(ctx.store, ctx.session_id)
        rest = waiting_in(step, await children.waiting(step))
    if not rest:
        return None
    return Reply(
        200,
        {
            "session_id": ctx.session_id,
            "status": "awaiting_approval",
            "pending": [p.to_dict() for p in rest],
        },
    )


def _invalid_edit(exc: ToolArgumentsError, tool_call_id: str) -> Reply:
    """422 `invalid-arguments`: the approver's edit does not fit the tool's input schema
    (`problems`, as the run loop would tell the model); nothing was decided."""
    tool = exc.tool_name or "the tool"
    reply = error_reply(
        ERROR_STATUS[ToolArgumentsError], exc.code,
        f"the edited arguments of call {tool_call_id!r} do not fit {tool}'s input schema: "
        f"{exc.problems}. Nothing was decided; send the decision again with arguments that "
        "fit, or without them to approve the call as the model asked",
    )  # fmt: skip
    reply.body["error"]["problems"] = exc.problems
    return reply


async def _run_turn(
    command: SendMessage | Resume,
    ctx: ObjectContext,
    *,
    on_event: OnEvent | None = None,
    cancel: CancelToken | None = None,
) -> Reply:
    """`run()` on the session: `ctx.agent` with `ctx.make_llm(env)` (or `ctx.llm`) and the
    deps `make_deps(env, http)`, `http` being `ctx.http_client` or a new `tools_client()`."""
    env, agent = ctx.env, ctx.agent
    async with contextlib.AsyncExitStack() as owned:  # closes what this turn opened, all of it
        model = ctx.llm if ctx.llm is not None else ctx.make_llm(env)
        if ctx.llm is None and hasattr(model, "aclose"):
            owned.push_async_callback(model.aclose)
        client = ctx.http_client
        if client is None:
            client = tools_client()
            owned.push_async_callback(client.aclose)
        depth = command.depth or 0  # an agent tool's child turn (agent_calls.py): how deep
        with at_depth(depth):
            result = await run(
                with_budget(agent, env),
                llm=model,
                message=command.message if isinstance(command, SendMessage) else None,
                session_id=ctx.session_id,
                session_name=command.name,
                store=ctx.store,
                deps=ctx.make_deps(env, client),
                request_key=command.request_key if isinstance(command, SendMessage) else None,
                # The Durable Object runs one turn at a time per session (its lock)
                # and is the only runner of its session: no lease, no extra D1 write.
                lease_seconds=None,
                on_event=on_event,
                cancel=cancel,
                origin=command.origin,
                # the object's one clock: its alarm's (what a recurring schedule moves by)
                clock=None if ctx.alarm is None else ctx.alarm.clock,
                # the settings the agent module names (its toolsets' too), and the tools' client
                settings={
                    name: str(value)
                    for name in (*ctx.settings, *agent.settings)
                    if (value := setting(env, name)) is not None
                },
                http=client,
                agents=ctx.agents,
                parent_call=_parent_call(command),
            )
        reply = _result_reply(ctx.session_id, result)
        if depth:  # the parent's spend counts all its child session has used
            info = await ctx.store.get_session(ctx.session_id)
            if info is not None:
                reply.body["session_usage"] = Usage(info.input_tokens, info.output_tokens).to_dict()
    return reply


def _parent_call(command: SendMessage | Resume) -> ParentCall | None:
    """The agent-tool call a child turn answers, as its parent's object sent it."""
    key = command.parent_call if isinstance(command, SendMessage) else None
    return None if key is None else ParentCall.from_key(key)


def _result_reply(session_id: str, result: RunResult) -> Reply:
    """A turn's result as the API answers it: 200, 202 for "deferred", 502 for "error"
    (500, as for any `ConfigurationError`, when a setting must be set first)."""
    body: dict[str, Any] = {
        "session_id": session_id,
        "status": result.status,
        "response": result.response,
        "steps": result.steps,
        "usage": result.usage.to_dict(),
    }
    if result.output is not None:  # Agent(output_type=...): the answer, as stored (JSON)
        body["output"] = json.loads(result.response)
    if result.status == "awaiting_approval":
        body["pending"] = [p.to_dict() for p in result.pending]
    if result.status == "error":
        body["error"] = _turn_error(result)
        if result.error_code == ConfigurationError.code:  # not the upstream's doing
            return Reply(ERROR_STATUS[ConfigurationError], body)
        return Reply(502, body)
    if result.status == "budget_exceeded":
        body["error"] = {"code": "budget-exceeded", "message": result.error}
    if result.status == "deferred":  # the object goes on with it: GET .../events follows
        return Reply(202, body)
    return Reply(200, body)


def _turn_error(result: RunResult) -> dict[str, Any]:
    """The `error` of a turn that ended in status "error"."""
    if result.error_code == "turn-stopped":
        return {"code": "turn-stopped", "message": result.error}
    if result.error_code == ConfigurationError.code:  # says which setting, and where
        message = (
            f"{result.error}. The session keeps your message: once the setting is set, "
            "POST .../resume finishes the turn, or send a new message"
        )
        return {"code": ConfigurationError.code, "message": message}
    code = result.error_code or "llm-error"
    what = f"the LLM call failed ({result.error})" if code == "llm-error" else result.error
    message = (
        f"{what}; the session is intact and keeps your message: POST .../resume to ask "
        "the model again, or send a new message"
    )
    return {"code": code, "message": message}


async def _mirror(store: Store, index: SessionIndex, session_id: str) -> None:
    """The session's summary row into the index, once per turn; best effort: a turn is
    never failed by its index (the next turn writes it again)."""
    try:
        info = await store.get_session(session_id)
        if info is not None:
            await index.put_session_summary(info)
    except Exception as exc:
        print(f"durable-agents: the session index was not updated: {exc}", file=sys.stderr)


async def _prepend(
    first: tuple[str, int | None, bytes] | None, rest: AsyncIterator[bytes]
) -> AsyncIterator[bytes]:
    if first is not None:
        yield first[2]
        if first[0] == "end":
            return
    async for chunk in rest:
        yield chunk


@handles(Cancel)
async def cancel_turn(command: Cancel, ctx: ObjectContext) -> Reply:
    """POST .../cancel: stop the running turn at its next step boundary; its result."""
    turn = ctx.live.current
    if turn is None:
        return error_reply(
            409, "no-turn-running",
            f"no turn of session {ctx.session_id} is running; nothing to cancel",
        )  # fmt: skip
    turn.cancel.cancel("cancelled by POST /cancel")
    await asyncio.shield(turn.ended.wait())
    assert turn.reply is not None  # set before `ended`
    return turn.reply


async def serve_alarm(
    session_id: str,
    store: Store,
    live: LiveSession,
    alarm: ObjectAlarm,
    serve: Callable[[Command], Awaitable[Reply]],
) -> None:
    """The object's alarm fired: `alarms.on_alarm`, running each turn it decides on as a
    command through `serve` (the object's `serve_session`, so through its lock)."""

    async def run_turn(action: str, fields: dict[str, Any]) -> Reply:
        command: Turn
        if action == "resume":
            command = Resume(origin="self-resumed")
        elif action == "stop":
            command = Stop(message=fields.get("reason"), origin="stopped")
        else:
            command = SendMessage(
                message=fields["message"], request_key=fields.get("request_key"),
                origin="scheduled",
            )  # fmt: skip
        return await serve(command)

    await on_alarm(alarm, store, session_id, live, run_turn)


async def resume_left_turn(alarm: ObjectAlarm) -> None:
    """Before a new instance serves its first request: if the instance before it left a
    client's turn unfinished (`ObjectAlarm.adopt`), set the alarm for now, so the turn
    goes on at once (in the alarm's own invocation, as every self-resume)."""
    if await alarm.adopt():
        try:
            await alarm.storage.setAlarm(alarm.now_ms())
        except Exception as exc:  # the alarm set when the turn began comes anyway
            print(f"durable-agents: could not set the alarm: {exc}", file=sys.stderr)
