"""The Worker's HTTP API as plain Python: auth, routing, validation, running a session, JSON.

`src/entry.py` is a thin shell around the two halves here, so everything an
HTTP client can get wrong is decided, and unit-tested, on CPython:

    Worker (Default.fetch)                     Durable Object (AgentSession.fetch)
    handle_request(method, path, headers, body)  ──Command──►  serve_session(command, ...)
      config, auth, route, method, name,                        one turn at a time per object,
      size, JSON, fields -> 4xx, nothing written                run() on D1 -> Reply

Endpoints (JSON in and out; `Authorization: Bearer <API_TOKEN>` on every one):

    POST /sessions/{name}/messages  {"message": "..."}  -> {"session_id", "status", "response", ...}
                                    (Idempotency-Key: K makes a retry return or finish K's turn)
    POST /sessions/{name}/resume    (no body, or {})    -> the same, finishing an interrupted turn
    GET  /sessions/{name}  (?after=N&limit=L)           -> {"session_id", "messages": [...],
                                    "next", "message_count"}: one page of the stored messages
    GET  /sessions/{name}/approvals                     -> {"session_id", "pending": [...]}
    POST /sessions/{name}/approvals/{tool_call_id}
                    {"approved": bool, "digest": "...", "reason": "...", "arguments": {...}}
                    -> the turn's result once the step's last call is decided,
                       else {"status": "awaiting_approval", "pending": [...]}
                       (`arguments`, with an approval only: the approver's edit,
                       checked against the tool's schema; 422 invalid-arguments)
    GET  /sessions/{name}/events    (Last-Event-ID: N or ?after=N) -> SSE: the stored messages
                                    after position N, then the running turn live, then `done`
    POST /sessions/{name}/cancel                        -> the running turn's result, once it
                                    stopped at a step boundary (status "cancelled"); 409 if none
    GET  /sessions/{name}/view  (?after=N | ?before=N, &limit=L) -> one page of the timeline
                                    (HTML; by default the latest messages)
    POST /sessions/{name}/schedules {"message": "...", "delay_seconds": N | "at": ISO 8601}
                                    -> {"schedule_id", "at"}: the message runs as a turn then
    GET  /sessions/{name}/schedules                     -> {"session_id", "schedules": [...]}
    DELETE /sessions/{name}/schedules/{schedule_id}     -> {"schedule_id", "deleted": true}

Reads come in pages, each read a chunk at a time, so no read holds a long session
in memory or keeps its object busy for long: GET answers at most `limit` messages
(HISTORY_LIMIT by default, at most MAX_HISTORY_LIMIT) and about PAGE_BYTES of them;
`/view` likewise (VIEW_LIMIT, MAX_VIEW_LIMIT, VIEW_PAGE_BYTES); `/events` streams
its replay in chunks of EVENTS_CHUNK messages or more.

The three that run a turn (messages, resume, an approval) answer a stream of
server-sent events instead of JSON when asked with `Accept: text/event-stream`:
`delta` ({"text"}, no id), `message` (id: its position; the stored message),
then `done` (the same JSON as the plain answer) or `error` ({"error": ...}).
A turn runs apart from the request that started it: a client that goes away
stops only its stream (`GET .../events` picks it up again); `cancel` stops the turn.

Every error is `{"error": {"code", "message"}}` with a 4xx/5xx status; the
code of an error the kit raises is that error's own `code` (`ERROR_STATUS`
maps its class to the status). A request that fails validation never
reaches the Durable Object, so nothing is written for it. The API's own
settings are read from the Worker's env (`setting()`): `API_TOKEN`
(required: without it every request gets a 500, the API never runs open)
and `MAX_BODY_BYTES` (default 64 KiB). Everything else (the LLM, the
tools' settings) is the agent module's business (`agent_module`).

With the setting `DEV_STUBS` = "on" (the dev server's doing, never set on
Cloudflare), `/__dev/<NAME>/...` is answered by the agent module's stub for
the setting NAME, without auth. With `CHAT_PAGE` = "on" (the dev server's
default), `GET /` serves a chat page (`chat_page.py`) that asks for the token.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import inspect
import json
import re
import sys
import time
import traceback
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

import httpx

from .. import _json
from .._http.json_guard import refuse_deep_json
from .._timeouts import timeout
from ..agent import Agent
from ..approvals import approval_states, approve, pending_approvals, waiting_calls
from ..budget import PLANS, InvocationBudget, invocation
from ..errors import (
    ApprovalAlreadyDecidedError,
    ApprovalDigestMismatchError,
    ApprovalNotFoundError,
    ApprovalPendingError,
    ConfigurationError,
    DurableAgentsError,
    InvalidCursorError,
    MessageTooLargeError,
    RequestKeyReusedError,
    ScheduleError,
    SessionBusyError,
    SessionConflictError,
    SessionNotFoundError,
    StoreError,
    ToolArgumentsError,
)
from ..events import CancelToken, OnEvent
from ..llm.base import LLM
from ..llm.settings import llm_from_env, setting
from ..messages import CALL_ID, Message
from ..run import RunResult, run, stop_turn
from ..schedules import due_time, new_schedule, room_left
from ..stores._limits import MAX_BOUND_INT
from ..stores.base import SessionInfo, Store
from .agent_module import DEV_STUB_PREFIX, DevStub, MakeDeps, MakeLLM
from .alarms import ObjectAlarm, on_alarm
from .live import LiveSession, LiveTurn, follow, message_event, sse
from .tokens import (
    SessionTokenError,
    check_secret,
    looks_like_session_token,
    mint_session_token,
    verify_session_token,
)

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "ERROR_STATUS",
    "MASTER",
    "REQUEST_KEY",
    "SESSION_NAME",
    "SSE_HEADERS",
    "ApiSettings",
    "Command",
    "LiveSession",
    "Reply",
    "authorize",
    "error_for",
    "error_reply",
    "handle_request",
    "internal_error",
    "plan_budget",
    "resume_left_turn",
    "run_retention",
    "serve_alarm",
    "serve_dev_stub",
    "serve_session",
    "session_store_kind",
    "session_stores",
    "tools_client",
    "with_budget",
]

DEFAULT_MAX_BODY_BYTES = 64 * 1024
SESSION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
REQUEST_KEY = re.compile(r"[!-~]{1,255}")  # printable ASCII, as Stripe-style keys are
TOOL_CALL_ID = CALL_ID  # every id the kit stores for a call (run() gives others its own)
DIGEST = re.compile(r"[0-9a-f]{64}")
_SESSION_PATH = re.compile(
    r"/sessions/([^/]+)"
    r"(?:/(messages|resume|approvals|events|cancel|view|token|schedules)(?:/([^/]+))?)?"
)
_ALLOWED = {
    None: ("GET", "DELETE"), "messages": ("POST",), "resume": ("POST",), "approvals": ("GET",),
    "events": ("GET",), "cancel": ("POST",), "view": ("GET",), "token": ("POST",),
    "schedules": ("GET", "POST"),
}  # fmt: skip
# The endpoints under /sessions/{name}/<endpoint>/{id}, and the methods each takes.
_ITEM_METHODS = {"approvals": ("POST",), "schedules": ("DELETE",)}
# What a session token may do (on its own session): talk, read, watch, decide, stop,
# and see what is scheduled. Making or cancelling a schedule needs the API token: a
# schedule acts later, on nobody's request, so it is the deployment's call, not a chat's.
_SCOPED = {
    (None, "GET"), ("messages", "POST"), ("resume", "POST"), ("approvals", "GET"),
    ("approvals", "POST"), ("events", "GET"), ("cancel", "POST"), ("view", "GET"),
    ("schedules", "GET"),
}  # fmt: skip
SCHEDULE_ID = re.compile(r"[A-Za-z0-9_.:~-]{1,100}")
DEFAULT_TOKEN_TTL_S = 3600
MAX_TOKEN_TTL_S = 7 * 24 * 3600
MAX_PAGE = 200
# Pages of one session's messages: GET /sessions/{name} and GET .../view answer at most
# `limit` messages (these defaults and maxima), and stop before the message that would
# take the page's JSON past its bytes (a page holds one message at least).
HISTORY_LIMIT, MAX_HISTORY_LIMIT, PAGE_BYTES = 200, 1000, 2_000_000
VIEW_LIMIT, MAX_VIEW_LIMIT, VIEW_PAGE_BYTES = 100, 500, 1_000_000
# /events replays the stored messages EVENTS_CHUNK a read, or more for a long history:
# in at most EVENTS_READS reads (D1 counts each query: 50 per request on the free plan).
EVENTS_CHUNK, EVENTS_READS = 200, 40
FIRST_CHUNK, MAX_CHUNK = 50, 200  # rows a page reads at once: the first read, the most
SSE_PIECE_BYTES = 256 * 1024  # replayed events are sent in pieces of about this size
# A replay shares its isolate's one loop (with every session in `wrangler dev`): it
# lets other requests in every REPLAY_SLICE messages, and pauses before each read
# after its first, so a long one slows others less (3 replays of 20,000 messages at
# once under scripts/dev: another session's turn took 2 s without the pause, 0.6-1 s
# with it; 0.2 s alone).
REPLAY_SLICE, REPLAY_PAUSE_S = 50, 0.02
_JSON = {"content-type": "application/json"}
SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}
_HTML = {"content-type": "text/html; charset=utf-8", "cache-control": "no-cache"}
# How long a streamed turn may take to fail before its answer must start: an error
# known at once (a new message while calls wait for approval, say) is an HTTP status.
FIRST_EVENT_WAIT_S = 2.0
HTTP_TIMEOUT_S = 30.0

BodyReader = Callable[[], Awaitable[bytes]]
Dispatch = Callable[[str, "Command"], Awaitable["Reply"]]

# The status of each error the kit raises; its `code` is the error's own. A
# subclass not listed here takes its nearest listed base's status.
ERROR_STATUS: Mapping[type[DurableAgentsError], int] = {
    InvalidCursorError: 400,
    SessionNotFoundError: 404,
    ApprovalNotFoundError: 404,
    SessionConflictError: 409,
    ApprovalDigestMismatchError: 409,
    ApprovalAlreadyDecidedError: 409,
    ApprovalPendingError: 409,
    SessionBusyError: 409,
    MessageTooLargeError: 413,
    RequestKeyReusedError: 422,
    ScheduleError: 422,
    ToolArgumentsError: 422,
    ConfigurationError: 500,
    StoreError: 503,
}


@dataclass(frozen=True, slots=True)
class Reply:
    """One HTTP answer: a status, a JSON body (an object, except from a dev stub), headers.

    Or, instead of JSON, `text` (the chat page) or `stream`: the chunks of an
    SSE body, an async iterator of bytes (or, in the Worker, the Durable
    Object's JS ReadableStream, passed through untouched).
    """

    status: int
    body: Any
    headers: Mapping[str, str] = field(default_factory=dict)
    stream: Any = None
    text: str | None = None

    def json_text(self) -> str:
        """The body as strict JSON (no NaN; lone surrogates, if any got here, as U+FFFD)."""
        text = json.dumps(self.body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return _json.repair_text(text)

    def all_headers(self) -> dict[str, str]:
        return {**_JSON, **self.headers}

    @property
    def run_status(self) -> str | None:
        """The status of the turn this answers (`RunResult.status`), or None when it is
        no turn's result (an error before one began, a read)."""
        status = self.body.get("status") if isinstance(self.body, dict) else None
        return status if isinstance(status, str) else None

    @property
    def error_code(self) -> str | None:
        """The `error.code` of the body, if it has one."""
        error = self.body.get("error") if isinstance(self.body, dict) else None
        code = error.get("code") if isinstance(error, dict) else None
        return code if isinstance(code, str) else None


def error_reply(status: int, code: str, message: str, **headers: str) -> Reply:
    """The one error shape: `{"error": {"code", "message"}}`."""
    return Reply(status, {"error": {"code": code, "message": message}}, headers)


def error_for(exc: DurableAgentsError, message: str | None = None) -> Reply:
    """The answer to an error the kit raised: its `ERROR_STATUS` (500 if none), its own `code`."""
    status = next((ERROR_STATUS[c] for c in type(exc).__mro__ if c in ERROR_STATUS), 500)
    return error_reply(status, exc.code, message or str(exc))


@dataclass(frozen=True, slots=True)
class Command:
    """What the Worker asks a session's Durable Object to do, after validation.

    `action` is `"message"` (run a turn with `message`), `"resume"` (finish an
    interrupted turn), `"history"` (read the stored messages), `"approvals"`
    (read the calls waiting for a decision) or `"approve"` (decide
    `decision["tool_call_id"]`, then go on with the turn if it was the step's
    last). It crosses from the Worker to the object as JSON (`to_json` / `from_json`).
    """

    action: Literal[
        "message", "resume", "history", "approvals", "approve", "events", "cancel", "view",
        "delete", "schedule", "schedules", "unschedule", "stop",
    ]  # fmt: skip
    message: str | None = None
    request_key: str | None = None  # the client's Idempotency-Key, with a message
    # tool_call_id, approved, digest, reason, arguments (an approval's edit, an object)
    decision: Mapping[str, Any] | None = None
    stream: bool = False  # answer a turn as server-sent events
    after: int | None = None  # events, history, view: the messages after this position
    name: str | None = None  # the session's name, as the client gave it (set by the Worker)
    before: int | None = None  # view: the messages before this position
    limit: int | None = None  # history, view: at most this many messages
    schedule: Mapping[str, Any] | None = None  # schedule: message, delay_seconds | at
    schedule_id: str | None = None  # unschedule
    # Set by the object itself, never sent: the turns its alarm runs ("self-resumed",
    # "scheduled"; "stop" ends a turn whose resumes kept crashing, `message` says why).
    origin: str | None = None

    @property
    def runs_turn(self) -> bool:
        return self.action in ("message", "resume", "approve", "stop")

    def to_json(self) -> str:
        data: dict[str, Any] = {
            "action": self.action, "message": self.message, "request_key": self.request_key,
        }  # fmt: skip
        if self.decision is not None:
            data["decision"] = dict(self.decision)
        if self.stream:
            data["stream"] = True
        if self.after is not None:
            data["after"] = self.after
        if self.before is not None:
            data["before"] = self.before
        if self.limit is not None:
            data["limit"] = self.limit
        if self.name is not None:
            data["name"] = self.name
        if self.schedule is not None:
            data["schedule"] = dict(self.schedule)
        if self.schedule_id is not None:
            data["schedule_id"] = self.schedule_id
        return json.dumps(data, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> Command:
        """Parse the Worker's command; ValueError if it is not one."""
        # One level deeper than the request body it carries (a decision's edited
        # arguments sit inside "decision"), which was held to MAX_DEPTH.
        data = _json.loads(text, max_depth=_json.MAX_DEPTH + 1)
        if not isinstance(data, dict):
            raise ValueError("a command is a JSON object")
        action, message, key = data.get("action"), data.get("message"), data.get("request_key")
        stream, after, name = data.get("stream", False), data.get("after"), data.get("name")
        before, limit = data.get("before"), data.get("limit")
        if name is not None and (not isinstance(name, str) or not SESSION_NAME.fullmatch(name)):
            raise ValueError(f"not a command: {text[:200]!r}")
        key_ok = key is None or (isinstance(key, str) and REQUEST_KEY.fullmatch(key) is not None)
        turn = action in ("message", "resume", "approve")
        if not isinstance(stream, bool) or (stream and not turn):
            raise ValueError(f"not a command: {text[:200]!r}")
        if after is not None and (action not in _PAGED or not _is_position(after)):
            raise ValueError(f"not a command: {text[:200]!r}")
        if before is not None and (
            action != "view" or not _is_position(before) or after is not None
        ):
            raise ValueError(f"not a command: {text[:200]!r}")
        most = _LIMITS.get(str(action), (0, 0))[1]
        if limit is not None and not (type(limit) is int and 1 <= limit <= most):
            raise ValueError(f"not a command: {text[:200]!r}")
        if action == "message" and isinstance(message, str) and message.strip() and key_ok:
            return cls("message", message, key, stream=stream, name=name)
        plain = message is None and key is None
        if action == "schedule" and plain and _valid_schedule(data.get("schedule")):
            return cls("schedule", schedule=data["schedule"], name=name)
        schedule_id = data.get("schedule_id")
        if (
            action == "unschedule" and plain and isinstance(schedule_id, str)
            and SCHEDULE_ID.fullmatch(schedule_id)
        ):  # fmt: skip
            return cls("unschedule", schedule_id=schedule_id, name=name)
        simple = (
            "resume", "history", "approvals", "events", "cancel", "view", "delete", "schedules",
        )  # fmt: skip
        if action in simple and plain:
            return cls(action, stream=stream, after=after, name=name, before=before, limit=limit)
        decision = data.get("decision")
        if action == "approve" and isinstance(decision, dict) and _valid_decision(decision):
            return cls("approve", decision=decision, stream=stream, name=name)
        raise ValueError(f"not a command: {text[:200]!r}")


def _valid_schedule(value: Any) -> bool:
    """A schedule body the Worker checked: {"message": text, one of delay_seconds / at}."""
    if not isinstance(value, dict) or not set(value) <= {"message", "delay_seconds", "at"}:
        return False
    message = value.get("message")
    return (
        isinstance(message, str)
        and bool(message.strip())
        and (value.get("delay_seconds") is None) != (value.get("at") is None)
    )


def _is_position(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_BOUND_INT


_PAGED = ("events", "history", "view")  # the commands that take `after`
_LIMITS = {"history": (HISTORY_LIMIT, MAX_HISTORY_LIMIT), "view": (VIEW_LIMIT, MAX_VIEW_LIMIT)}


def _valid_decision(decision: Mapping[str, Any]) -> bool:
    call_id, reason = decision.get("tool_call_id"), decision.get("reason")
    arguments = decision.get("arguments")
    return (
        set(decision) <= {"tool_call_id", "approved", "digest", "reason", "arguments"}
        and isinstance(call_id, str)
        and TOOL_CALL_ID.fullmatch(call_id) is not None
        and isinstance(decision.get("approved"), bool)
        and isinstance(decision.get("digest"), str)
        and (reason is None or isinstance(reason, str))
        and (arguments is None or (isinstance(arguments, dict) and decision["approved"] is True))
    )


@dataclass(frozen=True, slots=True)
class ApiSettings:
    """The API's own settings, read from the Worker's env by `from_env`."""

    api_token: str | None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    session_token_secret: str | None = None

    @classmethod
    def from_env(cls, env: Any) -> ApiSettings:
        """Raises ConfigurationError for a MAX_BODY_BYTES that is not a positive integer."""
        token = setting(env, "API_TOKEN")
        raw_limit = setting(env, "MAX_BODY_BYTES")
        limit = DEFAULT_MAX_BODY_BYTES
        if raw_limit is not None:
            try:
                limit = int(str(raw_limit))
            except ValueError:
                limit = 0
            if limit < 1:
                raise ConfigurationError(
                    f"MAX_BODY_BYTES must be a positive integer (bytes), got {raw_limit!r}"
                )
        secret = setting(env, "SESSION_TOKEN_SECRET")
        if secret is not None:
            try:
                check_secret(str(secret))
            except ValueError as exc:
                raise ConfigurationError(str(exc)) from None
        return cls(
            None if token is None else str(token), limit, None if secret is None else str(secret)
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
    Unix seconds, for session tokens.
    """
    if dev_stubs and path.startswith(DEV_STUB_PREFIX) and setting(env, "DEV_STUBS") == "on":
        return await serve_dev_stub(method, path, headers, body, dev_stubs, query)
    if path == "/" and method.upper() in ("GET", "HEAD") and setting(env, "CHAT_PAGE") == "on":
        from .chat_page import CHAT_PAGE_HTML

        return Reply(200, None, _HTML, text=CHAT_PAGE_HTML)
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
    grant = authorize(headers.get("authorization"), settings, clock())
    if isinstance(grant, Reply):
        return grant
    method = method.upper()

    if path in ("/sessions", "/sessions/"):
        if method != "GET":
            return error_reply(405, "method-not-allowed", f"{path} accepts GET only", Allow="GET")
        if grant is not MASTER:
            return _forbidden("listing sessions")
        return await _list_sessions(sessions, query)
    match = _SESSION_PATH.fullmatch(path)
    if match is None:
        return error_reply(
            404, "not-found", f"no endpoint at {path[:200]!r}; the API serves /sessions/{{name}}"
        )
    name, endpoint, call_id = match.group(1), match.group(2), match.group(3)
    if call_id is not None and endpoint not in _ITEM_METHODS:
        return error_reply(404, "not-found", f"no endpoint at {path[:200]!r}")
    allowed = _ITEM_METHODS[endpoint] if call_id is not None else _ALLOWED[endpoint]
    if method not in allowed:
        listed = ", ".join(allowed)
        return error_reply(405, "method-not-allowed", f"{path} accepts {listed} only", Allow=listed)
    if SESSION_NAME.fullmatch(name) is None:
        return error_reply(
            400,
            "invalid-session-name",
            "a session name is 1 to 64 characters from A-Z, a-z, 0-9, '_' and '-'",
        )
    if grant is not MASTER:
        if grant != name:
            return _forbidden(f"session {name!r} (the token grants session {grant!r} only)")
        if (endpoint, method) not in _SCOPED:
            return _forbidden(f"{method} {path} (a session token talks and reads only)")
    stream = "text/event-stream" in headers.get("accept", "").lower()
    if endpoint == "token":
        return await _mint_token(headers, body, settings, name, clock())
    if endpoint is None and method == "DELETE":
        return await _forward(dispatch, name, Command("delete"))
    if endpoint is None or endpoint == "view":
        action: Literal["history", "view"] = "history" if endpoint is None else "view"
        page = _page_query(query, action)
        if isinstance(page, Reply):
            return page
        command = Command(action, after=page[0], before=page[1], limit=page[2])
        return await _forward(dispatch, name, command)
    if endpoint == "approvals" and call_id is None:
        return await _forward(dispatch, name, Command("approvals"))
    if endpoint == "events":
        after = _after_position(headers.get("last-event-id"), query)
        if isinstance(after, Reply):
            return after
        return await _forward(dispatch, name, Command("events", after=after))
    if endpoint == "cancel":
        return await _forward(dispatch, name, Command("cancel"))
    if endpoint == "schedules":
        return await _schedules_request(
            method, headers, body, settings, dispatch, name, call_id, int(clock() * 1000)
        )
    if call_id is not None:
        return await _approval_request(headers, body, settings, dispatch, name, call_id, stream)

    data = await _read_json(headers, body, settings.max_body_bytes, required=endpoint == "messages")
    if isinstance(data, Reply):
        return data
    if endpoint == "resume":
        if data:
            return error_reply(
                422, "invalid-body", f"resume takes no fields; got {sorted(data)[:10]}"
            )
        return await _forward(dispatch, name, Command("resume", stream=stream))
    extra = sorted(set(data) - {"message"})
    if extra:
        return error_reply(
            422, "invalid-body", f"unknown field(s) {extra[:10]}; the body is {{'message': str}}"
        )
    message = data.get("message")
    if message is None:
        return error_reply(422, "invalid-body", "the field 'message' is missing")
    if not isinstance(message, str):
        return error_reply(
            422, "invalid-body", f"'message' must be a string, got {_json_type(message)}"
        )
    if not message.strip():
        return error_reply(422, "invalid-body", "'message' is empty")
    request_key = headers.get("idempotency-key")
    if request_key is not None and not REQUEST_KEY.fullmatch(request_key):
        return error_reply(
            400, "invalid-request", "Idempotency-Key must be 1 to 255 printable ASCII characters"
        )
    return await _forward(dispatch, name, Command("message", message, request_key, stream=stream))


async def _schedules_request(
    method: str,
    headers: Mapping[str, str],
    body: bytes | BodyReader,
    settings: ApiSettings,
    dispatch: Dispatch,
    name: str,
    schedule_id: str | None,
    now_ms: int,
) -> Reply:
    """GET, POST .../schedules and DELETE .../schedules/{id}, checked before forwarding."""
    if schedule_id is not None:
        if SCHEDULE_ID.fullmatch(schedule_id) is None:
            return error_reply(
                404, "schedule-not-found", f"session {name!r} has no schedule {schedule_id[:100]!r}"
            )
        return await _forward(dispatch, name, Command("unschedule", schedule_id=schedule_id))
    if method == "GET":
        return await _forward(dispatch, name, Command("schedules"))
    data = await _read_json(headers, body, settings.max_body_bytes, required=True)
    if isinstance(data, Reply):
        return data
    extra = sorted(set(data) - {"message", "delay_seconds", "at"})
    if extra:
        return error_reply(
            422, "invalid-body",
            f"unknown field(s) {extra[:10]}; the body is {{'message': str, 'delay_seconds': "
            "number}} or {'message': str, 'at': ISO 8601 time}",
        )  # fmt: skip
    message = data.get("message")
    if not isinstance(message, str) or not message.strip():
        return error_reply(422, "invalid-body", "'message' must be a non-empty string")
    try:  # checked here with this clock; the object sets the time with its own
        due_time(now_ms, delay_seconds=data.get("delay_seconds"), at=data.get("at"))
    except ScheduleError as exc:
        return error_reply(422, exc.code, str(exc))
    return await _forward(dispatch, name, Command("schedule", schedule=data))


async def _list_sessions(sessions: Callable[[], Store] | None, query: str) -> Reply:
    """GET /sessions?limit=&cursor=: newest created first, one page."""
    if sessions is None:
        return error_for(ConfigurationError("this Worker has no store to list sessions from"))
    params = urllib.parse.parse_qs(query)
    raw_limit = (params.get("limit") or ["50"])[-1]
    if not raw_limit.isascii() or not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_PAGE:
        return error_reply(400, "invalid-request", f"limit must be a whole number 1 to {MAX_PAGE}")
    cursors = params.get("cursor")
    cursor = cursors[-1] if cursors else None
    try:
        page = await sessions().list_sessions(limit=int(raw_limit), cursor=cursor or None)
    except DurableAgentsError as exc:
        return error_for(exc)
    return Reply(
        200,
        {"sessions": [s.to_dict() for s in page.sessions], "next_cursor": page.next_cursor},
    )


async def _mint_token(
    headers: Mapping[str, str], body: bytes | BodyReader, settings: ApiSettings, name: str,
    now: float,
) -> Reply:  # fmt: skip
    """POST /sessions/{name}/token ({"ttl_seconds"?}): a session token for `name`."""
    if settings.session_token_secret is None:
        return error_for(
            ConfigurationError(
                "SESSION_TOKEN_SECRET is not set, so no session token can be made: set it with "
                "`npx wrangler secret put SESSION_TOKEN_SECRET` (32 bytes or more)"
            )
        )
    data = await _read_json(headers, body, settings.max_body_bytes, required=False)
    if isinstance(data, Reply):
        return data
    extra = sorted(set(data) - {"ttl_seconds"})
    ttl = data.get("ttl_seconds", DEFAULT_TOKEN_TTL_S)
    if extra or type(ttl) is not int or not 1 <= ttl <= MAX_TOKEN_TTL_S:
        return error_reply(
            422, "invalid-body",
            f"the body is {{}} or {{'ttl_seconds': 1 to {MAX_TOKEN_TTL_S}}} (default "
            f"{DEFAULT_TOKEN_TTL_S})",
        )  # fmt: skip
    expires_at = int(now) + ttl
    token = mint_session_token(settings.session_token_secret, name, expires_at=expires_at)
    return Reply(200, {"token": token, "expires_at": expires_at, "session": name})


def _page_query(
    query: str, action: Literal["history", "view"]
) -> tuple[int | None, int | None, int | None] | Reply:
    """(after, before, limit) of a paged read, each None if not given: `?after=N`, `?limit=L`
    and, for the view, `?before=N` (other parameters are ignored, as the listing does)."""
    params = urllib.parse.parse_qs(query)
    names = ("after", "before", "limit") if action == "view" else ("after", "limit")
    values: dict[str, int | None] = {"after": None, "before": None, "limit": None}
    for key in names:
        raw = (params.get(key) or [""])[-1]
        if raw == "":
            continue
        if not raw.isascii() or not raw.isdigit() or len(raw) > 15:
            what = "a whole number" if key == "limit" else "a message position: a whole number >= 0"
            return error_reply(400, "invalid-request", f"{key} must be {what}")
        values[key] = int(raw)
    most = _LIMITS[action][1]
    if values["limit"] is not None and not 1 <= values["limit"] <= most:
        return error_reply(
            400, "invalid-request",
            f"limit must be a whole number 1 to {most} (default {_LIMITS[action][0]})",
        )  # fmt: skip
    if values["after"] is not None and values["before"] is not None:
        return error_reply(400, "invalid-request", "give after or before, not both")
    return values["after"], values["before"], values["limit"]


def _after_position(last_event_id: str | None, query: str) -> int | Reply | None:
    """The position to replay after: `Last-Event-ID`, else `?after=`, else None (all)."""
    raw = last_event_id
    if raw is None:
        values = urllib.parse.parse_qs(query).get("after")
        raw = values[-1] if values else None
    if raw is None or raw == "":
        return None
    if not raw.isascii() or not raw.isdigit() or len(raw) > 15:
        return error_reply(
            400,
            "invalid-request",
            "Last-Event-ID (or ?after=) must be a message position: a whole number >= 0",
        )
    return int(raw)


async def _approval_request(
    headers: Mapping[str, str],
    body: bytes | BodyReader,
    settings: ApiSettings,
    dispatch: Dispatch,
    name: str,
    call_id: str,
    stream: bool,
) -> Reply:
    if TOOL_CALL_ID.fullmatch(call_id) is None:
        return error_reply(
            400, "invalid-request", "a tool call id is 1 to 255 of A-Z a-z 0-9 _ . : ~ -"
        )
    data = await _read_json(headers, body, settings.max_body_bytes, required=True)
    if isinstance(data, Reply):
        return data
    shape = (
        "the body is {'approved': true|false, 'digest': '<64 hex>', 'reason'?: str, "
        "'arguments'?: {...} (with an approval: the approver's edit)}"
    )
    extra = sorted(set(data) - {"approved", "digest", "reason", "arguments"})
    if extra:
        return error_reply(422, "invalid-body", f"unknown field(s) {extra[:10]}; {shape}")
    if not isinstance(data.get("approved"), bool):
        return error_reply(422, "invalid-body", f"'approved' must be true or false; {shape}")
    digest = data.get("digest")
    if not isinstance(digest, str) or DIGEST.fullmatch(digest) is None:
        return error_reply(422, "invalid-body", f"'digest' must be 64 lower-case hex; {shape}")
    reason = data.get("reason")
    if reason is not None and not isinstance(reason, str):
        return error_reply(422, "invalid-body", f"'reason' must be a string; {shape}")
    arguments = data.get("arguments")
    if arguments is not None and not isinstance(arguments, dict):
        return error_reply(422, "invalid-body", f"'arguments' must be a JSON object; {shape}")
    if arguments is not None and not data["approved"]:
        return error_reply(
            422, "invalid-body", f"'arguments' go with an approval only (a denial runs nothing); "
            f"{shape}",
        )  # fmt: skip
    decision = {"tool_call_id": call_id, "approved": data["approved"], "digest": digest}
    if reason is not None:
        decision["reason"] = reason
    if arguments is not None:
        decision["arguments"] = arguments
    return await _forward(dispatch, name, Command("approve", decision=decision, stream=stream))


async def _forward(dispatch: Dispatch, name: str, command: Command) -> Reply:
    try:
        return await dispatch(name, dataclasses.replace(command, name=name))
    except Exception as exc:
        return internal_error(exc, f"session {name!r}")


def internal_error(exc: BaseException, where: str) -> Reply:
    """A 500 for an unexpected failure: its type and text; the traceback goes to the log."""
    traceback.print_exception(exc, file=sys.stderr)
    detail = f"{type(exc).__name__}: {exc}"[:500]
    return error_reply(500, "internal", f"{where} failed unexpectedly: {detail}")


MASTER = object()  # what API_TOKEN grants: everything
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="durable-agents"'}


def authorize(authorization: str | None, settings: ApiSettings, now: float) -> object | Reply:
    """`MASTER` for `Bearer <API_TOKEN>`, the session name a valid session token grants,
    or a 401. Both are compared in constant time; no token is ever logged."""
    assert settings.api_token is not None  # checked before
    denied = check_bearer(authorization, settings.api_token)
    if denied is None:
        return MASTER
    token = (authorization or "").partition(" ")[2]
    scheme = (authorization or "").partition(" ")[0].lower()
    if scheme != "bearer" or not looks_like_session_token(token) or not token.isascii():
        return denied
    if settings.session_token_secret is None:
        return error_reply(
            401, "unauthorized", "session tokens are off (SESSION_TOKEN_SECRET is not set)",
            **_CHALLENGE,
        )  # fmt: skip
    try:
        return verify_session_token(settings.session_token_secret, token, now=now)
    except SessionTokenError as exc:
        return error_reply(401, "unauthorized", str(exc), **_CHALLENGE)


def _forbidden(what: str) -> Reply:
    return error_reply(403, "forbidden", f"a session token does not grant {what}")


def check_bearer(authorization: str | None, api_token: str) -> Reply | None:
    """None if `authorization` is `Bearer <api_token>`, else a 401."""
    challenge = _CHALLENGE
    if not authorization:
        return error_reply(
            401, "unauthorized", "missing 'Authorization: Bearer <API_TOKEN>'", **challenge
        )
    # Exactly `Bearer <token>` (RFC 6750): the scheme in any case, one ASCII space, the
    # token as sent. Nothing is stripped, so `Bearer <token>\xa0` or `Bearer  <token>` is
    # not the token; a non-ASCII value is simply not it. Compared as bytes in constant
    # time, so the reply time says nothing about the token.
    scheme, _, token = authorization.partition(" ")
    if (
        not authorization.isascii()
        or scheme.lower() != "bearer"
        or not hmac.compare_digest(token.encode(), api_token.encode())
    ):
        return error_reply(401, "unauthorized", "the bearer token is not valid", **challenge)
    return None


async def _read_json(
    headers: Mapping[str, str], body: bytes | BodyReader, limit: int, *, required: bool
) -> dict[str, Any] | Reply:
    declared = headers.get("content-length")
    if declared is not None:
        try:
            declared_size = int(declared)
        except ValueError:
            return error_reply(400, "invalid-request", "Content-Length is not a number")
        if declared_size > limit:
            return _too_large(limit)
    raw = body if isinstance(body, bytes) else await body()
    if len(raw) > limit:
        return _too_large(limit)
    if not raw.strip():
        if required:
            return error_reply(400, "invalid-json", 'the body is empty; send {"message": "..."}')
        return {}
    try:
        data = _json.loads(raw.decode("utf-8"))
    except _json.JSONTooDeepError:
        return error_reply(
            400,
            "invalid-json",
            f"the body nests arrays and objects deeper than {_json.MAX_DEPTH} levels; "
            'send {"message": "..."}',
        )
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return error_reply(400, "invalid-json", f"the body is not valid JSON: {exc}"[:300])
    if not isinstance(data, dict):
        return error_reply(
            422, "invalid-body", f"the body must be a JSON object, got {_json_type(data)}"
        )
    return data


def _too_large(limit: int) -> Reply:
    return error_reply(413, "body-too-large", f"the body is over {limit:,} bytes (MAX_BODY_BYTES)")


def _json_type(value: Any) -> str:
    names = {bool: "boolean", int: "number", float: "number", str: "string", list: "array"}
    return "null" if value is None else names.get(type(value), "object")


async def serve_dev_stub(
    method: str,
    path: str,
    headers: Mapping[str, str],
    body: bytes | BodyReader,
    stubs: Mapping[str, DevStub],
    query: str = "",
) -> Reply:
    """Answer `/__dev/<NAME>/...` with the stub for setting NAME (see `agent_module`); the
    stub's `path` carries the request's query string (`query`, without "?"), if any."""
    name, _, rest = path[len(DEV_STUB_PREFIX) :].partition("/")
    stub = stubs.get(name)
    if stub is None:
        return error_reply(
            404, "not-found", f"no dev stub for {name[:100]!r}; the agent has {sorted(stubs)}"
        )
    raw = body if isinstance(body, bytes) else await body()
    try:
        _json.check_text_depth(raw)  # a stub may parse it: in a Worker, deep JSON is a crash
    except _json.JSONTooDeepError:
        return error_reply(
            400, "invalid-json", f"the body nests deeper than {_json.MAX_DEPTH} levels"
        )
    try:
        answer = stub(method.upper(), "/" + rest + (f"?{query}" if query else ""), raw, headers)
        result = await answer if inspect.isawaitable(answer) else answer
        status, payload = result
        if not isinstance(status, int) or not 100 <= status <= 599:
            raise TypeError(f"a stub returns (status, json_body), got status {status!r}")
        json.dumps(payload)  # a value that cannot be sent is the stub's bug, said here
    except Exception as exc:
        return internal_error(exc, f"the dev stub for {name}")
    return Reply(status, payload)


def tools_client(timeout: float = HTTP_TIMEOUT_S) -> httpx.AsyncClient:
    """The `http` a Worker hands `make_deps`: over the runtime's `fetch` inside a Worker
    (httpx's own transport needs sockets), httpx's own on CPython. A response whose JSON
    nests deeper than 128 levels raises `httpx.DecodingError` when read (`_http.json_guard`)."""
    transport: httpx.AsyncBaseTransport | None = None
    if sys.platform == "emscripten":
        from .fetch_transport import FetchTransport

        transport = FetchTransport()
    hooks = {"response": [refuse_deep_json]}
    return httpx.AsyncClient(timeout=timeout, transport=transport, event_hooks=hooks)


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
    """
    try:
        if command.action in ("schedule", "schedules", "unschedule"):
            return await _schedules(command, session_id, store, alarm, agent)
        if command.action == "events":
            return await _events(command, session_id, store, live)
        if command.action == "cancel":
            return await _cancel(session_id, live)
        if command.action == "delete":
            found = await store.delete_session(session_id)
            if index is not None:
                found = await index.delete_session(session_id) or found
            if not found:
                return _no_session(session_id)
            return Reply(200, {"session_id": session_id, "deleted": True})
        if command.action == "view":
            return await _view(command, session_id, store)
        if command.action == "history":
            return await _history(command, session_id, store)
        if command.action == "approvals":
            info = await store.get_session(session_id)
            if info is None or info.message_count == 0:
                return _no_session(session_id)
            _, pending = await _last_step(store, session_id, info.message_count)
            return Reply(200, {"session_id": session_id, "pending": [p.to_dict() for p in pending]})
    except SessionNotFoundError:
        return _no_session(session_id)
    except DurableAgentsError as exc:
        return error_for(exc)
    except Exception as exc:
        return internal_error(exc, f"session {session_id}")

    turn = LiveTurn()
    queue = turn.follow() if command.stream else None
    live.waiting.append(turn)

    async def one_turn() -> Reply:
        try:
            async with live.lock:
                live.waiting.remove(turn)
                live.turn = turn
                try:
                    if alarm is not None:
                        await alarm.turn_started(command.origin)
                    reply = await _turn(
                        command, session_id, store, env, agent, llm, make_llm, make_deps,
                        http_client, turn, settings,
                    )  # fmt: skip
                    if alarm is not None and reply.run_status == "deferred":
                        await alarm.turn_continues()
                    elif alarm is not None:
                        # A store down or a bug (a 5xx that is no result), or a toolset
                        # that could not be listed: the mark stays, so the alarm tries the
                        # turn again later (with its back-off; stopped after 3).
                        failed = (
                            reply.status in (500, 503) and reply.run_status is None
                        ) or reply.error_code == "toolset-error"
                        await alarm.turn_ended(store, session_id, keep_watch=failed)
                finally:
                    live.turn = None
                if index is not None:
                    await _mirror(store, index, session_id)
        except BaseException as exc:  # torn down, waiting or mid-turn: followers must not hang
            if turn in live.waiting:
                live.waiting.remove(turn)
            if turn.reply is None:
                turn.end(internal_error(exc, f"session {session_id}"))
            raise
        turn.end(reply)
        return reply

    with invocation(budget):  # the turn's task (and what it starts) counts on it
        task = asyncio.ensure_future(one_turn())
    live.tasks.add(task)
    task.add_done_callback(live.tasks.discard)
    if keep_alive is not None:
        keep_alive(task)
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


async def _turn(
    command: Command,
    session_id: str,
    store: Store,
    env: Any,
    agent: Agent,
    llm: LLM | None,
    make_llm: MakeLLM,
    make_deps: MakeDeps,
    http_client: httpx.AsyncClient | None,
    turn: LiveTurn,
    settings: Sequence[str] = (),
) -> Reply:
    try:
        if command.action == "approve":
            assert command.decision is not None  # from_json guarantees it
            decision = command.decision
            try:
                await approve(
                    store,
                    session_id,
                    str(decision["tool_call_id"]),
                    digest=str(decision["digest"]),
                    approved=bool(decision["approved"]),
                    reason=decision.get("reason"),
                    arguments=decision.get("arguments"),
                    agent=agent,
                )
            except ToolArgumentsError as exc:
                return _invalid_edit(exc, str(decision["tool_call_id"]))
            rest = await pending_approvals(store, session_id)
            if rest:  # the step waits for more decisions
                return Reply(200, _awaiting(session_id, rest))
            command = Command("resume")  # the step's last decision: go on with the turn
        if command.action == "stop":
            result = await stop_turn(
                with_budget(agent, env), store=store, session_id=session_id,
                reason=command.message or "stopped", lease_seconds=None,
            )  # fmt: skip
            return _result_reply(session_id, result)
        return await _run_turn(
            command, session_id, store, env, agent, llm, make_llm, make_deps, http_client,
            on_event=turn.on_event, cancel=turn.cancel, settings=settings,
        )  # fmt: skip
    except SessionNotFoundError:
        return _no_session(session_id)
    except DurableAgentsError as exc:
        return error_for(exc)
    except Exception as exc:
        return internal_error(exc, f"session {session_id}")


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


class SessionIndex(Protocol):
    """Where sessions kept in a Durable Object are listed (the Worker's D1 store)."""

    async def put_session_summary(self, info: SessionInfo) -> None: ...

    async def delete_session(self, session_id: str) -> bool: ...

    async def idle_sessions(self, before_ms: int, *, limit: int = 100) -> list[SessionInfo]: ...


async def _mirror(store: Store, index: SessionIndex, session_id: str) -> None:
    """The session's summary row into the index, once per turn; best effort: a turn is
    never failed by its index (the next turn writes it again)."""
    try:
        info = await store.get_session(session_id)
        if info is not None:
            await index.put_session_summary(info)
    except Exception as exc:
        print(f"durable-agents: the session index was not updated: {exc}", file=sys.stderr)


SESSION_STORES = ("d1", "durable-object")


def session_store_kind(env: Any) -> str:
    """The setting `SESSION_STORE`: "d1" (the default) or "durable-object"."""
    raw = setting(env, "SESSION_STORE")
    kind = "d1" if raw is None or str(raw).strip() == "" else str(raw).strip()
    if kind not in SESSION_STORES:
        raise ConfigurationError(
            f"SESSION_STORE must be one of {', '.join(SESSION_STORES)}, got {raw!r}"
        )
    return kind


def session_stores(env: Any, storage: Any) -> tuple[Store, SessionIndex | None]:
    """A session object's store and index, per `SESSION_STORE`: D1 and no index, or its
    own SQLite (`storage`, the object's `ctx.storage`) with D1 as the index."""
    from .d1 import d1_store
    from .do_store import durable_object_store

    d1 = d1_store(env.DB)
    if session_store_kind(env) == "durable-object":
        return durable_object_store(storage), d1
    return d1, None


def plan_budget(env: Any) -> InvocationBudget:
    """A fresh budget for one invocation, per the setting WORKERS_PLAN (free, the
    default, or paid)."""
    raw = setting(env, "WORKERS_PLAN")
    plan = "free" if raw is None or str(raw).strip() == "" else str(raw).strip()
    if plan not in PLANS:
        raise ConfigurationError(f"WORKERS_PLAN must be free or paid, got {raw!r}")
    return InvocationBudget.for_plan(plan)


async def _prepend(
    first: tuple[str, int | None, bytes] | None, rest: AsyncIterator[bytes]
) -> AsyncIterator[bytes]:
    if first is not None:
        yield first[2]
        if first[0] == "end":
            return
    async for chunk in rest:
        yield chunk


async def _events(command: Command, session_id: str, store: Store, live: LiveSession) -> Reply:
    """GET .../events: the stored messages after `command.after`, then the running turn live
    (also a new session's first turn, before anything of it is stored). The replay reads
    the history a chunk at a time as the client takes it: never all of it at once."""
    turn = live.current
    queue = turn.follow() if turn is not None else None  # first: nothing stored later is missed
    try:
        info = await store.get_session(session_id)
        count = 0 if info is None else info.message_count
        if count == 0 and queue is None:
            return _no_session(session_id)
        idle = None if queue is not None else await _idle_state(session_id, store, count)
    except BaseException:
        if turn is not None and queue is not None:
            turn.unfollow(queue)
        raise
    after = -1 if command.after is None else command.after

    async def replay() -> AsyncIterator[bytes]:
        last = after
        try:
            # No turn running: the messages stored when asked, as `idle` describes them.
            # A turn running: every stored one, then its events (those replayed skipped).
            piece: list[bytes] = []
            size = 0
            async for position, message in _stored(
                store, session_id, after + 1, count if queue is None else None, count
            ):
                event = message_event(position, message.to_dict())
                piece.append(event)
                size += len(event)
                last = position
                if size >= SSE_PIECE_BYTES:
                    yield b"".join(piece)
                    piece, size = [], 0
                if (position - after) % REPLAY_SLICE == 0:
                    await asyncio.sleep(0)  # a long replay must not hold the loop
            if piece:
                yield b"".join(piece)
            if queue is None:
                yield sse("done", idle)
                return
            async for chunk in follow(queue, last):
                yield chunk
        finally:
            if turn is not None and queue is not None:
                turn.unfollow(queue)

    return Reply(200, None, SSE_HEADERS, stream=replay())


async def _stored(
    store: Store, session_id: str, start: int, stop: int | None, count: int
) -> AsyncIterator[tuple[int, Message]]:
    """(position, message) of the stored messages from `start` to `stop` (None: to the end,
    as long as a read comes back full), EVENTS_CHUNK or more a read: `count` (the session's
    size when asked) is read in at most about EVENTS_READS reads."""
    position, reads = start, EVENTS_READS
    while stop is None or position < stop:
        size = max(EVENTS_CHUNK, -(-(count - position) // max(reads, 1)))
        if stop is not None:
            size = min(size, stop - position)
        if reads < EVENTS_READS:
            await asyncio.sleep(REPLAY_PAUSE_S)  # room for the isolate's other requests
        chunk = await store.load_messages(session_id, start=position, limit=size)
        reads -= 1
        for message in chunk:
            yield position, message
            position += 1
        if len(chunk) < size:
            return


async def _last_step(store: Store, session_id: str, count: int) -> tuple[Message | None, list[Any]]:
    """The session's last message and the calls waiting for a decision (`pending_approvals`),
    found from the end of its `count` messages: its last assistant message's calls that
    have no result after it. Read backwards a few messages at a time, never all of them."""
    answered: set[str] = set()
    last: Message | None = None
    end, size = count, 8
    while end > 0:
        start = max(0, end - size)
        chunk = await store.load_messages(session_id, start=start, limit=end - start)
        if not chunk:
            break
        last = last or chunk[-1]
        for message in reversed(chunk):
            if message.role == "assistant":
                calls = [c for c in message.tool_calls if c.id not in answered]
                if not calls:
                    return last, []
                states = approval_states(await store.load_approvals(session_id))
                return last, waiting_calls(session_id, calls, states)
            if message.role == "tool" and message.tool_call_id is not None:
                answered.add(message.tool_call_id)
        end, size = start, min(size * 4, MAX_CHUNK)
    return last, []


async def _idle_state(session_id: str, store: Store, count: int) -> dict[str, Any]:
    """What `done` says when no turn runs: how the last turn was left."""
    body: dict[str, Any] = {"session_id": session_id, "running": False, "response": ""}
    last, pending = await _last_step(store, session_id, count)
    if last is not None and last.is_final_reply:
        body.update(status="complete", response=last.content)
    elif pending:
        body.update(status="awaiting_approval", pending=[p.to_dict() for p in pending])
    else:
        body["status"] = "interrupted"  # a crash, a cancel or a failed LLM call: POST .../resume
    return body


T = TypeVar("T")


def _message_bytes(message: Message) -> int:
    """How many bytes `message` takes in a page's JSON."""
    return len(json.dumps(message.to_dict(), ensure_ascii=False).encode())


def _next_chunk(used: int, taken: int, budget: int) -> int:
    """How many rows to read next: about what is left of `budget` by the sizes so far."""
    average = max(used // max(taken, 1), 1)
    return max(1, min(MAX_CHUNK, (budget - used) // average + 1))


async def _read_forward(
    load: Callable[[int, int], Awaitable[list[T]]], start: int, limit: int, budget: int,
    size: Callable[[T], int],
) -> tuple[list[tuple[int, T]], bool]:  # fmt: skip
    """Up to `limit` (position, item) from position `start` on, read a chunk at a time
    (`load(start, n)`), stopping before the item that takes their `size` past `budget`
    (the first is always taken); and whether more follow."""
    page: list[tuple[int, T]] = []
    used, position, chunk = 0, start, FIRST_CHUNK
    while True:
        want = min(chunk, limit + 1 - len(page))  # one more than the page: is there a next?
        got = await load(position, want)
        for item in got:
            weight = size(item)
            if len(page) == limit or (page and used + weight > budget):
                return page, True
            page.append((position, item))
            used, position = used + weight, position + 1
        if len(got) < want:
            return page, False
        chunk = _next_chunk(used, len(page), budget)


async def _read_backward(
    load: Callable[[int, int], Awaitable[list[T]]], end: int, limit: int, budget: int,
    size: Callable[[T], int],
) -> list[tuple[int, T]]:  # fmt: skip
    """Up to `limit` (position, item) before position `end`, the latest kept: read a chunk
    at a time backwards, stopping before the item that takes their `size` past `budget`
    (the last is always taken)."""
    page: list[tuple[int, T]] = []  # latest first
    used, position, chunk = 0, end, FIRST_CHUNK
    floor = max(0, end - limit)
    while position > floor:
        start = max(floor, position - chunk)
        got = await load(start, position - start)
        for offset in range(len(got) - 1, -1, -1):
            weight = size(got[offset])
            if page and used + weight > budget:
                return page[::-1]
            page.append((start + offset, got[offset]))
            used += weight
        position, chunk = start, _next_chunk(used, len(page), budget)
    return page[::-1]


async def _history(command: Command, session_id: str, store: Store) -> Reply:
    """GET /sessions/{name}: one page of the stored messages, each with its position, and
    `next`, the `after` of the page that follows (null on the last one)."""
    start = 0 if command.after is None else command.after + 1
    page, more = await _read_forward(
        lambda at, n: store.load_messages(session_id, start=at, limit=n),
        start, command.limit or HISTORY_LIMIT, PAGE_BYTES, _message_bytes,
    )  # fmt: skip
    info = await store.get_session(session_id)
    if info is None or info.message_count == 0:
        return _no_session(session_id)
    body = {
        "session_id": session_id,
        "messages": [{"position": p, **m.to_dict()} for p, m in page],
        "next": page[-1][0] if more and page else None,
        "message_count": max(info.message_count, page[-1][0] + 1 if page else 0),
    }
    return Reply(200, body)


async def _view(command: Command, session_id: str, store: Store) -> Reply:
    """GET .../view: one page of the session's timeline, an HTML page a person reads: the
    latest messages, or those after `command.after` or before `command.before`, with
    links to the pages around it."""
    from ..timeline import TimelinePage, render_timeline

    info = await store.get_session(session_id)
    if info is None or info.message_count == 0:
        return _no_session(session_id)
    count, limit = info.message_count, command.limit or VIEW_LIMIT

    def load(at: int, n: int) -> Awaitable[list[tuple[int, Message]]]:
        return store.load_timeline(session_id, start=at, limit=n)

    def size(entry: tuple[int, Message]) -> int:
        return _message_bytes(entry[1])

    if command.after is not None:
        first = command.after + 1
        rows, more = await _read_forward(load, first, limit, VIEW_PAGE_BYTES, size)
    else:
        first = count if command.before is None else min(command.before, count)
        rows = await _read_backward(load, first, limit, VIEW_PAGE_BYTES, size)
        more = False
    if rows:
        first, last = rows[0][0], rows[-1][0]
        more = more or last + 1 < count
    shown = f"&limit={limit}"
    links: dict[str, str] = {}
    if rows and first > 0:
        links["first"] = f"?before={min(limit, first)}{shown}"
        links["older"] = f"?before={first}{shown}"
    if rows and more:
        links["newer"] = f"?after={last}{shown}"
    if more or not rows:
        links["latest"] = f"?limit={limit}"
    following: list[tuple[int, Message]] = []
    if rows and more:  # the results of the page's last calls, stored after it
        asked = {c.id for _, (_, m) in rows for c in m.tool_calls}
        asked -= {m.tool_call_id for _, (_, m) in rows if m.role == "tool"}
        if asked:
            after = await store.load_messages(session_id, start=last + 1, limit=len(asked) + 2)
            following = [(last + 1 + i, m) for i, m in enumerate(after)]
    page = render_timeline(
        name=command.name or info.name or session_id,
        session_id=session_id,
        agent=info.agent_name,
        entries=[entry for _, entry in rows],
        approvals=await store.load_approvals(session_id),
        page=TimelinePage(first, links, following),
        session=info,
    )
    return Reply(200, None, _HTML, text=page)


_ALARM_TURNS = {"resume": "self-resumed", "message": "scheduled", "stop": "stopped"}


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
        command = Command(
            action,  # type: ignore[arg-type]  # one of _ALARM_TURNS
            message=fields.get("message") or fields.get("reason"),
            request_key=fields.get("request_key"),
            origin=_ALARM_TURNS[action],
        )
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


async def _schedules(
    command: Command, session_id: str, store: Store, alarm: ObjectAlarm | None, agent: Agent
) -> Reply:
    """List, make or cancel the session's schedules (see `durable_agents.schedules`);
    then arm the object's alarm for the earliest."""
    if command.action == "schedules":
        found = await store.load_schedules(session_id)
        if not found and await store.get_session(session_id) is None:
            return _no_session(session_id)
        return Reply(200, {"session_id": session_id, "schedules": [s.to_dict() for s in found]})
    if command.action == "unschedule":
        assert command.schedule_id is not None  # from_json guarantees it
        if not await store.delete_schedule(session_id, command.schedule_id):
            return error_reply(
                404, "schedule-not-found",
                f"session {session_id} has no schedule {command.schedule_id!r} waiting (it ran "
                "already, was cancelled, or never was)",
            )  # fmt: skip
        if alarm is not None:
            await alarm.arm(store, session_id)
        return Reply(200, {"schedule_id": command.schedule_id, "deleted": True})
    assert command.schedule is not None  # from_json guarantees it
    if alarm is None:
        return error_for(ConfigurationError("this session's object has no alarm to fire schedules"))
    info = await store.get_session(session_id)
    if info is None or info.message_count == 0:
        return _no_session(session_id)
    try:
        (await room_left(store, session_id)).take()
    except ScheduleError as exc:
        return error_for(exc)  # 422 invalid-schedule
    spec = command.schedule
    made = new_schedule(
        str(spec["message"]),
        schedule_id=f"sch_{uuid.uuid4().hex}",
        now_ms=alarm.now_ms(),
        delay_seconds=spec.get("delay_seconds"),
        at=spec.get("at"),
        max_message_bytes=agent.max_message_bytes,
    )
    await store.append_messages_atomic(session_id, info.message_count, [], schedules=[made])
    await alarm.arm(store, session_id)
    return Reply(201, {"session_id": session_id, **made.to_dict()})


async def _cancel(session_id: str, live: LiveSession) -> Reply:
    turn = live.current
    if turn is None:
        return error_reply(
            409, "no-turn-running", f"no turn of session {session_id} is running; nothing to cancel"
        )
    turn.cancel.cancel("cancelled by POST /cancel")
    await asyncio.shield(turn.ended.wait())
    assert turn.reply is not None  # set before `ended`
    return turn.reply


async def _run_turn(
    command: Command,
    session_id: str,
    store: Store,
    env: Any,
    agent: Agent,
    llm: LLM | None,
    make_llm: MakeLLM,
    make_deps: MakeDeps,
    http_client: httpx.AsyncClient | None,
    *,
    on_event: OnEvent | None = None,
    cancel: CancelToken | None = None,
    settings: Sequence[str] = (),
) -> Reply:
    async with contextlib.AsyncExitStack() as owned:  # closes what this turn opened, all of it
        model = llm if llm is not None else make_llm(env)
        if llm is None and hasattr(model, "aclose"):
            owned.push_async_callback(model.aclose)
        client = http_client
        if client is None:
            client = tools_client()
            owned.push_async_callback(client.aclose)
        result = await run(
            with_budget(agent, env),
            llm=model,
            message=command.message,
            session_id=session_id,
            session_name=command.name,
            store=store,
            deps=make_deps(env, client),
            request_key=command.request_key,
            # The Durable Object runs one turn at a time per session (its lock)
            # and is the only runner of its session: no lease, no extra D1 write.
            lease_seconds=None,
            on_event=on_event,
            cancel=cancel,
            origin=command.origin,  # type: ignore[arg-type]  # the object's own: checked by run
            # the settings the agent module names (its toolsets' too), and the tools' client
            settings={
                name: str(value)
                for name in (*settings, *agent.settings)
                if (value := setting(env, name)) is not None
            },
            http=client,
        )
    return _result_reply(session_id, result)


def _result_reply(session_id: str, result: RunResult) -> Reply:
    """A turn's result as the API answers it: 200, or 502 for status "error"."""
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
    if result.status == "error" and result.error_code == "turn-stopped":
        body["error"] = {"code": "turn-stopped", "message": result.error}
        return Reply(502, body)
    if result.status == "error":
        code = result.error_code or "llm-error"
        what = f"the LLM call failed ({result.error})" if code == "llm-error" else result.error
        message = (
            f"{what}; the session is intact and keeps your message: POST .../resume to ask "
            "the model again, or send a new message"
        )
        body["error"] = {"code": code, "message": message}
        return Reply(502, body)
    if result.status == "budget_exceeded":
        body["error"] = {"code": "budget-exceeded", "message": result.error}
    if result.status == "deferred":  # the object goes on with it: GET .../events follows
        return Reply(202, body)
    return Reply(200, body)


def with_budget(agent: Agent, env: Any) -> Agent:
    """`agent` with the Worker's `MAX_SESSION_TOKENS` and `MAX_CONTEXT_TOKENS` settings as
    its `max_session_tokens` and `max_context_tokens`, when set (they win over the
    agent's own)."""
    changes: dict[str, Any] = {}
    for name, field_name in (
        ("MAX_SESSION_TOKENS", "max_session_tokens"), ("MAX_CONTEXT_TOKENS", "max_context_tokens"),
    ):  # fmt: skip
        raw = setting(env, name)
        if raw is None or str(raw).strip() == "":
            continue
        text = str(raw).strip()
        if not text.isascii() or not text.isdigit() or int(text) < 1:
            raise ConfigurationError(f"{name} must be a positive integer, got {raw!r}")
        changes[field_name] = int(text)
    return dataclasses.replace(agent, **changes) if changes else agent


# D1 counts every statement against a Worker invocation's query limit (50 on the free
# plan): a retention run deletes at most this many batches of sessions.
RETENTION_BATCH = 100
RETENTION_MAX_BATCHES = 8
RETENTION_OBJECTS = 40  # with SESSION_STORE = "durable-object": one subrequest each


async def run_retention(
    store: Any,
    env: Any,
    now: float | None = None,
    *,
    delete_object: Callable[[SessionInfo], Awaitable[Any]] | None = None,
) -> int:
    """The cron's work: delete the sessions idle for more than `RETENTION_DAYS` (unset or
    empty: keep everything), up to RETENTION_BATCH x RETENTION_MAX_BATCHES per run, each
    batch one atomic write. `now`: Unix seconds (default: the clock, read now). Returns
    how many were deleted.

    With `delete_object` (SESSION_STORE = "durable-object"), `store` is the D1 index:
    up to RETENTION_OBJECTS idle sessions are found there and each is deleted by its own
    Durable Object (`delete_object(info)`: one subrequest each, so few per run)."""
    now = time.time() if now is None else now
    raw = setting(env, "RETENTION_DAYS")
    if raw is None or str(raw).strip() == "":
        return 0
    try:
        days = float(str(raw))
    except ValueError:
        days = 0
    if not days > 0:
        raise ConfigurationError(f"RETENTION_DAYS must be a positive number, got {raw!r}")
    # A days count past any stored time (RETENTION_DAYS=1e300, inf) keeps everything.
    before_ms = int(max(-MAX_BOUND_INT, min(MAX_BOUND_INT, (now - days * 86400) * 1000)))
    deleted = 0
    if delete_object is not None:
        for info in await store.idle_sessions(before_ms, limit=RETENTION_OBJECTS):
            await delete_object(info)
            deleted += 1
        return deleted
    for _ in range(RETENTION_MAX_BATCHES):
        count = await store.delete_idle(before_ms, limit=RETENTION_BATCH)
        deleted += count
        if count < RETENTION_BATCH:
            break
    return deleted


def _awaiting(session_id: str, pending: list[Any]) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "status": "awaiting_approval",
        "pending": [p.to_dict() for p in pending],
    }


def _no_session(session_id: str) -> Reply:
    return error_for(
        SessionNotFoundError(session_id),
        f"session {session_id} has no history; POST /sessions/{{name}}/messages starts it",
    )
