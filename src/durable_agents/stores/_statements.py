"""The SQL statements every SQL store runs (SQLite, D1, a Durable Object's SQLite),
and the parameters of those that need more than their values in order.

Every statement uses `?` placeholders, which both sqlite3 and D1 accept, and binds
at most 14 parameters (D1 allows 100). The packed statements of a big append are
in `_appends.py`; the schema they run on is `migrations/*.sql` (`_schema.py`).
Guide: docs/contract.md.
"""

from __future__ import annotations

from typing import Any

from ._limits import MAX_BOUND_INT, bindable, bound_limit, clamp_int
from ._rows import encode_arguments
from .base import ApprovalChange, Lease

INSERT_MESSAGE = (
    "INSERT INTO agent_messages (session_id, seq, role, content, tool_call_id, tool_name, "
    "tool_calls, input_tokens, output_tokens, request_key, summary_of, origin, instructions, "
    "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)

# Created on first write (with its name, never changed after); later writes
# refresh it and add their messages' usage to the totals. Upsert, not
# read-modify-write.
UPSERT_SESSION = (
    "INSERT INTO agent_sessions (id, agent_name, state, message_count, created_at, updated_at, "
    "name, input_tokens, output_tokens) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
    "agent_name = COALESCE(excluded.agent_name, agent_sessions.agent_name), "
    "state = excluded.state, message_count = excluded.message_count, "
    "updated_at = excluded.updated_at, "
    "input_tokens = agent_sessions.input_tokens + excluded.input_tokens, "
    "output_tokens = agent_sessions.output_tokens + excluded.output_tokens"
)

MESSAGE_COLUMNS = (
    "role, content, tool_call_id, tool_name, tool_calls, input_tokens, output_tokens, "
    "request_key, summary_of, origin, instructions"
)
SELECT_MESSAGES = f"SELECT {MESSAGE_COLUMNS} FROM agent_messages WHERE session_id = ? ORDER BY seq"
# Params (session_id, start, limit): `limit` messages from position `start` on.
SELECT_MESSAGES_FROM = (
    f"SELECT {MESSAGE_COLUMNS} FROM agent_messages WHERE session_id = ? AND seq >= ? "
    "ORDER BY seq LIMIT ?"
)
# Params (session_id, session_id): the position the latest summary's tail begins
# at (0 without one), then every message from there. Two index look-ups, however
# long the history.
_CONTEXT_START = (
    "SELECT COALESCE((SELECT summary_of FROM agent_messages WHERE session_id = ? "
    "AND summary_of IS NOT NULL ORDER BY seq DESC LIMIT 1), 0)"
)
SELECT_CONTEXT = (
    f"SELECT seq, {MESSAGE_COLUMNS} FROM agent_messages WHERE session_id = ? "
    f"AND seq >= ({_CONTEXT_START}) ORDER BY seq"
)
# Params (session_id, request_key): the user message stored with that key, if any.
FIND_REQUEST = "SELECT seq, content FROM agent_messages WHERE session_id = ? AND request_key = ?"
# Params (session_id, start, limit), as SELECT_MESSAGES_FROM's: each with its created_at.
SELECT_TIMELINE = (
    f"SELECT {MESSAGE_COLUMNS}, created_at FROM agent_messages WHERE session_id = ? "
    "AND seq >= ? ORDER BY seq LIMIT ?"
)
# The index row of a session kept elsewhere (a Durable Object's own SQLite): its summary,
# mirrored into D1 once per turn so listing, the timeline's lookup and retention see it.
PUT_SESSION_SUMMARY = (
    "INSERT INTO agent_sessions (id, agent_name, state, message_count, created_at, updated_at, "
    "name, input_tokens, output_tokens) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (id) DO UPDATE SET agent_name = excluded.agent_name, state = excluded.state, "
    "message_count = excluded.message_count, updated_at = excluded.updated_at, "
    "name = COALESCE(agent_sessions.name, excluded.name), "
    "input_tokens = excluded.input_tokens, output_tokens = excluded.output_tokens"
)

SESSION_COLUMNS = (
    "id, agent_name, state, message_count, created_at, updated_at, name, input_tokens, "
    "output_tokens"
)
SELECT_SESSION = f"SELECT {SESSION_COLUMNS} FROM agent_sessions WHERE id = ?"
# Newest created first, by keys no write changes: a page's cursor is the last
# row's (created_at, id). The first page has no bound: binding one "above every
# row" would need an integer no store can bind (see MAX_BOUND_INT).
LIST_SESSIONS = (
    f"SELECT {SESSION_COLUMNS} FROM agent_sessions WHERE (created_at, id) < (?, ?) "
    "ORDER BY created_at DESC, id DESC LIMIT ?"
)
LIST_FIRST_SESSIONS = (
    f"SELECT {SESSION_COLUMNS} FROM agent_sessions ORDER BY created_at DESC, id DESC LIMIT ?"
)
# The same, of one agent's sessions (by agent_name): a Worker serving several agents.
LIST_AGENT_SESSIONS = (
    f"SELECT {SESSION_COLUMNS} FROM agent_sessions WHERE agent_name = ? AND "
    "(created_at, id) < (?, ?) ORDER BY created_at DESC, id DESC LIMIT ?"
)
LIST_FIRST_AGENT_SESSIONS = (
    f"SELECT {SESSION_COLUMNS} FROM agent_sessions WHERE agent_name = ? "
    "ORDER BY created_at DESC, id DESC LIMIT ?"
)
FIND_SESSIONS = (
    f"SELECT {SESSION_COLUMNS} FROM agent_sessions WHERE name = ? ORDER BY created_at DESC, id DESC"
)
DELETE_MESSAGES = "DELETE FROM agent_messages WHERE session_id = ?"
DELETE_LEASE = "DELETE FROM agent_leases WHERE session_id = ?"

# Take the lease if it is free, expired, already ours, or held by `?` (an owner
# known to be dead). One statement: changes() is 1 if taken, 0 if not.
ACQUIRE_LEASE = (
    "INSERT INTO agent_leases (session_id, owner, expires_at) VALUES (?, ?, ?) "
    "ON CONFLICT (session_id) DO UPDATE SET owner = excluded.owner, "
    "expires_at = excluded.expires_at WHERE agent_leases.owner = excluded.owner "
    "OR agent_leases.expires_at <= ? OR agent_leases.owner = ?"
)
SELECT_LEASE = "SELECT owner, expires_at FROM agent_leases WHERE session_id = ?"
RENEW_LEASE = "UPDATE agent_leases SET expires_at = ? WHERE session_id = ? AND owner = ?"
RELEASE_LEASE = "DELETE FROM agent_leases WHERE session_id = ? AND owner = ?"
DELETE_SESSION = "DELETE FROM agent_sessions WHERE id = ?"
DELETE_APPROVALS = "DELETE FROM agent_approvals WHERE session_id = ?"
DELETE_SCHEDULES = "DELETE FROM agent_schedules WHERE session_id = ?"

_SCHEDULE_COLUMNS = "schedule_id, message, due_at, created_at, rule"
INSERT_SCHEDULE = (
    f"INSERT INTO agent_schedules (session_id, {_SCHEDULE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)"
)
SELECT_SCHEDULES = (
    f"SELECT {_SCHEDULE_COLUMNS} FROM agent_schedules WHERE session_id = ? "
    "ORDER BY due_at, schedule_id"
)
DELETE_SCHEDULE = "DELETE FROM agent_schedules WHERE session_id = ? AND schedule_id = ?"
# Params (session_id, request_key): the schedule a scheduled turn's user message fires,
# by its key (`Schedule.request_key`, as migration 0008's trigger matches it): a one-off
# schedule's, or a recurring one's current occurrence.
DELETE_FIRED_SCHEDULE = (
    "DELETE FROM agent_schedules WHERE session_id = ? AND 'schedule:' || schedule_id || "
    "CASE WHEN rule IS NULL THEN '' ELSE '@' || due_at END = ?"
)
# Params (before_ms, limit): due schedules of every session, earliest first.
SELECT_DUE_SCHEDULES = (
    f"SELECT session_id, {_SCHEDULE_COLUMNS} FROM agent_schedules WHERE due_at < ? "
    "ORDER BY due_at, session_id, schedule_id LIMIT ?"
)
# Params (now_ms, limit): the leases that expired, (session_id, owner, expires_at), longest
# expired first: their turn's process died. The second, params (now_ms, len(prefix),
# prefix, limit), also lists the unexpired leases whose owner begins with `prefix` (a
# host's, "host/"), after those: the caller checks which of their processes are gone.
SELECT_EXPIRED_LEASES = (
    "SELECT session_id, owner, expires_at FROM agent_leases WHERE expires_at <= ? "
    "ORDER BY expires_at LIMIT ?"
)
SELECT_EXPIRED_OR_HOST_LEASES = (
    "SELECT session_id, owner, expires_at FROM agent_leases WHERE expires_at <= ? "
    "OR substr(owner, 1, ?) = ? ORDER BY expires_at LIMIT ?"
)

# delete_idle: up to `?` sessions idle since before `?`, oldest first. Every
# statement picks the same sessions (the session rows go last), so the four
# run as one transaction (SQLite) or one batch (D1) with no read before them;
# the last one's change count is how many sessions were deleted.
_IDLE = "SELECT id FROM agent_sessions WHERE updated_at < ? ORDER BY updated_at, id LIMIT ?"
SELECT_IDLE = (
    f"SELECT {SESSION_COLUMNS} FROM agent_sessions WHERE updated_at < ? "
    "ORDER BY updated_at, id LIMIT ?"
)
DELETE_IDLE: tuple[str, ...] = (
    f"DELETE FROM agent_messages WHERE session_id IN ({_IDLE})",
    f"DELETE FROM agent_leases WHERE session_id IN ({_IDLE})",
    f"DELETE FROM agent_approvals WHERE session_id IN ({_IDLE})",
    f"DELETE FROM agent_schedules WHERE session_id IN ({_IDLE})",
    f"DELETE FROM agent_sessions WHERE id IN ({_IDLE})",
)

APPROVAL_COLUMNS = "session_id, tool_call_id, event, tool_name, digest, reason, created_at"
# A request carries no edited arguments: their columns stay NULL.
REQUEST_APPROVAL = f"INSERT INTO agent_approvals ({APPROVAL_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)"
_OF_EVENT = "FROM agent_approvals WHERE session_id = ? AND tool_call_id = ? AND event = ?"
# A decision needs the request with the same digest; a claim needs an approval. An
# approval may carry the approver's edited arguments (JSON) and their digest.
DEPENDENT_APPROVAL = (
    f"INSERT INTO agent_approvals ({APPROVAL_COLUMNS}, arguments, arguments_digest) "
    f"VALUES (?, ?, ?, (SELECT tool_name {_OF_EVENT} AND digest = ?), ?, ?, ?, ?, ?)"
)
SELECT_APPROVALS = (
    "SELECT tool_call_id, event, tool_name, digest, reason, created_at, arguments, "
    "arguments_digest FROM agent_approvals WHERE session_id = ? ORDER BY rowid"
)


def page_params(session_id: str, start: int, limit: int | None) -> tuple[Any, ...]:
    """SELECT_MESSAGES_FROM's (and SELECT_TIMELINE's) parameters: a negative start is 0,
    no limit is every row."""
    bound = MAX_BOUND_INT if limit is None else clamp_int(max(limit, 0))
    return (session_id, clamp_int(max(start, 0)), bound)


def idle_params(before_ms: int, limit: int) -> tuple[int, int]:
    """The (before_ms, limit) of SELECT_IDLE and DELETE_IDLE, clamped to what any store
    can bind: every stored time is within ±MAX_BOUND_INT, so the rows picked are the same."""
    return clamp_int(before_ms), bound_limit(limit)


def acquire_lease_params(
    session_id: str, owner: str, now_ms: int, ttl_ms: int, take_from: str | None
) -> tuple[Any, ...]:
    """A lease until `now_ms + ttl_ms`: an expiry beyond what a store binds is held there."""
    bindable(now_ms, "the time of the lease (Unix ms)", session_id)
    return (session_id, owner, clamp_int(now_ms + ttl_ms), now_ms, take_from)


def lease_statement(
    session_id: str, lease: Lease | None, now_ms: int
) -> tuple[str, tuple[Any, ...]] | None:
    """The statement an append runs for its lease: renew it, or release it."""
    if lease is None:
        return None
    if lease.release:
        return RELEASE_LEASE, (session_id, lease.owner)
    return RENEW_LEASE, (clamp_int(now_ms + lease.ttl_ms), session_id, lease.owner)


def approval_statement(
    session_id: str, change: ApprovalChange, now_ms: int
) -> tuple[str, tuple[Any, ...]]:
    """The statement that records one approval change (its conditions: see `_schema`, 0003)."""
    if change.event == "requested":
        return REQUEST_APPROVAL, (
            session_id, change.tool_call_id, "requested", change.tool_name, change.digest,
            None, now_ms,
        )  # fmt: skip
    depends_on = "approved" if change.event == "claimed" else "requested"
    return DEPENDENT_APPROVAL, (
        session_id, change.tool_call_id, change.event,
        session_id, change.tool_call_id, depends_on, change.digest,
        change.digest, change.reason, now_ms,
        encode_arguments(change.arguments), change.arguments_digest,
    )  # fmt: skip


def is_approval_conflict(error_text: str) -> bool:
    """Whether a failed append broke an approval's condition (decided or claimed
    already, or what it depends on is missing)."""
    text = error_text.lower()
    return "constraint failed: agent_approvals" in text


def is_conflict(error_text: str) -> bool:
    """Whether a failed append lost a race (vs. a real failure), from the engine's message."""
    text = error_text.lower()
    return (
        "unique constraint failed: agent_messages" in text
        or "seq must directly follow" in text
        or "schedule was cancelled" in text
    )
