"""The deployable Worker: a thin shell over `durable_agents.cloudflare.app`'s two halves.

    HTTP -> Default.fetch         auth, route, validate (routes.handle_request)
         -> env.SESSIONS.getByName(name)     one Durable Object per session ("<agent>:<name>")
         -> AgentSession.fetch    one turn at a time; run() on D1 (session_object.serve_session);
                                  an agent tool's child turn: a command to the child's object
            AgentSession.webSocketMessage   a chat socket's frame (GET .../ws, chat_socket.py)
            AgentSession.alarm    resumes a turn a reset cut short, fires schedules
                                  (turns.serve_alarm, see durable_agents.cloudflare.alarms)

The session id is the Durable Object's id (`ctx.id.toString()`, 64 hex chars); the
history lives in D1 (`env.DB`), so any object, on any machine, can resume it.

The agents are not here: the default one is `src/agent.py` (AGENT, make_deps(env, http),
optionally make_llm(env), SETTINGS, DEV_STUBS: `durable_agents.cloudflare.agent_module`);
each module of `src/agents/` is one more, at /agents/<its file's name>/sessions/...
(`served_agents`). Edit those, not this. One that does not load stops a deployed Worker at
start (Cloudflare refuses the upload); under the dev server its routes answer its error.

This module is the only one (with the D1 store) that touches the Workers runtime; it
imports `workers`, so it runs inside a Python Worker (or `scripts/dev`), not on CPython.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from workers import DurableObject, WorkerEntrypoint

from durable_agents.cloudflare import d1_store, js_sockets
from durable_agents.cloudflare.agent_calls import ObjectAgents
from durable_agents.cloudflare.alarms import ObjectAlarm, self_resume_seconds
from durable_agents.cloudflare.app import (
    Command,
    LiveSession,
    Reply,
    error_reply,
    handle_request,
    internal_error,
    plan_budget,
    resume_left_turn,
    run_retention,
    serve_alarm,
    serve_session,
    session_store_kind,
    session_stores,
)
from durable_agents.cloudflare.chat_socket import upgrade_target
from durable_agents.cloudflare.js_streams import js_response, keep_running
from durable_agents.cloudflare.served_agents import (
    ObjectAgent,
    object_name,
    send_to_object,
    serve_agents,
)

_BODYLESS = frozenset({"GET", "HEAD"})


def _import_agent() -> Any:
    import agent  # src/agent.py; scripts/build_worker.py stages what it imports

    return agent


# src/agent.py and src/agents/*.py, checked; where none loads (dev server only): the error
SERVED = serve_agents(__file__, _import_agent)
_NONE_LOADED = SERVED.none_loaded
NOT_LOADED = error_reply(500, "agent-not-loaded", _NONE_LOADED) if _NONE_LOADED else None
AGENT_NAMES = {m.agent.name: name for name, m in SERVED.named.items()}  # for the pages' links


class Default(WorkerEntrypoint):  # type: ignore[misc]  # the workers SDK ships no stubs
    """The Worker: checks every request, then forwards it to the session's Durable Object."""

    async def fetch(self, request: Any) -> Any:
        if NOT_LOADED is not None:
            return js_response(NOT_LOADED)
        # From the JS request itself: the SDK's wrapper strips every header value
        # (a token with a trailing U+00A0 would pass) and knows only the
        # standard methods (any other would be a KeyError, a 500).
        raw = request.js_object
        headers = {str(k).lower(): str(v) for k, v in raw.headers.entries()}
        method = str(raw.method).upper()
        socket = upgrade_target(urlsplit(str(request.url)).path, headers, SERVED)  # .../ws
        if socket is not None:  # no token asked: each frame carries it (chat_socket.py)
            return await js_sockets.forward_upgrade(self.env, socket)

        async def read_body() -> bytes:
            return b"" if method in _BODYLESS else bytes(await request.bytes())

        try:
            url = urlsplit(str(request.url))
            reply = await handle_request(
                method,
                url.path,
                headers,
                read_body,
                env=self.env,
                dispatch=self.to_session,
                dev_stubs=SERVED.dev_stubs,
                query=url.query,
                sessions=lambda: d1_store(self.env.DB),
                served=SERVED,
            )
        except Exception as exc:  # a bug: still answer JSON
            reply = internal_error(exc, "the Worker")
        return js_response(reply)

    async def scheduled(self, controller: Any, env: Any = None, ctx: Any = None) -> None:
        """The cron ([triggers]): delete sessions idle past RETENTION_DAYS (env, ctx: None)."""
        delete = None  # with sessions in their objects, each object deletes its own
        if session_store_kind(self.env) == "durable-object":
            delete = self.delete_in_object
        deleted = await run_retention(d1_store(self.env.DB), self.env, delete_object=delete)
        print(f"retention: deleted {deleted} idle session(s)")

    async def delete_in_object(self, info: Any) -> None:
        stub = self.env.SESSIONS.get(self.env.SESSIONS.idFromString(info.id))
        await stub.fetch("https://session.internal/command", method="POST",
                         body=Command("delete").to_json())  # fmt: skip

    async def to_session(self, name: str, command: Command) -> Reply:
        return await send_to_object(self.env, name, command)


