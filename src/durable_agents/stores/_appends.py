"""One atomic append as statements: its rows built and checked before anything is
written, then one INSERT per row, or packed rows when the append is big.

Why a big append packs its rows: D1 counts every statement of a batch as one of the
queries a Worker invocation may make (50 on Workers Free, 1,000 on Paid), so one
INSERT per message made a step of 1,000 tool calls a batch of 1,002 statements, past
what D1 takes, which the miniflare D1 of `scripts/dev` ran all the same. An append of
more than PACK_ABOVE statements has its messages (and approval events) travel as JSON
arrays instead, each bound to one parameter of an INSERT ... SELECT FROM json_each(?):
a few statements whatever the row count. Guide: docs/contract.md, docs/limits.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..errors import ConfigurationError, SessionConflictError
from ..limits import MAX_ROW_BYTES
from ..messages import Message
from ._limits import (
    MAX_BATCH_STATEMENTS,
    MAX_BOUND_INT,
    Statement,
    bindable,
    check_batch,
    check_statement,
    text_bytes,
)
from ._rows import (
    check_approval_change,
    encode_arguments,
    message_row,
    schedule_params,
    session_row,
    usage_totals,
)
from ._statements import (
    APPROVAL_COLUMNS,
    DELETE_FIRED_SCHEDULE,
    INSERT_MESSAGE,
    INSERT_SCHEDULE,
    UPSERT_SESSION,
    approval_statement,
    lease_statement,
)
from .base import ApprovalChange, Lease, Schedule


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

# REQUEST_APPROVAL and DEPENDENT_APPROVAL for a run of changes, one JSON array each:
# [tool_call_id, tool_name, digest] and [tool_call_id, event, depends_on, digest,
# reason, arguments, arguments_digest] (arguments as JSON text, or null). SQLite
# computes an INSERT's SELECT before the first row lands when it reads the table
# written, so a dependent change never sees another of the same statement:
# `approval_statements` starts a new one at a repeated call id.
REQUEST_APPROVALS = (
    f"INSERT INTO agent_approvals ({APPROVAL_COLUMNS}) SELECT ?, {_text('a', 0)}, "
    f"'requested', {_text('a', 1)}, {_text('a', 2)}, NULL, ? "
    "FROM json_each(?) AS a ORDER BY a.key"
)
DEPENDENT_APPROVALS = (
    f"INSERT INTO agent_approvals ({APPROVAL_COLUMNS}, arguments, arguments_digest) "
    f"SELECT ?, {_text('a', 0)}, "
    f"{_text('a', 1)}, (SELECT d.tool_name FROM agent_approvals AS d WHERE d.session_id = ? "
    f"AND d.tool_call_id = {_text('a', 0)} AND d.event = {_text('a', 2)} "
    f"AND d.digest = {_text('a', 3)}), {_text('a', 3)}, {_text('a', 4)}, ?, "
    f"{_text('a', 5)}, {_text('a', 6)} "
    "FROM json_each(?) AS a ORDER BY a.key"
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
    totals = usage_totals(messages)
    if totals != (0, 0):  # (no message with usage: nothing to check, nor to word)
        for name, total in zip(("input", "output"), totals, strict=True):
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
    packed: bool = True,
) -> list[Statement]:
    """Every statement of one atomic append, in order, all built (and checked)
    before anything is written: the messages, the schedule a scheduled turn's
    message fires, the session row, the approval events, the new schedules,
    the lease. The SQLite store runs them in one transaction, D1 in one batch.
    (A new schedule with the id of the one a message fires replaces it: a recurring
    schedule moved to its next occurrence, `durable_agents.recurrence`.)

    One INSERT per message and per approval event while they fit one D1 batch
    (MAX_BATCH_STATEMENTS); an append too big for that, a step of many tool calls,
    goes packed (see the module docstring): a statement or two per megabyte of
    rows. Past D1's limits even so, `StoreError` (`check_batch`). `packed=False`: one
    statement per row however many (PostgreSQL, which takes a transaction of any length
    but has no json_each), each statement still within D1's limits."""
    rows = append_rows(
        session_id, expected_seq, messages, now_ms, max_row_bytes, approvals, schedules
    )
    inserts: list[Statement] = [(INSERT_MESSAGE, row) for row in rows]
    events = [approval_statement(session_id, change, now_ms) for change in approvals]
    session: list[Statement] = [
        (DELETE_FIRED_SCHEDULE, (session_id, key)) for key in fired_schedules(messages)
    ]
    session += [(INSERT_SCHEDULE, schedule_params(session_id, s)) for s in schedules]
    if messages:
        count = expected_seq + len(messages)
        row = session_row(session_id, agent_name, messages, count, now_ms, session_name)
        session.append((UPSERT_SESSION, row))
    renew_or_release = lease_statement(session_id, lease, now_ms)
    lease_part = [] if renew_or_release is None else [renew_or_release]
    statements = [*inserts, *session, *events, *lease_part]
    if not packed:
        for sql, params in statements:
            check_statement(sql, params, session_id)
        return statements
    if len(statements) > PACK_ABOVE:
        inserts = packed_message_rows(rows, now_ms)
        events = approval_statements(session_id, approvals, now_ms)
        statements = [*inserts, *session, *events, *lease_part]
    return check_batch(statements, session_id)


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
        cost = text_bytes(text) + 1  # with its comma (or the closing bracket)
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
    """The request keys of the schedules whose turns `messages` start (their user
    messages): a one-off schedule's, or a recurring one's occurrence (`Schedule.request_key`).
    A recurring schedule's next occurrence is in the append's `schedules`, under its id:
    the fired row is deleted before the new rows are inserted."""
    return [  # (one with no key names no schedule: "" matches none, so it cannot land)
        m.request_key or "" for m in messages if m.origin == "scheduled" and m.role == "user"
    ]


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
