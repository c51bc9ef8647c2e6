"""The one SQL source shared by the SQLite store and the D1 store.

`migrations/` is this module's `MIGRATIONS` written out, one file each (a test
keeps them equal); `SCHEMA` is all of them in order. Every statement but a
migration's `ALTER TABLE ... ADD COLUMN` and its backfill is idempotent;
`schema_plan()` leaves those out for a database that has the column already,
which is what the SQLite store (and `D1Store.create_tables`) run on open.
Every statement uses `?` placeholders, which both sqlite3 and D1 accept, and
binds at most 14 parameters (D1 allows 100): a packed statement binds the same
few however many columns its rows have.

Why a big append packs its rows: D1 counts every statement of a batch as one
of the queries a Worker invocation may make (50 on Workers Free, 1,000 on
Paid), so one INSERT per message made a step of 1,000 tool calls a batch of
1,002 statements, past what D1 takes, which the miniflare D1 of `scripts/dev`
ran all the same. An append of more than MAX_BATCH_STATEMENTS statements has
its messages (and approval events) travel as JSON arrays instead, each bound
to one parameter of an INSERT ... SELECT FROM json_each(?): a few statements
whatever the row count. Every append and every statement D1 or a Durable
Object runs is checked against D1's limits first (`check_batch`,
`check_statement`), so a local run fails where Cloudflare would.

Why the schema itself guards the history: rows are insert-only and keyed by
(session_id, seq). The UNIQUE key makes a writer that lost a race collide; the
trigger makes a writer whose view is stale the other way (the session was
deleted or shortened under it) fail too, so an append at `expected_seq` lands
only if exactly `expected_seq` rows precede it: a compare-and-swap made of
constraints, which is all a D1 batch (no BEGIN, no reads inside) can offer.
The partial unique indexes are the last line of defence for "one result per
tool call" and "one turn per request key".
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from .. import _json
from ..errors import (
    ConfigurationError,
    InvalidCursorError,
    MessageTooLargeError,
    SessionConflictError,
    StoreError,
)
from ..limits import MAX_ROW_BYTES
from ..messages import Message, Usage, decode_tool_calls, encode_tool_calls
from .base import ApprovalChange, ApprovalEvent, Lease, Schedule, SessionInfo

# The largest magnitude of an integer any statement binds. On Workers a Python int
# reaches JavaScript (D1's `bind`, a Durable Object's `sql.exec`) as a Number only if
# |n| < 2**53 - 1: Pyodide's test is strict, so Number.MAX_SAFE_INTEGER itself arrives
# as a BigInt, and both refuse a BigInt (D1: "D1_TYPE_ERROR: Type 'bigint' not
# supported for value ..."; Durable Object SQL: "TypeError: Cannot convert a BigInt
# value to a number"). Every store keeps to the same range, so what one stores, any
# other can. Measured on workerd by tests/cloudflare/test_workerd_behaviour.py.
MAX_BOUND_INT = 2**53 - 2


def clamp_int(value: int) -> int:
    """`value` within ±MAX_BOUND_INT (for bounds, where the rows picked stay the same)."""
    return max(-MAX_BOUND_INT, min(MAX_BOUND_INT, value))


def bindable(value: int, what: str, session_id: str | None = None) -> int:
    """`value` if every store can bind it; else a `StoreError` that names it."""
    if -MAX_BOUND_INT <= value <= MAX_BOUND_INT:
        return value
    where = "" if session_id is None else f"session {session_id!r}: "
    raise StoreError(
        f"{where}{what} is {value}, beyond ±{MAX_BOUND_INT}, the integers D1 and Durable "
        "Object SQL can bind (a larger Python int reaches them as a JavaScript BigInt, "
        "which they refuse); nothing was written",
        session_id=session_id,
    )


# D1's limits on one statement, which hold for each statement of a batch too
# (developers.cloudflare.com/d1/platform/limits) and which a Durable Object's SQLite
# shares: bound parameters, bytes of SQL text, and bytes of one string or BLOB value.
# And the statements of one batch: D1 counts each as a query of the invocation, and
# a Worker invocation on Workers Free may make 50 (on Paid, 1,000). Local workerd
# refuses the first two; miniflare's D1 takes an over-long value and any batch, and
# SQLite on CPython takes everything, so `check_statement` and `check_batch` do the
# refusing on every backend, before anything is written.
MAX_BOUND_PARAMS = 100
MAX_SQL_BYTES = 100_000
MAX_VALUE_BYTES = 2_000_000
MAX_BATCH_STATEMENTS = 50

Statement = tuple[str, tuple[Any, ...]]

_TABLE = re.compile(r"(?:INTO|UPDATE|FROM)\s+(\w+)")


def _statement_name(sql: str) -> str:
    table = _TABLE.search(sql)  # only to name the statement in an error
    return repr(table[1] if table else sql[:40])


def _text_bytes(value: str) -> int:
    # A lone surrogate is counted, not refused: what binding does with it is each
    # backend's own business, as it was before the count.
    return len(value.encode("utf-8", "surrogatepass"))


def check_statement(sql: str, params: Sequence[Any], session_id: str | None = None) -> None:
    """`StoreError` if one statement is past a D1 limit on statements (see MAX_BOUND_PARAMS)."""
    problem = None
    if len(params) > MAX_BOUND_PARAMS:
        problem = f"binds {len(params)} parameters (D1 allows {MAX_BOUND_PARAMS})"
    elif len(sql) * 4 > MAX_SQL_BYTES and _text_bytes(sql) > MAX_SQL_BYTES:
        problem = f"is {_text_bytes(sql)} bytes of SQL (D1 allows {MAX_SQL_BYTES})"
    else:
        for value in params:
            size = (
                _text_bytes(value) if isinstance(value, str) and len(value) * 4 > MAX_VALUE_BYTES
                else len(value) if isinstance(value, bytes) else 0
            )  # fmt: skip
            if size > MAX_VALUE_BYTES:
                problem = f"binds a value of {size} bytes (D1 allows {MAX_VALUE_BYTES})"
                break
    if problem is not None:
        where = "" if session_id is None else f"session {session_id!r}: "
        raise StoreError(
            f"{where}the statement on {_statement_name(sql)} {problem}; nothing was written",
            session_id=session_id,
        )


def check_batch(statements: Sequence[Statement], session_id: str | None = None) -> list[Statement]:
    """`statements` if D1 would run them as one batch (see MAX_BATCH_STATEMENTS), each
    checked by `check_statement`; else `StoreError`."""
    if len(statements) > MAX_BATCH_STATEMENTS:
        where = "" if session_id is None else f"session {session_id!r}: "
        raise StoreError(
            f"{where}one write needs {len(statements)} statements, more than the "
            f"{MAX_BATCH_STATEMENTS} D1 runs in one batch; nothing was written",
            session_id=session_id,
        )
    for sql, params in statements:
        check_statement(sql, params, session_id)
    return list(statements)


def bound_params(sql: str, params: Sequence[Any], session_id: str | None = None) -> list[Any]:
    """`sql`'s parameters as D1 and Durable Object SQL must get them: a bool as the int
    0 or 1 (Durable Object SQL binds True as the text 'true'), every int within
    ±MAX_BOUND_INT, the statement within D1's limits (`check_statement`); else
    `StoreError`, before anything is bound."""
    check_statement(sql, params, session_id)
    bound: list[Any] = []
    for value in params:
        if isinstance(value, bool):
            value = int(value)
        elif isinstance(value, int) and not -MAX_BOUND_INT <= value <= MAX_BOUND_INT:
            bindable(value, f"a value bound to {_statement_name(sql)}", session_id)
        bound.append(value)
    return bound


_INIT: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS agent_sessions (
    id TEXT PRIMARY KEY NOT NULL,
    agent_name TEXT,
    state TEXT NOT NULL,
    message_count INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS agent_messages (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL CHECK (seq >= 0),
    role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'tool')),
    content TEXT NOT NULL,
    tool_call_id TEXT,
    tool_name TEXT,
    tool_calls TEXT,
    input_tokens INTEGER,
    output_tokens INTEGER,
    request_key TEXT,
    created_at INTEGER NOT NULL,
    UNIQUE (session_id, seq)
)""",
    """CREATE UNIQUE INDEX IF NOT EXISTS agent_messages_one_result_per_call
    ON agent_messages (session_id, tool_call_id) WHERE role = 'tool'""",
    """CREATE UNIQUE INDEX IF NOT EXISTS agent_messages_one_turn_per_request_key
    ON agent_messages (session_id, request_key) WHERE request_key IS NOT NULL""",
    """CREATE INDEX IF NOT EXISTS agent_sessions_by_update
    ON agent_sessions (updated_at)""",
    """CREATE TRIGGER IF NOT EXISTS agent_messages_append_only_in_order
BEFORE INSERT ON agent_messages
WHEN NEW.seq > 0 AND NOT EXISTS (
    SELECT 1 FROM agent_messages WHERE session_id = NEW.session_id AND seq = NEW.seq - 1
)
BEGIN
    SELECT RAISE(ABORT, 'agent_messages: seq must directly follow the last stored message');
END""",
)