class AgentSession(js_sockets.SocketHandlers, DurableObject):  # type: ignore[misc]  # no SDK stubs
    """One session: its id is this object's id; its history is in D1; its chat sockets'
    frames come to the handlers of `js_sockets.SocketHandlers`."""

    def __init__(self, ctx: Any, env: Any) -> None:
        super().__init__(ctx, env)
        # One turn at a time (input gates do not hold across awaits on D1 or the
        # LLM), and the turn now running, for /events and /cancel.
        self.live = LiveSession()
        # The object's alarm: it resumes a turn a reset cut short and fires schedules.
        self.alarm_state = ObjectAlarm(
            storage_of=lambda: self.ctx.storage, watch_seconds=self_resume_seconds(env)
        )
        self.agent = ObjectAgent(lambda: self.ctx.storage)  # which agent its alarm serves
        self.chat = js_sockets.object_chat(ctx, env, self.live, self.command, self.keep_alive)

    async def fetch(self, request: Any) -> Any:
        if js_sockets.is_upgrade(request):  # a chat socket, accepted to hibernate (js_sockets.py)
            return js_sockets.accept(self.ctx, self.chat, request)
        try:
            command = Command.from_json(await request.text())
        except ValueError as exc:
            return js_response(error_reply(400, "invalid-command", str(exc)))
        return js_response(await self.command(command))

    async def command(self, command: Command) -> Reply:
        # A turn the instance before this one left unfinished goes on first.
        await resume_left_turn(self.alarm_state)
        agent = await self.agent.of(command.agent)
        return await self.serve(command, plan_budget(self.env), agent)

    async def alarm(self, *info: Any) -> None:
        """The object's alarm: resume a turn left unfinished, fire due schedules."""
        agent = await self.agent.remembered()
        if SERVED.module(agent) is None:  # again in 30 s: a fixed agent module may have loaded
            await self.ctx.storage.setAlarm(self.alarm_state.now_ms() + 30_000)
            return
        store, _ = session_stores(self.env, self.ctx.storage)
        session_id = str(self.ctx.id.toString())
        spent = plan_budget(self.env)  # one budget for all the alarm's turns
        await serve_alarm(session_id, store, self.live, self.alarm_state,
                          lambda command: self.serve(command, spent, agent))  # fmt: skip

    async def serve(self, command: Command, budget: Any = None, agent: str | None = None) -> Reply:
        served = SERVED.module(agent)  # None: its module does not load (dev server only)
        if served is None:
            return error_reply(500, "agent-not-loaded", SERVED.failures.get(agent, str(agent)))
        store, index = session_stores(self.env, self.ctx.storage)  # SESSION_STORE
        return await serve_session(
            command,
            session_id=str(self.ctx.id.toString()),
            store=store,
            index=index,
            env=self.env,
            live=self.live,
            agent=served.agent,
            make_deps=served.make_deps,
            make_llm=served.make_llm,
            keep_alive=self.keep_alive,
            alarm=self.alarm_state,
            budget=budget,
            settings=served.settings,
            agents=ObjectAgents(SERVED.names, self.to_agent, AGENT_NAMES),
        )

    async def to_agent(self, agent: str, name: str, command: Command) -> Reply:
        """An agent tool's command to session `name` of agent `agent` (agent_calls.py)."""
        command = command.model_copy(update={"name": name, "agent": agent})
        return await send_to_object(self.env, object_name(agent, name), command)

    def keep_alive(self, task: Any) -> None:
        keep_running(self.ctx, task)  # a turn outlives its client (ctx.waitUntil)
