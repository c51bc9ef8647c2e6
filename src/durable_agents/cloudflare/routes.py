"""The Worker's HTTP API as a table: each route's method, path, handler and who may call it.

`handle_request` answers one request: the dev stubs and the chat page first (no
auth), then the API's settings, the bearer token (`auth.py`), the route (`ROUTES`,
through `routing.route_for`: 404, 405, a bad name, a session token out of its scope),
and the route's handler. A handler reads its body with a model (`bodies.py`) and
forwards a command (`commands.py`) to the session's Durable Object, or answers
itself. A request that fails validation never reaches the object, so nothing is
written for it. What each route takes and answers: docs/http-api.md.
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import ConfigurationError, DurableAgentsError
from ..llm.settings import setting
from ..stores.base import Store
from . import chat_http, reads, schedules_api
from .agent_module import DEV_STUB_PREFIX, DevStub
from .auth import authorize
from .bodies import ApprovalBody, BodyReader, MessageBody, ResumeBody, TokenBody
from .chat_page import chat_page_html
from .commands import (
    REQUEST_KEY,
    TOOL_CALL_ID,
    Approve,
    Cancel,
    Decision,
    Delete,
    Events,
    History,
    ListApprovals,
    ListSchedules,
    Resume,
    SendMessage,
    View,
)
from .config import ApiSettings
from .dev_stubs import serve_dev_stub
from .routing import SESSION_TOKEN, Dispatch, Request, Route, forwarding, route_for
from .served_agents import ServedAgents
from .tokens import mint_session_token
from .wire import HTML_HEADERS, Reply, error_for, error_reply

__all__ = ["MAX_PAGE", "ROUTES", "handle_request"]

MAX_PAGE = 200  # sessions in one page of GET /sessions


async def post_message(request: Request) -> Reply:
    """POST /sessions/{name}/messages: run a turn; `Idempotency-Key` makes a retry safe."""
    body = await request.json_body(MessageBody, required=True)
    if isinstance(body, Reply):
        return body
    key = request.headers.get("idempotency-key")
    if key is not None and not REQUEST_KEY.fullmatch(key):
        return error_reply(
            400, "invalid-request", "Idempotency-Key must be 1 to 255 printable ASCII characters"
        )
    return await request.forward(
        SendMessage(message=body.message, request_key=key, stream=request.stream)
    )


async def resume(request: Request) -> Reply:
    """POST .../resume: finish an interrupted turn."""
    body = await request.json_body(ResumeBody, required=False)
    if isinstance(body, Reply):
        return body
    return await request.forward(Resume(stream=request.stream))


async def decide(request: Request) -> Reply:
    """POST .../approvals/{tool_call_id}: decide one waiting call."""
    call_id = request.params["tool_call_id"]
    if TOOL_CALL_ID.fullmatch(call_id) is None:
        return error_reply(
            400, "invalid-request", "a tool call id is 1 to 255 of A-Z a-z 0-9 _ . : ~ -"
        )
    body = await request.json_body(ApprovalBody, required=True)
    if isinstance(body, Reply):
        return body
    decision = Decision(tool_call_id=call_id, **body.model_dump(exclude_none=True))
    return await request.forward(Approve(decision=decision, stream=request.stream))


async def read_history(request: Request) -> Reply:
    """GET /sessions/{name}?after=&limit=: one page of the stored messages."""
    page = reads.page_query(request.query, "history")
    if isinstance(page, Reply):
        return page
    return await request.forward(History(after=page[0], limit=page[2]))


async def read_view(request: Request) -> Reply:
    """GET .../view?after=|before=&limit=: one page of the timeline (HTML)."""
    page = reads.page_query(request.query, "view")
    if isinstance(page, Reply):
        return page
    return await request.forward(View(after=page[0], before=page[1], limit=page[2]))


async def follow_events(request: Request) -> Reply:
    """GET .../events (Last-Event-ID or ?after=): the replay, then the running turn."""
    after = reads.after_position(request.headers.get("last-event-id"), request.query)
    if isinstance(after, Reply):
        return after
    return await request.forward(Events(after=after))


async def mint_token(request: Request) -> Reply:
    """POST /sessions/{name}/token ({"ttl_seconds"?}): a session token for {name}."""
    secret = request.settings.session_token_secret
    if secret is None:
        return error_for(
            ConfigurationError(
                "SESSION_TOKEN_SECRET is not set, so no session token can be made: set it with "
                "`npx wrangler secret put SESSION_TOKEN_SECRET` (32 bytes or more)"
            )
        )
    body = await request.json_body(TokenBody, required=False)
    if isinstance(body, Reply):
        return body
    expires_at = int(request.now) + body.ttl_seconds
    token = mint_session_token(secret, request.name, expires_at=expires_at, agent=request.agent)
    answer = {"token": token, "expires_at": expires_at, "session": request.name}
    if request.agent is not None:  # the default agent's answer stays as it was
        answer["agent"] = request.agent
    return Reply(200, answer)


async def list_sessions(request: Request) -> Reply:
    """GET /sessions?limit=&cursor=&agent=: newest created first, one page; of one served
    agent's sessions under /agents/{agent}/sessions or with `?agent=`."""
    if request.sessions is None:
        return error_for(ConfigurationError("this Worker has no store to list sessions from"))
    params = urllib.parse.parse_qs(request.query)
    raw_limit = (params.get("limit") or ["50"])[-1]
    if not raw_limit.isascii() or not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_PAGE:
        return error_reply(400, "invalid-request", f"limit must be a whole number 1 to {MAX_PAGE}")
    cursors = params.get("cursor")
    cursor = cursors[-1] if cursors else None
    # Filtered only when asked: a Store of yours without the filter lists as it did.
    wanted = {} if request.agent_name is None else {"agent_name": request.agent_name}
    try:
        page = await request.sessions().list_sessions(
            limit=int(raw_limit), cursor=cursor or None, **wanted
        )
    except DurableAgentsError as exc:
        return error_for(exc)
    return Reply(
        200,
        {"sessions": [s.to_dict() for s in page.sessions], "next_cursor": page.next_cursor},
    )