# One row per session while a run holds it (see run.py, "Leases"). A table of
# its own: a lease is not history, and taking one must not create a session.
_LEASES: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS agent_leases (
    session_id TEXT PRIMARY KEY NOT NULL,
    owner TEXT NOT NULL,
    expires_at INTEGER NOT NULL
)""",
)

# Approvals (approvals.py): an insert-only log of what happened to each call
# that needs a person's yes. The conditions live in the statements: a decision
# or a claim takes its tool_name from the row it depends on through a scalar
# subquery, so when that row is missing (no such request, another digest, not
# approved) the value is NULL and NOT NULL fails the write, batch and all; the
# unique keys let exactly one decision and one claim per call land.
_APPROVALS: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS agent_approvals (
    session_id TEXT NOT NULL,
    tool_call_id TEXT NOT NULL,
    event TEXT NOT NULL CHECK (event IN ('requested', 'approved', 'denied', 'claimed')),
    tool_name TEXT NOT NULL,
    digest TEXT NOT NULL,
    reason TEXT,
    created_at INTEGER NOT NULL,
    UNIQUE (session_id, tool_call_id, event)
)""",
    """CREATE UNIQUE INDEX IF NOT EXISTS agent_approvals_one_decision
    ON agent_approvals (session_id, tool_call_id) WHERE event IN ('approved', 'denied')""",
)

