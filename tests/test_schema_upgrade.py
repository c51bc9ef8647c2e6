"""A database written before migration 0007 (instructions, edited approvals), or before
0008 (recurring schedules), is upgraded in
place by every SQL store that applies the schema itself: SQLite on open, D1 by
`create_tables` (deployments: `wrangler d1 migrations apply`, see
tests/cloudflare/test_wrangler_migrations.py), a Durable Object's SQLite on first use.
Its old rows read back unchanged, new ones carry the new fields, and a second open
changes nothing."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from tests.support.do_storage import FakeDurableObjectStorage

from durable_agents.cloudflare import d1_store, durable_object_store
from durable_agents.errors import SessionConflictError
from durable_agents.messages import Message, ToolCall, encode_tool_calls
from durable_agents.stores import Store, _schema, sqlite_store
from durable_agents.stores.base import ApprovalChange, Schedule
from durable_agents.testing.fake_d1 import FakeD1Database

BEFORE = [name for name, _ in _schema.migrations()].index(
    "0007_instructions_and_edited_approvals.sql"
)
CALL = ToolCall("r1", "refund", {"order_id": "A-1", "amount_cents": 500})


def write_old_rows(conn: sqlite3.Connection) -> None:
    """Migrations 0001-0006, and a session with a decided call, as the kit wrote them then."""
    for _, statements in _schema.migrations()[:BEFORE]:
        for statement in statements:
            conn.execute(statement)
    conn.execute(
        "INSERT INTO agent_sessions (id, agent_name, state, message_count, created_at, "
        "updated_at, name) VALUES ('old', 'refunds', 'awaiting_tool_results', 2, 1000, 2000, 'old')"
    )
    for seq, role, calls in ((0, "user", None), (1, "assistant", encode_tool_calls([CALL]))):
        conn.execute(
            "INSERT INTO agent_messages (session_id, seq, role, content, tool_calls, created_at) "
            "VALUES ('old', ?, ?, 'x', ?, 1000)",
            (seq, role, calls),
        )
    for event, reason in (("requested", None), ("approved", "ann: ok")):
        conn.execute(
            "INSERT INTO agent_approvals (session_id, tool_call_id, event, tool_name, digest, "
            "reason, created_at) VALUES ('old', 'r1', ?, 'refund', 'd1', ?, 1500)",
            (event, reason),
        )


@pytest.fixture(params=["sqlite", "d1-fake", "durable-object"])
async def old_database(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Callable[[], Any], sqlite3.Connection]]:
    """(open: a new store on the old database, upgraded as that backend upgrades it; a
    connection to the database itself)."""
    if request.param == "durable-object":
        storage = FakeDurableObjectStorage()
        write_old_rows(storage.connection)

        async def open_object() -> Store:
            return durable_object_store(storage)

        yield open_object, storage.connection
        return
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    write_old_rows(conn)
    opened: list[Any] = []

    async def open_file() -> Store:
        if request.param == "sqlite":
            store = sqlite_store(path)
            opened.append(store)
            await store.load_messages("warm-up")  # opening migrates
            return store
        database = FakeD1Database(str(path))
        opened.append(database)
        d1 = d1_store(database)
        await d1.create_tables()
        return d1

    yield open_file, conn
    for thing in opened:
        if isinstance(thing, FakeD1Database):
            thing.close()
        else:
            await thing.close()
    conn.close()


async def test_an_old_database_is_upgraded_in_place_and_keeps_its_rows(
    old_database: tuple[Callable[[], Any], sqlite3.Connection],
) -> None:
    open_store, conn = old_database
    store = await open_store()
    old = await store.load_messages("old")
    assert old == [Message.user("x"), Message.assistant("x", [CALL])]
    assert [m.instructions for m in old] == [None, None]
    events = await store.load_approvals("old")
    assert [(e.event, e.reason, e.arguments, e.arguments_digest) for e in events] == [
        ("requested", None, None, None),
        ("approved", "ann: ok", None, None),
    ]
    # The old session goes on with the new fields.
    other = ToolCall("r2", "refund", {"order_id": "B-2", "amount_cents": 900})
    await store.append_messages_atomic(
        "old", 2,
        [Message.tool_result(CALL, "ok"), Message("user", "more", instructions="Be brief."),
         Message.assistant("", [other])],
        approvals=[ApprovalChange("r2", "requested", "d2", tool_name="refund")],
    )  # fmt: skip
    edit = {"order_id": "B-2", "amount_cents": 450}
    await store.append_messages_atomic(
        "old", 5, [],
        approvals=[ApprovalChange("r2", "approved", "d2", arguments=edit, arguments_digest="e2")],
    )  # fmt: skip
    # Opened again: nothing is added twice, everything reads back.
    again = await open_store()
    assert (await again.load_messages("old"))[3].instructions == "Be brief."
    assert (await again.load_approvals("old"))[-1].arguments == edit
    # The schema itself keeps edits to approvals (a write from outside the kit included).
    with pytest.raises(sqlite3.IntegrityError, match="CHECK constraint failed"):
        conn.execute(
            "INSERT INTO agent_approvals (session_id, tool_call_id, event, tool_name, digest, "
            "created_at, arguments, arguments_digest) VALUES ('old', 'r2', 'claimed', 'refund', "
            "'d2', 3000, '{}', 'e')"
        )
    with pytest.raises(sqlite3.IntegrityError, match="CHECK constraint failed"):
        conn.execute(
            "INSERT INTO agent_approvals (session_id, tool_call_id, event, tool_name, digest, "
            "created_at, arguments) VALUES ('x', 'r9', 'approved', 't', 'd', 3000, '{}')"
        )


BEFORE_RULES = [name for name, _ in _schema.migrations()].index("0008_recurring_schedules.sql")


@pytest.mark.parametrize("backend", ["sqlite", "d1-fake", "durable-object"])
async def test_a_schedule_waiting_before_recurring_rules_fires_once_after_the_upgrade(
    backend: str, tmp_path: Path
) -> None:
    """Migration 0008 replaces 0006's trigger: a one-off schedule stored before it still
    runs once, and the upgraded database takes recurring ones."""
    storage = FakeDurableObjectStorage() if backend == "durable-object" else None
    path = tmp_path / "old.db"
    conn = storage.connection if storage else sqlite3.connect(path, isolation_level=None)
    for _, statements in _schema.migrations()[:BEFORE_RULES]:
        for statement in statements:
            conn.execute(statement)
    conn.execute(
        "INSERT INTO agent_messages (session_id, seq, role, content, created_at) "
        "VALUES ('old', 0, 'user', 'hi', 1000)"
    )
    conn.execute(
        "INSERT INTO agent_schedules (session_id, schedule_id, message, due_at, created_at) "
        "VALUES ('old', 'sch_1', 'later', 2000, 1000)"
    )
    store: Any
    if storage is not None:
        store = durable_object_store(storage)
    elif backend == "sqlite":
        store = sqlite_store(path)
    else:
        database = FakeD1Database(str(path))
        store = d1_store(database)
        await store.create_tables()
    (waiting,) = await store.load_schedules("old")
    assert (waiting.schedule_id, waiting.rule) == ("sch_1", None)
    fired = Message("user", "later", request_key=waiting.request_key, origin="scheduled")
    assert await store.append_messages_atomic("old", 1, [fired]) == 2
    assert await store.load_schedules("old") == []
    with pytest.raises(SessionConflictError):  # once
        await store.append_messages_atomic("old", 2, [fired])
    rule = Schedule("sch_2", "tick", 60_000, 0, rule='{"every_seconds":60}')
    await store.append_messages_atomic("old", 2, [], schedules=[rule])
    tick = Message("user", "tick", request_key=rule.request_key, origin="scheduled")
    moved = Schedule("sch_2", "tick", 120_000, 0, rule=rule.rule)
    assert await store.append_messages_atomic("old", 2, [tick], schedules=[moved]) == 3
    assert await store.load_schedules("old") == [moved]
    triggers = {
        row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")
    }
    assert "agent_messages_scheduled_once" not in triggers
    assert "agent_messages_scheduled_occurrence" in triggers
    if backend == "sqlite":
        await store.close()
    elif backend == "d1-fake":
        database.close()
    if storage is None:
        conn.close()