# Who may call each: the API token (the default), or also a session token on its own
# session (SESSION_TOKEN): talk, read, watch, decide, stop, and see what is scheduled.
# Making or cancelling a schedule needs the API token: a schedule acts later, on
# nobody's request, so it is the deployment's call, not a chat's.
ROUTES = (
    Route("GET", "/sessions", list_sessions, what="listing sessions"),
    Route("GET", "/sessions/", list_sessions, what="listing sessions"),
    Route("GET", "/sessions/{name}", read_history, SESSION_TOKEN),
    Route("DELETE", "/sessions/{name}", forwarding(Delete)),
    Route("POST", "/sessions/{name}/messages", post_message, SESSION_TOKEN),
    Route("POST", "/sessions/{name}/chat", chat_http.post_chat, SESSION_TOKEN),
    Route("POST", "/sessions/{name}/resume", resume, SESSION_TOKEN),
    Route("GET", "/sessions/{name}/approvals", forwarding(ListApprovals), SESSION_TOKEN),
    Route("POST", "/sessions/{name}/approvals/{tool_call_id}", decide, SESSION_TOKEN),
    Route("GET", "/sessions/{name}/events", follow_events, SESSION_TOKEN),
    Route("POST", "/sessions/{name}/cancel", forwarding(Cancel), SESSION_TOKEN),
    Route("GET", "/sessions/{name}/view", read_view, SESSION_TOKEN),
    Route("POST", "/sessions/{name}/token", mint_token),
    Route("GET", "/sessions/{name}/schedules", forwarding(ListSchedules), SESSION_TOKEN),
    Route("POST", "/sessions/{name}/schedules", schedules_api.post_schedule),
    Route("DELETE", "/sessions/{name}/schedules/{schedule_id}", schedules_api.delete_schedule),
)


