"""A session's Durable Object, as plain Python: the command it was sent -> its answer.

`serve_session` looks the command's handler up in `HANDLERS` (one per command, each
registered where it lives with `@handles`): the turns (turns.py), the reads
(reads.py), the schedules (schedules_api.py), delete (here). `src/entry.py`'s
`AgentSession` is a thin shell around it; the object's part in the whole is drawn in
docs/architecture.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from ..agent import Agent
from ..agent_tools import AgentRunner
from ..budget import InvocationBudget
from ..errors import DurableAgentsError, SessionNotFoundError
from ..llm.base import LLM
from ..llm.settings import llm_from_env
from ..stores.base import Store
from . import reads, schedules_api, turns  # noqa: F401 - their @handles fill HANDLERS
from .agent_module import MakeDeps, MakeLLM
from .alarms import ObjectAlarm
from .commands import (
    Command,
    Delete,
)
from .config import SessionIndex
from .live import LiveSession
from .object_context import HANDLERS, ObjectContext, handles
from .wire import Reply, error_for, internal_error, no_session

__all__ = ["HANDLERS", "serve_session"]


@handles(Delete)
async def delete_session(command: Delete, ctx: ObjectContext) -> Reply:
    """DELETE /sessions/{name}: the session's rows, and its row in the index."""
    found = await ctx.store.delete_session(ctx.session_id)
    if ctx.index is not None:
        found = await ctx.index.delete_session(ctx.session_id) or found
    if not found:
        return no_session(ctx.session_id)
    return Reply(200, {"session_id": ctx.session_id, "deleted": True})


async def serve_session(
    command: Command,
    *,
    session_id: str,
    store: Store,
    env: Any,
    live: LiveSession,
    agent: Agent,
    make_deps: MakeDeps,
    make_llm: MakeLLM = llm_from_env,
    llm: LLM | None = None,
    http_client: httpx.AsyncClient | None = None,
    keep_alive: Callable[[asyncio.Task[Any]], None] | None = None,
    index: SessionIndex | None = None,
    alarm: ObjectAlarm | None = None,
    budget: InvocationBudget | None = None,
    settings: Sequence[str] = (),
    agents: AgentRunner | None = None,
) -> Reply:
    """Carry out a command in the session's Durable Object; never raises for expected errors.

    `live` is the object's in-memory state (`LiveSession`): turns (`message`,
    `resume`, `approve`) hold its lock, one at a time (Durable Object input
    gates do not cover awaits on D1 or the LLM, so without it two requests
    could run one session at once); a later request waits for the turn in
    progress, and the store's conflict check stays the backstop (409). A turn
    runs as a task of its own (handed to `keep_alive`, the object's
    `waitUntil`), so a client that goes away does not stop it. Each turn runs
    `agent` with `make_llm(env)` (or `llm`, given) and the deps
    `make_deps(env, http)`, where `http` is `http_client` or a new
    `tools_client()`, closed after the turn.

    `index` (with `SESSION_STORE = "durable-object"`: the Worker's D1) gets the
    session's summary row after each turn, and loses it when the session is
    deleted: one write per turn, never inside a step.

    `alarm` (the object's `ObjectAlarm`, see `alarms.py`) marks each turn as running
    while it runs, so that a turn cut short by a reset is resumed by the alarm, and is
    armed for the session's next schedule. `budget` is the invocation's (`budget.py`,
    `plan_budget`): a step whose calls do not all fit it ends this invocation's part of
    the turn ("deferred", HTTP 202) and the alarm goes on with it at once.
    `settings` names the agent module's settings (`SETTINGS`): with those its toolsets
    read, each turn's `RunContext.settings` holds their values from `env`.
    `agents` runs the child turns of the agent's agent tools (`agent_calls.ObjectAgents`:
    in the child sessions' own objects).
    """
    ctx = ObjectContext(
        session_id, store, env, live, agent, make_deps, make_llm, llm, http_client,
        keep_alive, index, alarm, budget, settings, agents,
    )  # fmt: skip
    handler = HANDLERS[type(command)]
    if command.runs_turn:  # its errors are its result's, answered by the turn itself
        return await handler(command, ctx)
    try:
        return await handler(command, ctx)
    except SessionNotFoundError:
        return no_session(session_id)
    except DurableAgentsError as exc:
        return error_for(exc)
    except Exception as exc:
        return internal_error(exc, f"session {session_id}")