# Session names and usage totals (issue 13). The totals are kept by the append
# that stores the messages (UPSERT_SESSION adds them), so reading them is one
# row, never a SUM. Sessions written before this migration get their totals
# summed once here and their id as their name. Listing pages by the immutable
# (created_at, id), newest first; finding by name reads the name index.
_SESSION_NAMES: tuple[str, ...] = (
    "ALTER TABLE agent_sessions ADD COLUMN name TEXT",
    "ALTER TABLE agent_sessions ADD COLUMN input_tokens INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE agent_sessions ADD COLUMN output_tokens INTEGER NOT NULL DEFAULT 0",
    """UPDATE agent_sessions SET name = COALESCE(name, id),
    input_tokens = (SELECT COALESCE(SUM(m.input_tokens), 0) FROM agent_messages AS m
        WHERE m.session_id = agent_sessions.id),
    output_tokens = (SELECT COALESCE(SUM(m.output_tokens), 0) FROM agent_messages AS m
        WHERE m.session_id = agent_sessions.id)""",
    """CREATE INDEX IF NOT EXISTS agent_sessions_by_creation
    ON agent_sessions (created_at, id)""",
    """CREATE INDEX IF NOT EXISTS agent_sessions_by_name
    ON agent_sessions (name, created_at, id)""",
)

# Summaries (issue 20): a stored system message whose summary_of is n stands for the
# session's messages 0..n-1 in what the model is sent. The partial index finds the
# latest one without reading the history, so a turn loads only what follows it.
_SUMMARIES: tuple[str, ...] = (
    "ALTER TABLE agent_messages ADD COLUMN summary_of INTEGER",
    """CREATE INDEX IF NOT EXISTS agent_messages_summaries
    ON agent_messages (session_id, seq) WHERE summary_of IS NOT NULL""",
)

# Schedules and turn origins (issue 21). A schedule is a message its session runs as
# a turn later; its row stays until that turn's first write, which removes it. The
# trigger makes the firing conditional: a scheduled turn's user message (origin
# 'scheduled', request_key 'schedule:' || id) lands only while its schedule is
# stored, so a schedule cancelled or fired by another run never runs (again).
_SCHEDULES: tuple[str, ...] = (
    "ALTER TABLE agent_messages ADD COLUMN origin TEXT",
    """CREATE TABLE IF NOT EXISTS agent_schedules (
    session_id TEXT NOT NULL,
    schedule_id TEXT NOT NULL,
    message TEXT NOT NULL,
    due_at INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (session_id, schedule_id)
)""",
    """CREATE INDEX IF NOT EXISTS agent_schedules_by_due
    ON agent_schedules (due_at, session_id)""",
    """CREATE TRIGGER IF NOT EXISTS agent_messages_scheduled_once
BEFORE INSERT ON agent_messages
WHEN NEW.origin = 'scheduled' AND NEW.role = 'user' AND NOT EXISTS (
    SELECT 1 FROM agent_schedules WHERE session_id = NEW.session_id
    AND 'schedule:' || schedule_id = NEW.request_key
)
BEGIN
    SELECT RAISE(ABORT, 'agent_messages: the schedule was cancelled or has fired already');
END""",
)

# Instructions and edited approvals (issue 23). A turn's instructions, when the agent
# computes them (`Agent.instructions` as a function), are stored on its user message
# (or on a summary that folds it), so a resumed turn sends the model what it saw. An
# approval may carry the approver's edit of the call's arguments (a JSON object) and
# their own digest; only an approval may (the CHECK), and a row written before this
# migration has none.
_INSTRUCTIONS_AND_EDITS: tuple[str, ...] = (
    "ALTER TABLE agent_messages ADD COLUMN instructions TEXT",
    """ALTER TABLE agent_approvals ADD COLUMN arguments TEXT
    CHECK (arguments IS NULL OR event = 'approved')""",
    """ALTER TABLE agent_approvals ADD COLUMN arguments_digest TEXT
    CHECK ((arguments_digest IS NULL) = (arguments IS NULL))""",
)

# (file name in migrations/, statements). Append; never edit one that shipped.
MIGRATIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("0001_init.sql", _INIT),
    ("0002_session_leases.sql", _LEASES),
    ("0003_approvals.sql", _APPROVALS),
    ("0004_session_names.sql", _SESSION_NAMES),
    ("0005_summaries.sql", _SUMMARIES),
    ("0006_schedules.sql", _SCHEDULES),
    ("0007_instructions_and_edited_approvals.sql", _INSTRUCTIONS_AND_EDITS),
)
SCHEMA: tuple[str, ...] = tuple(s for _, statements in MIGRATIONS for s in statements)