async def handle_request(
    method: str,
    path: str,
    headers: Mapping[str, str],
    body: bytes | BodyReader,
    *,
    env: Any,
    dispatch: Dispatch,
    dev_stubs: Mapping[str, DevStub] | None = None,
    query: str = "",
    sessions: Callable[[], Store] | None = None,
    clock: Callable[[], float] = time.time,
    served: ServedAgents | None = None,
) -> Reply:
    """Answer one HTTP request to the Worker.

    `headers` has lower-case names. `body` is the request body, or an async
    function that reads it: it is called only once the declared
    Content-Length is within the limit. `dispatch(name, command)` forwards a
    valid request to the session's Durable Object (in entry.py) and is
    called for nothing else. `dev_stubs` (the agent module's `DEV_STUBS`)
    answer `/__dev/<NAME>/...` while the setting `DEV_STUBS` is "on". `query`
    is the URL's query string (without "?"). `sessions()` is the store that
    lists every session (`GET /sessions`; the Worker's D1). `clock` reads
    Unix seconds, for session tokens. `served`: the agents the Worker serves
    (`served_agents.serve_agents`); `/agents/{agent}/...` addresses one of them (None: the
    default agent only, as a Worker of one agent).
    """
    if dev_stubs and path.startswith(DEV_STUB_PREFIX) and setting(env, "DEV_STUBS") == "on":
        return await serve_dev_stub(method, path, headers, body, dev_stubs, query)
    if path == "/" and method.upper() in ("GET", "HEAD") and setting(env, "CHAT_PAGE") == "on":
        return Reply(200, None, HTML_HEADERS, text=chat_page_html())
    settings = _api_settings(env)
    if isinstance(settings, Reply):
        return settings
    now = clock()
    grant = authorize(headers.get("authorization"), settings, now)
    if isinstance(grant, Reply):
        return grant
    method = method.upper()
    addressed = _addressed(served, path, query)
    if isinstance(addressed, Reply):
        return addressed
    agent, routed, agent_name = addressed
    found = route_for(ROUTES, method, routed, grant, agent)
    if isinstance(found, Reply):
        return found
    route, params = found
    request = Request(
        method, path, params, headers, body, query, settings, now, dispatch, sessions,
        agent, agent_name,
    )  # fmt: skip
    return await route.handler(request)


def _addressed(
    served: ServedAgents | None, path: str, query: str
) -> tuple[str | None, str, str | None] | Reply:
    """The served agent `path` addresses (None: the default), the path its routes see, and
    the AGENT.name a listing is filtered by (`/agents/{agent}/sessions`, `?agent=`)."""
    if served is None:  # a Worker of the default agent only
        return None, path, None
    addressed = served.address(path)
    if isinstance(addressed, Reply):
        return addressed
    agent, routed = addressed
    if routed not in ("/sessions", "/sessions/"):
        return agent, routed, None
    wanted = agent
    if agent is None:
        asked = urllib.parse.parse_qs(query).get("agent")
        wanted = asked[-1] if asked else None
        if wanted is not None and not served.serves(wanted):
            return served.unknown(wanted)
    return agent, routed, None if wanted is None else served.agent_name(wanted) or wanted


def _api_settings(env: Any) -> ApiSettings | Reply:
    """The API's settings, or the 500 that says which is wrong (the API never runs open)."""
    try:
        settings = ApiSettings.from_env(env)
    except ConfigurationError as exc:
        return error_for(exc)
    if settings.api_token is None:
        return error_for(
            ConfigurationError(
                "API_TOKEN is not set, so every request is refused: set it with "
                "`npx wrangler secret put API_TOKEN` (or in .dev.vars for the dev server)"
            )
        )
    return settings
