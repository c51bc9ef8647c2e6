"""What crosses HTTP: the answer type (`Reply`), the one error shape, error codes -> statuses.

Every room of the Worker's API (the routes, the Durable Object's turns and reads,
`live.py`'s streams) answers with a `Reply`; they share it from here, so none of
them imports another for it. The error codes and statuses a client sees are listed
in docs/http-api.md#errors.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import _json
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

__all__ = [
    "ERROR_STATUS",
    "HTML_HEADERS",
    "JSON_HEADERS",
    "SSE_HEADERS",
    "Reply",
    "error_for",
    "error_reply",
    "internal_error",
    "no_session",
]

JSON_HEADERS = {"content-type": "application/json"}
SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}
HTML_HEADERS = {"content-type": "text/html; charset=utf-8", "cache-control": "no-cache"}

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
        return {**JSON_HEADERS, **self.headers}

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


def internal_error(exc: BaseException, where: str) -> Reply:
    """A 500 for an unexpected failure: its type and text; the traceback goes to the log."""
    traceback.print_exception(exc, file=sys.stderr)
    detail = f"{type(exc).__name__}: {exc}"[:500]
    return error_reply(500, "internal", f"{where} failed unexpectedly: {detail}")


def no_session(session_id: str) -> Reply:
    """404 `session-not-found`: the session has no history yet."""
    return error_for(
        SessionNotFoundError(session_id),
        f"session {session_id} has no history; POST /sessions/{{name}}/messages starts it",
    )