_ADD_COLUMN = re.compile(r"ALTER TABLE (\w+) ADD COLUMN (\w+)")


def schema_plan(columns: Mapping[str, Collection[str]]) -> list[str]:
    """The statements that bring a database to `SCHEMA`, given the columns its
    tables have now (`{table: columns}`, a missing table absent or empty).

    The idempotent statements always run; a migration that adds columns runs
    its ALTERs and its backfill only if its first added column is missing
    (a migration lands whole: either the database has all of it or none).
    Run the plan in one transaction, so two processes opening an old file
    cannot both add the column.
    """
    plan: list[str] = []
    for _, statements in MIGRATIONS:
        added = [m for s in statements if (m := _ADD_COLUMN.match(s))]
        applied = bool(added) and added[0][2] in columns.get(added[0][1], ())
        for statement in statements:
            one_off = _ADD_COLUMN.match(statement) or statement.startswith("UPDATE ")
            if not (applied and one_off):
                plan.append(statement)
    return plan


# The tables migrations add columns to, and the statement that lists a table's
# columns: rows (cid, name, type, notnull, dflt_value, pk); none for a missing table.
ALTERED_TABLES = ("agent_sessions", "agent_messages", "agent_approvals")


def table_info(table: str) -> str:
    return f"PRAGMA table_info({table})"


