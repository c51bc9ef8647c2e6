"""The deployable Worker: a thin shell over `durable_agents.cloudflare.app`.

    HTTP -> Default.fetch         auth, route, validate (app.handle_request)
         -> env.SESSIONS.getByName(name)     one Durable Object per session name
         -> AgentSession.fetch    one turn at a time; run() on D1 (app.serve_session)

The session id is the Durable Object's id (`ctx.id.toString()`, 64 hex
chars); the history lives in D1 (`env.DB`), so any object, on any machine,
can resume it.

The agent is not here: it is `src/agent.py` (AGENT, make_deps(env, http),
optionally make_llm(env), SETTINGS, DEV_STUBS; see
`durable_agents.cloudflare.agent_module`). Edit that file, not this one.

This module is the only one (with the D1 store) that touches the Workers
runtime; it imports `workers`, so it runs inside a Python Worker (or the
local runtime, `scripts/dev`), not on plain CPython.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

from workers import DurableObject, Response, WorkerEntrypoint

import agent
from durable_agents.cloudflare import d1_store
from durable_agents.cloudflare.agent_module import AgentModule
from durable_agents.cloudflare.app import (
    Command,
    Reply,
    error_reply,
    handle_request,
    internal_error,
    serve_session,
)

SERVED = AgentModule.load(agent)  # src/agent.py, checked: a mistake fails here, named
_BODYLESS = frozenset({"GET", "HEAD"})


def _response(reply: Reply) -> Any:
    return Response(reply.json_text(), status=reply.status, headers=reply.all_headers())


class Default(WorkerEntrypoint):  # type: ignore[misc]  # the workers SDK ships no stubs
    """The Worker: checks every request, then forwards it to the session's Durable Object."""

    async def fetch(self, request: Any) -> Any:
        # From the JS request itself: the SDK's wrapper strips every header value
        # (a token with a trailing U+00A0 would pass) and knows only the
        # standard methods (any other would be a KeyError, a 500).
        raw = request.js_object
        headers = {str(k).lower(): str(v) for k, v in raw.headers.entries()}
        method = str(raw.method).upper()

        async def read_body() -> bytes:
            return b"" if method in _BODYLESS else bytes(await request.bytes())

        try:
            reply = await handle_request(
                method,
                urlsplit(str(request.url)).path,
                headers,
                read_body,
                env=self.env,
                dispatch=self.to_session,
                dev_stubs=SERVED.dev_stubs,
            )
        except Exception as exc:  # a bug: still answer JSON
            reply = internal_error(exc, "the Worker")
        return _response(reply)

    async def to_session(self, name: str, command: Command) -> Reply:
        stub = self.env.SESSIONS.getByName(name)
        response = await stub.fetch(
            "https://session.internal/command",
            method="POST",
            body=command.to_json(),
            headers={"content-type": "application/json"},
        )
        return Reply(int(response.status), await response.json())


class AgentSession(DurableObject):  # type: ignore[misc]  # the workers SDK ships no stubs
    """One session: its id is this object's id; its history is in D1."""

    def __init__(self, ctx: Any, env: Any) -> None:
        super().__init__(ctx, env)
        # One turn at a time: input gates do not hold across awaits on D1 or the LLM.
        self.turn_lock = asyncio.Lock()

    async def fetch(self, request: Any) -> Any:
        try:
            command = Command.from_json(await request.text())
        except ValueError as exc:
            return _response(error_reply(400, "invalid-command", str(exc)))
        reply = await serve_session(
            command,
            session_id=str(self.ctx.id.toString()),
            store=d1_store(self.env.DB),
            env=self.env,
            lock=self.turn_lock,
            agent=SERVED.agent,
            make_deps=SERVED.make_deps,
            make_llm=SERVED.make_llm,
        )
        return _response(reply)
