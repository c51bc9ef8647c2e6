"""The Worker's HTTP API as plain Python, in one import: what `src/entry.py` wires up.

`src/entry.py` is a thin shell around the two halves, so everything an HTTP
client can get wrong is decided, and unit-tested, on CPython:

    Worker (Default.fetch)                       Durable Object (AgentSession.fetch)
    handle_request(method, path, headers, body)  ──Command──►  serve_session(command, ...)
      routes.py: settings, auth, the route            session_object.py: the command's
      table, bodies -> 4xx, nothing written           handler: turns, reads, schedules

Each concern is a module of its own: `routes.py` (the table and its handlers),
`routing.py` (the table's machinery), `bodies.py` (request bodies), `commands.py`
(the Worker -> object commands), `wire.py` (`Reply`, errors -> statuses), `auth.py`,
`session_object.py`, `turns.py`, `reads.py`, `schedules_api.py`, `retention.py`,
`config.py`, `dev_stubs.py`. The endpoints, bodies, answers and errors are in
docs/http-api.md; the layout in docs/architecture.md.
"""

from __future__ import annotations

from .auth import MASTER, authorize
from .commands import REQUEST_KEY, SESSION_NAME, Command
from .config import (
    DEFAULT_MAX_BODY_BYTES,
    ApiSettings,
    plan_budget,
    session_store_kind,
    session_stores,
    tools_client,
    with_budget,
)
from .dev_stubs import serve_dev_stub
from .live import LiveSession
from .retention import run_retention
from .routes import handle_request
from .session_object import serve_session
from .turns import resume_left_turn, serve_alarm
from .wire import ERROR_STATUS, SSE_HEADERS, Reply, error_for, error_reply, internal_error

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