INSERT_MESSAGE = (
    "INSERT INTO agent_messages (session_id, seq, role, content, tool_call_id, tool_name, "
    "tool_calls, input_tokens, output_tokens, request_key, summary_of, origin, instructions, "
    "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def _text(alias: str, index: int) -> str:
    """SQL for text `index` of a packed JSON element, as `_packable` spelled it: SQLite's
    json_extract ends a text at an escaped U+0000 (3.40, CPython's, does), so a packed
    text has none: U+0000 travels as U+0001 U+0001 and U+0001 as U+0001 U+0002, which
    these two replaces, in this order, undo exactly."""
    value = f"json_extract({alias}.value, '$[{index}]')"
    return f"replace(replace({value}, char(1, 1), char(0)), char(1, 2), char(1))"


def _packable(value: Any) -> Any:
    if isinstance(value, str) and ("\x00" in value or "\x01" in value):
        return value.replace("\x01", "\x01\x02").replace("\x00", "\x01\x01")
    return value


# Messages seq = ? + 0, 1, ...: the columns of INSERT_MESSAGE from role to
# instructions, one JSON array per row (`packed_message_rows`), in order: each row's
# insert is checked by the in-order trigger against the rows before it, as if
# inserted one by one. Binds the session id, the first seq, the time and the JSON,
# however many columns a row has (a column more makes each row's JSON longer, never
# the statement's parameters more).
INSERT_MESSAGES = (
    "INSERT INTO agent_messages (session_id, seq, role, content, tool_call_id, tool_name, "
    "tool_calls, input_tokens, output_tokens, request_key, summary_of, origin, instructions, "
    f"created_at) SELECT ?, ? + m.key, {', '.join(_text('m', i) for i in range(5))}, "
    "json_extract(m.value, '$[5]'), json_extract(m.value, '$[6]'), "
    f"{_text('m', 7)}, json_extract(m.value, '$[8]'), {_text('m', 9)}, {_text('m', 10)}, ? "
    "FROM json_each(?) AS m ORDER BY m.key"
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


def session_summary_params(info: SessionInfo) -> tuple[Any, ...]:
    for what, value in (
        ("its message count", info.message_count), ("its creation time", info.created_at),
        ("its update time", info.updated_at), ("its input tokens", info.input_tokens),
        ("its output tokens", info.output_tokens),
    ):  # fmt: skip
        bindable(value, what, info.id)
    return (
        info.id, info.agent_name, info.state, info.message_count, info.created_at,
        info.updated_at, info.name, info.input_tokens, info.output_tokens,
    )  # fmt: skip


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

_SCHEDULE_COLUMNS = "schedule_id, message, due_at, created_at"
INSERT_SCHEDULE = (
    f"INSERT INTO agent_schedules (session_id, {_SCHEDULE_COLUMNS}) VALUES (?, ?, ?, ?, ?)"
)
SELECT_SCHEDULES = (
    f"SELECT {_SCHEDULE_COLUMNS} FROM agent_schedules WHERE session_id = ? "
    "ORDER BY due_at, schedule_id"
)
DELETE_SCHEDULE = "DELETE FROM agent_schedules WHERE session_id = ? AND schedule_id = ?"
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

_APPROVAL_COLUMNS = "session_id, tool_call_id, event, tool_name, digest, reason, created_at"
# A request carries no edited arguments: their columns stay NULL.
REQUEST_APPROVAL = f"INSERT INTO agent_approvals ({_APPROVAL_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)"
_OF_EVENT = "FROM agent_approvals WHERE session_id = ? AND tool_call_id = ? AND event = ?"
# A decision needs the request with the same digest; a claim needs an approval. An
# approval may carry the approver's edited arguments (JSON) and their digest.
DEPENDENT_APPROVAL = (
    f"INSERT INTO agent_approvals ({_APPROVAL_COLUMNS}, arguments, arguments_digest) "
    f"VALUES (?, ?, ?, (SELECT tool_name {_OF_EVENT} AND digest = ?), ?, ?, ?, ?, ?)"
)
SELECT_APPROVALS = (
    "SELECT tool_call_id, event, tool_name, digest, reason, created_at, arguments, "
    "arguments_digest FROM agent_approvals WHERE session_id = ? ORDER BY rowid"
)
# REQUEST_APPROVAL and DEPENDENT_APPROVAL for a run of changes, one JSON array each:
# [tool_call_id, tool_name, digest] and [tool_call_id, event, depends_on, digest,
# reason, arguments, arguments_digest] (arguments as JSON text, or null). SQLite
# computes an INSERT's SELECT before the first row lands when it reads the table
# written, so a dependent change never sees another of the same statement:
# `approval_statements` starts a new one at a repeated call id.
REQUEST_APPROVALS = (
    f"INSERT INTO agent_approvals ({_APPROVAL_COLUMNS}) SELECT ?, {_text('a', 0)}, "
    f"'requested', {_text('a', 1)}, {_text('a', 2)}, NULL, ? "
    "FROM json_each(?) AS a ORDER BY a.key"
)
DEPENDENT_APPROVALS = (
    f"INSERT INTO agent_approvals ({_APPROVAL_COLUMNS}, arguments, arguments_digest) "
    f"SELECT ?, {_text('a', 0)}, "
    f"{_text('a', 1)}, (SELECT d.tool_name FROM agent_approvals AS d WHERE d.session_id = ? "
    f"AND d.tool_call_id = {_text('a', 0)} AND d.event = {_text('a', 2)} "
    f"AND d.digest = {_text('a', 3)}), {_text('a', 3)}, {_text('a', 4)}, ?, "
    f"{_text('a', 5)}, {_text('a', 6)} "
    "FROM json_each(?) AS a ORDER BY a.key"
)


def session_state(last: Message) -> str:
    """What a session waits for, judged by its last message (shown by `sessions list`)."""
    if last.origin == "stopped":
        return "stopped"  # its resumes kept crashing: the kit ended it (run.stop_turn)
    if last.role == "assistant":
        return "awaiting_tool_results" if last.tool_calls else "idle"
    return "awaiting_llm"


def message_row(
    session_id: str, seq: int, message: Message, now_ms: int, max_row_bytes: int = MAX_ROW_BYTES
) -> tuple[Any, ...]:
    """The INSERT_MESSAGE parameters for one message; refuses a row over the limit (its
    content, tool calls and instructions: the texts that can be long)."""
    tool_calls = encode_tool_calls(message.tool_calls)
    size = sum(
        len(text.encode())
        for text in (message.content, tool_calls, message.instructions)
        if text is not None
    )
    if size > max_row_bytes:
        raise MessageTooLargeError(session_id, size, max_row_bytes, message.role)
    usage = message.usage
    if usage is not None:
        for name, tokens in (("input", usage.input_tokens), ("output", usage.output_tokens)):
            bindable(tokens, f"the {name} tokens of message {seq} ({message.role})", session_id)
    return (
        session_id,
        seq,
        message.role,
        message.content,
        message.tool_call_id,
        message.tool_name,
        tool_calls,
        usage.input_tokens if usage else None,
        usage.output_tokens if usage else None,
        message.request_key,
        message.summary_of,
        message.origin,
        message.instructions,
        now_ms,
    )


def append_rows(
    session_id: str,
    expected_seq: int,
    messages: Sequence[Message],
    now_ms: int,
    max_row_bytes: int = MAX_ROW_BYTES,
    approvals: Sequence[ApprovalChange] = (),
    schedules: Sequence[Schedule] = (),
) -> list[tuple[Any, ...]]:
    """The rows of one append, all built (and size-checked) before anything is
    written, so a bad message fails the whole append with nothing landed."""
    if not messages and not approvals and not schedules:
        raise ConfigurationError(
            "append_messages_atomic needs at least one message, approval change or schedule"
        )
    if expected_seq < 0:
        raise SessionConflictError(session_id, expected_seq, "a position cannot be negative")
    if expected_seq + len(messages) > MAX_BOUND_INT:
        raise SessionConflictError(
            session_id, expected_seq, f"no session holds more than {MAX_BOUND_INT} messages"
        )
    bindable(now_ms, "the time of the append (Unix ms)", session_id)
    for change in approvals:
        check_approval_change(session_id, change)
    rows = [
        message_row(session_id, expected_seq + i, m, now_ms, max_row_bytes)
        for i, m in enumerate(messages)
    ]
    for name, total in zip(("input", "output"), usage_totals(messages), strict=True):
        bindable(total, f"the {name} tokens of one append", session_id)
    return rows


# An append of up to this many statements, one per row, runs them as built; a bigger
# one goes packed. (A test sets it to 0 to hold packed appends to the whole contract.)
PACK_ABOVE = MAX_BATCH_STATEMENTS

# The most JSON one packed statement binds: no more than one row may hold, so a
# pack stays under D1's MAX_VALUE_BYTES with the margin MAX_ROW_BYTES keeps.
PACK_BYTES = MAX_ROW_BYTES


def append_statements(
    session_id: str,
    expected_seq: int,
    messages: Sequence[Message],
    now_ms: int,
    *,
    agent_name: str | None,
    lease: Lease | None,
    approvals: Sequence[ApprovalChange],
    max_row_bytes: int = MAX_ROW_BYTES,
    session_name: str | None = None,
    schedules: Sequence[Schedule] = (),
) -> list[Statement]:
    """Every statement of one atomic append, in order, all built (and checked)
    before anything is written: the messages, the schedule a scheduled turn's
    message fires, the session row, the approval events, the new schedules,
    the lease. The SQLite store runs them in one transaction, D1 in one batch.

    One INSERT per message and per approval event while they fit one D1 batch
    (MAX_BATCH_STATEMENTS); an append too big for that, a step of many tool calls,
    goes packed (see the module docstring): a statement or two per megabyte of
    rows. Past D1's limits even so, `StoreError` (`check_batch`)."""
    rows = append_rows(
        session_id, expected_seq, messages, now_ms, max_row_bytes, approvals, schedules
    )
    inserts: list[Statement] = [(INSERT_MESSAGE, row) for row in rows]
    events = [approval_statement(session_id, change, now_ms) for change in approvals]
    session: list[Statement] = [
        (DELETE_SCHEDULE, (session_id, fired)) for fired in fired_schedules(messages)
    ]
    session += [(INSERT_SCHEDULE, schedule_params(session_id, s)) for s in schedules]
    if messages:
        count = expected_seq + len(messages)
        row = session_row(session_id, agent_name, messages, count, now_ms, session_name)
        session.append((UPSERT_SESSION, row))
    renew_or_release = lease_statement(session_id, lease, now_ms)
    lease_part = [] if renew_or_release is None else [renew_or_release]
    if len(inserts) + len(session) + len(events) + len(lease_part) > PACK_ABOVE:
        inserts = packed_message_rows(rows, now_ms)
        events = approval_statements(session_id, approvals, now_ms)
    return check_batch([*inserts, *session, *events, *lease_part], session_id)


def _packed(
    entries: Sequence[tuple[Sequence[Any], Statement, str | None]],
    pack: Callable[[int, str], Statement],
) -> list[Statement]:
    """Runs of consecutive `entries` (values, own statement, key) as packed statements,
    in order: `pack(first, json)` binds the JSON array of the values of `entries[first:]`
    up to the run's end. A run ends before PACK_BYTES and before a key already in it;
    an entry whose JSON alone is too big for a pack keeps its own statement."""
    statements: list[Statement] = []
    run: list[str] = []  # the JSON of each entry of the run, from entries[first]
    keys: set[str] = set()
    first = size = 0

    def end_run() -> None:
        nonlocal run, keys, size
        if run:
            statements.append(pack(first, f"[{','.join(run)}]"))
        run, keys, size = [], set(), 0

    for index, (values, alone, key) in enumerate(entries):
        packable = [_packable(value) for value in values]
        text = json.dumps(packable, ensure_ascii=False, separators=(",", ":"))
        cost = _text_bytes(text) + 1  # with its comma (or the closing bracket)
        if cost + 1 > PACK_BYTES:
            end_run()
            statements.append(alone)
            continue
        if size + cost + 1 > PACK_BYTES or key in keys:
            end_run()
        if not run:
            first = index
        run.append(text)
        size += cost
        if key is not None:
            keys.add(key)
    end_run()
    return statements


def packed_message_rows(rows: Sequence[tuple[Any, ...]], now_ms: int) -> list[Statement]:
    """INSERT_MESSAGES statements for `message_row` rows of one session, in order
    (INSERT_MESSAGE for a row that cannot go packed)."""
    if not rows:
        return []
    session_id, first_seq = rows[0][0], rows[0][1]
    entries = [(row[2:-1], (INSERT_MESSAGE, row), None) for row in rows]
    return _packed(
        entries,
        lambda first, data: (INSERT_MESSAGES, (session_id, first_seq + first, now_ms, data)),
    )


def fired_schedules(messages: Iterable[Message]) -> list[str]:
    """The ids of the schedules whose turns `messages` start (their user messages)."""
    return [  # (one with no key names no schedule: "" matches none, so it cannot land)
        (m.request_key or "").removeprefix("schedule:")
        for m in messages
        if m.origin == "scheduled" and m.role == "user"
    ]


def schedule_params(session_id: str, schedule: Schedule) -> tuple[Any, ...]:
    for what, value in (
        ("its due time", schedule.due_at),
        ("its creation time", schedule.created_at),
    ):
        bindable(value, f"schedule {schedule.schedule_id!r}: {what}", session_id)
    return (
        session_id,
        schedule.schedule_id,
        schedule.message,
        schedule.due_at,
        schedule.created_at,
    )


def row_schedule(row: Sequence[Any]) -> Schedule:
    """A Schedule from a SELECT_SCHEDULES row."""
    schedule_id, message, due_at, created_at = row
    return Schedule(str(schedule_id), str(message), int(due_at), int(created_at))


def approval_statements(
    session_id: str, changes: Sequence[ApprovalChange], now_ms: int
) -> list[Statement]:
    """The statements recording `changes`, in order: runs of requests as REQUEST_APPROVALS,
    runs of decisions and claims as DEPENDENT_APPROVALS."""
    statements: list[Statement] = []
    start = 0
    while start < len(changes):
        requested = changes[start].event == "requested"
        end = start
        while end < len(changes) and (changes[end].event == "requested") == requested:
            end += 1
        run = changes[start:end]
        entries = [
            (_approval_values(change), approval_statement(session_id, change, now_ms),
             change.tool_call_id)
            for change in run
        ]  # fmt: skip
        if requested:
            statements += _packed(
                entries, lambda _, data: (REQUEST_APPROVALS, (session_id, now_ms, data))
            )
        else:
            statements += _packed(
                entries,
                lambda _, data: (DEPENDENT_APPROVALS, (session_id, session_id, now_ms, data)),
            )
        start = end
    return statements


def _approval_values(change: ApprovalChange) -> tuple[Any, ...]:
    """One change's element of the JSON a packed approval statement binds."""
    if change.event == "requested":
        return (change.tool_call_id, change.tool_name, change.digest)
    depends_on = "approved" if change.event == "claimed" else "requested"
    return (
        change.tool_call_id, change.event, depends_on, change.digest, change.reason,
        encode_arguments(change.arguments), change.arguments_digest,
    )  # fmt: skip


def session_row(
    session_id: str,
    agent_name: str | None,
    messages: Sequence[Message],
    count: int,
    now_ms: int,
    session_name: str | None = None,
) -> tuple[Any, ...]:
    input_tokens, output_tokens = usage_totals(messages)
    return (
        session_id, agent_name, session_state(messages[-1]), count, now_ms, now_ms,
        session_id if session_name is None else session_name, input_tokens, output_tokens,
    )  # fmt: skip


def usage_totals(messages: Iterable[Message]) -> tuple[int, int]:
    """The input and output tokens of `messages`' stored usage, summed."""
    usages = [m.usage for m in messages if m.usage is not None]
    return sum(u.input_tokens for u in usages), sum(u.output_tokens for u in usages)


def row_session_info(row: Sequence[Any]) -> SessionInfo:
    """A SessionInfo from a SESSION_COLUMNS row (tuple, list, or D1's positional row)."""
    session_id, agent_name, state, count, created_at, updated_at, name, inp, out = row
    return SessionInfo(
        id=str(session_id),
        agent_name=None if agent_name is None else str(agent_name),
        state=str(state),
        message_count=int(count),
        created_at=int(created_at),
        updated_at=int(updated_at),
        name=None if name is None else str(name),
        input_tokens=int(inp or 0),
        output_tokens=int(out or 0),
    )


# Above every stored (created_at, id), for the in-memory store (the SQL stores
# list their first page with LIST_FIRST_SESSIONS): no stored time exceeds
# MAX_BOUND_INT, and no id sorts after U+10FFFF.
_FIRST_PAGE: tuple[int, str] = (MAX_BOUND_INT + 1, "\U0010ffff")


def check_limit(limit: int) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigurationError(f"limit must be a positive integer, not {limit!r}")


def bound_limit(limit: int) -> int:
    """A checked `limit` as a statement binds it: no larger than any store can bind
    (a limit beyond every row reads the same rows)."""
    check_limit(limit)
    return min(limit, MAX_BOUND_INT)


def list_statement(cursor: str | None, limit: int) -> Statement:
    """The statement of one `list_sessions` page: `limit + 1` rows (one more tells
    whether a next page exists), after `cursor`'s keys, or from the newest."""
    fetch = min(bound_limit(limit), MAX_BOUND_INT - 1) + 1
    if cursor is None:
        return LIST_FIRST_SESSIONS, (fetch,)
    created_at, last_id = decode_cursor(cursor)
    return LIST_SESSIONS, (created_at, last_id, fetch)


def idle_params(before_ms: int, limit: int) -> tuple[int, int]:
    """The (before_ms, limit) of SELECT_IDLE and DELETE_IDLE, clamped to what any store
    can bind: every stored time is within ±MAX_BOUND_INT, so the rows picked are the same."""
    return clamp_int(before_ms), bound_limit(limit)


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


def row_timeline_entry(session_id: str, seq: int, row: Sequence[Any]) -> tuple[int, Message]:
    """A (created_at, Message) from a SELECT_TIMELINE row."""
    return int(row[-1]), row_messages(session_id, [row[:-1]], start=seq)[0]


def timeline_rows(
    session_id: str, rows: Iterable[Sequence[Any]], *, start: int = 0
) -> list[tuple[int, Message]]:
    """The (created_at, Message) entries of SELECT_TIMELINE rows, the first at `start`."""
    return [row_timeline_entry(session_id, seq, row) for seq, row in enumerate(rows, start)]


def row_message(row: Sequence[Any]) -> Message:
    """A Message from a SELECT_MESSAGES row (tuple, list, or D1's positional row)."""
    (
        role,
        content,
        tool_call_id,
        tool_name,
        tool_calls,
        input_tokens,
        output_tokens,
        key,
        summary_of,
        origin,
        instructions,
    ) = row
    usage = None
    if input_tokens is not None or output_tokens is not None:
        usage = Usage(int(input_tokens or 0), int(output_tokens or 0))
    return Message(
        role=role,
        content=content,
        tool_calls=decode_tool_calls(tool_calls),
        tool_call_id=tool_call_id,
        tool_name=tool_name,
        usage=usage,
        request_key=key,
        summary_of=None if summary_of is None else int(summary_of),
        origin=origin,
        instructions=None if instructions is None else str(instructions),
    )


def context_rows(session_id: str, rows: Sequence[Sequence[Any]]) -> tuple[int, list[Message]]:
    """(the position of the first, the messages) of SELECT_CONTEXT rows (seq first)."""
    if not rows:
        return 0, []
    start = int(rows[0][0])
    return start, row_messages(session_id, [row[1:] for row in rows], start=start)


def page_params(session_id: str, start: int, limit: int | None) -> tuple[Any, ...]:
    """SELECT_MESSAGES_FROM's (and SELECT_TIMELINE's) parameters: a negative start is 0,
    no limit is every row."""
    bound = MAX_BOUND_INT if limit is None else clamp_int(max(limit, 0))
    return (session_id, clamp_int(max(start, 0)), bound)


def row_messages(
    session_id: str, rows: Iterable[Sequence[Any]], *, start: int = 0
) -> list[Message]:
    """The messages of SELECT_MESSAGES rows; a row that does not decode is a StoreError."""
    messages = []
    for seq, row in enumerate(rows, start):
        try:
            messages.append(row_message(row))
        except (ValueError, TypeError, KeyError) as exc:
            raise StoreError(
                f"message {seq} of session {session_id!r} is not a valid stored message "
                f"({type(exc).__name__}: {exc}); the database was changed outside the kit",
                session_id=session_id,
            ) from exc
    return messages


def schema_script(statements: Sequence[str] = SCHEMA) -> str:
    """Statements as one SQL script, as written to a file in migrations/."""
    return "".join(f"{statement};\n\n" for statement in statements).rstrip() + "\n"


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
    """The statement that records one approval change (see _APPROVALS for its conditions)."""
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


def encode_arguments(arguments: Mapping[str, Any] | None) -> str | None:
    """The JSON stored in `agent_approvals.arguments` (an approval's edit), keys in the
    order given; None for none. ValueError for a value that is no strict JSON."""
    if arguments is None:
        return None
    _json.check_depth(arguments)  # encoding a too-deep value overflows Pyodide's stack
    return json.dumps(arguments, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def check_approval_change(session_id: str, change: ApprovalChange) -> None:
    """ConfigurationError, before anything is written, for a change whose edited arguments
    cannot be stored: only an approval carries them, a JSON object with its digest."""
    if change.arguments is None and change.arguments_digest is None:
        return
    problem = None
    if change.event != "approved":
        problem = f"only an approval carries edited arguments, not a {change.event} event"
    elif change.arguments is None:
        problem = "an arguments_digest without the edited arguments it is the digest of"
    elif not isinstance(change.arguments, dict):
        problem = f"edited arguments must be a JSON object, not {type(change.arguments).__name__}"
    elif not isinstance(change.arguments_digest, str) or not change.arguments_digest:
        problem = "edited arguments need their digest (approval_digest of the call with them)"
    else:
        try:
            encode_arguments(change.arguments)
        except (ValueError, TypeError) as exc:
            problem = f"edited arguments must be strict JSON ({exc})"
    if problem is not None:
        raise ConfigurationError(
            f"session {session_id!r}, call {change.tool_call_id!r}: {problem}; nothing was written"
        )


def row_approval_event(row: Sequence[Any], session_id: str = "") -> ApprovalEvent:
    """An ApprovalEvent from a SELECT_APPROVALS row; StoreError for edited arguments that
    are not the JSON object the kit stores."""
    tool_call_id, event, tool_name, digest, reason, created_at, raw, arguments_digest = row
    arguments = None
    if raw is not None:
        try:
            arguments = _json.loads(str(raw), max_depth=_json.STORED_MAX_DEPTH)
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            raise StoreError(
                f"the approval of call {tool_call_id!r} of session {session_id!r} has edited "
                "arguments that are not a JSON object; the database was changed outside the kit",
                session_id=session_id or None,
            )
    return ApprovalEvent(
        str(tool_call_id), event, str(tool_name), str(digest),
        None if reason is None else str(reason), int(created_at), arguments,
        None if arguments_digest is None else str(arguments_digest),
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
