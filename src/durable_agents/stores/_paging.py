"""Paging `list_sessions`: the opaque cursor after a session, and the statement of one
page. Guide: docs/python-api.md.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence

from ..errors import InvalidCursorError
from ._limits import MAX_BOUND_INT, Statement, bound_limit
from ._statements import (
    LIST_AGENT_SESSIONS,
    LIST_FIRST_AGENT_SESSIONS,
    LIST_FIRST_SESSIONS,
    LIST_SESSIONS,
)
from .base import SessionInfo

# Above every stored (created_at, id), for the in-memory store (the SQL stores
# list their first page with LIST_FIRST_SESSIONS): no stored time exceeds
# MAX_BOUND_INT, and no id sorts after U+10FFFF.
_FIRST_PAGE: tuple[int, str] = (MAX_BOUND_INT + 1, "\U0010ffff")


def list_statement(cursor: str | None, limit: int, agent_name: str | None = None) -> Statement:
    """The statement of one `list_sessions` page: `limit + 1` rows (one more tells
    whether a next page exists), after `cursor`'s keys, or from the newest; only the
    sessions of `agent_name` when given."""
    fetch = min(bound_limit(limit), MAX_BOUND_INT - 1) + 1
    if cursor is None:
        if agent_name is not None:
            return LIST_FIRST_AGENT_SESSIONS, (agent_name, fetch)
        return LIST_FIRST_SESSIONS, (fetch,)
    created_at, last_id = decode_cursor(cursor)
    if agent_name is not None:
        return LIST_AGENT_SESSIONS, (agent_name, created_at, last_id, fetch)
    return LIST_SESSIONS, (created_at, last_id, fetch)


def encode_cursor(info: SessionInfo) -> str:
    """The opaque cursor after `info`: url-safe base64 of its JSON [created_at, id]."""
    return encode_cursor_keys(info.created_at, info.id)


def decode_cursor(cursor: str | None) -> tuple[int, str]:
    """The (created_at, id) a cursor stands for (above every row for None);
    anything `encode_cursor` did not make raises `InvalidCursorError`."""
    if cursor is None:
        return _FIRST_PAGE
    try:
        if not isinstance(cursor, str) or not cursor or len(cursor) > 4096:
            raise ValueError("not a cursor")
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, session_id = json.loads(raw.decode())
        if (
            isinstance(created_at, bool)
            or not isinstance(created_at, int)
            or not isinstance(session_id, str)
            or not 0 <= created_at <= MAX_BOUND_INT
        ):
            raise ValueError("not a cursor")
        if encode_cursor_keys(created_at, session_id) != cursor:
            raise ValueError("not a cursor")  # only the kit's own spelling is one
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise InvalidCursorError(cursor) from None
    return created_at, session_id


def encode_cursor_keys(created_at: int, session_id: str) -> str:
    raw = json.dumps([created_at, session_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def page_of(infos: Sequence[SessionInfo], limit: int) -> tuple[list[SessionInfo], str | None]:
    """A page from up to `limit + 1` rows: the first `limit`, and a cursor if more follow."""
    page = list(infos[:limit])
    return page, encode_cursor(page[-1]) if len(infos) > limit else None
