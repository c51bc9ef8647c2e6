"""What is specific to the SQLite store (the shared contract is in test_store_conformance.py)."""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from durable_agents import (
    Agent,
    LLMResponse,
    Message,
    SessionConflictError,
    StoreError,
    ToolCall,
    Usage,
    run,
)
from durable_agents.messages import MalformedToolCall, stored_message
from durable_agents.stores import _schema, sqlite_store
from durable_agents.stores._call_thread import CallThread
from durable_agents.stores.sqlite import _transaction
from durable_agents.testing import ScriptedLLM


async def test_durability_settings(tmp_path: Path) -> None:
    store = sqlite_store(tmp_path / "a.db", busy_timeout_ms=1234)
    await store.append_messages_atomic("s", 0, [Message.user("hi")])
    conn = store._conn
    assert conn is not None
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 1234
    await store.close()


async def test_schema_has_the_documented_tables_and_columns(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path / "a.db") as store:
        await store.load_messages("warm-up")
    conn = sqlite3.connect(tmp_path / "a.db")
    columns = {
        table: [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
        for table in ("agent_sessions", "agent_messages", "agent_schedules", "agent_approvals")
    }
    conn.close()
    assert columns["agent_sessions"] == [
        "id", "agent_name", "state", "message_count", "created_at", "updated_at",
        "name", "input_tokens", "output_tokens",
    ]  # fmt: skip
    assert columns["agent_messages"] == [
        "session_id", "seq", "role", "content", "tool_call_id", "tool_name", "tool_calls",
        "input_tokens", "output_tokens", "request_key", "created_at", "summary_of", "origin",
        "instructions",
    ]  # fmt: skip
    assert columns["agent_schedules"] == [
        "session_id", "schedule_id", "message", "due_at", "created_at", "rule",
    ]  # fmt: skip
    assert columns["agent_approvals"] == [
        "session_id", "tool_call_id", "event", "tool_name", "digest", "reason", "created_at",
        "arguments", "arguments_digest",
    ]  # fmt: skip


async def test_a_file_from_before_names_is_migrated_once_on_open(tmp_path: Path) -> None:
    """A file written by 0001-0003 gets 0004 on open: names = ids, totals summed."""
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    for _, statements in _schema.migrations()[:3]:
        for statement in statements:
            conn.execute(statement)
    conn.execute("INSERT INTO agent_sessions VALUES ('old', 'support', 'idle', 3, 1000, 2000)")
    for seq, (role, inp, out) in enumerate(
        [("user", None, None), ("assistant", 10, 3), ("assistant", 5, 4)]
    ):
        conn.execute(
            "INSERT INTO agent_messages (session_id, seq, role, content, input_tokens, "
            "output_tokens, created_at) VALUES ('old', ?, ?, 'x', ?, ?, 1000)",
            (seq, role, inp, out),
        )
    conn.commit()
    conn.close()
    for _ in range(2):  # the second open adds no column twice and changes nothing
        async with sqlite_store(path) as store:
            info = await store.get_session("old")
            assert info is not None
            assert (info.name, info.input_tokens, info.output_tokens) == ("old", 15, 7)
            assert [i.id for i in await store.find_sessions("old")] == ["old"]
    async with sqlite_store(path) as store:
        await store.append_messages_atomic("old", 3, [Message.assistant("y", usage=Usage(1, 1))])
        info = await store.get_session("old")
        assert info is not None
        assert (info.name, info.input_tokens, info.output_tokens) == ("old", 16, 8)
        assert (await store.list_sessions()).sessions == [info]


async def test_history_survives_closing_and_reopening(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path / "a.db") as store:
        await store.append_messages_atomic("s", 0, [Message.user("a"), Message.assistant("b")])
    async with sqlite_store(tmp_path / "a.db") as again:
        assert await again.load_messages("s") == [Message.user("a"), Message.assistant("b")]


async def test_two_stores_on_one_file_see_each_other_and_conflict(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path / "a.db") as one, sqlite_store(tmp_path / "a.db") as two:
        await one.append_messages_atomic("s", 0, [Message.user("from one")])
        assert await two.load_messages("s") == [Message.user("from one")]
        with pytest.raises(SessionConflictError, match="another writer got there first"):
            await two.append_messages_atomic("s", 0, [Message.user("from two")])


def test_in_memory_database_is_not_durable() -> None:
    assert sqlite_store(":memory:").durable is False
    assert sqlite_store("x.db").durable is True


async def test_a_file_that_is_not_a_database_is_a_store_error_and_stays_untouched(
    tmp_path: Path,
) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are my notes, not a database" * 100)
    before = path.read_bytes()
    store = sqlite_store(path)
    with pytest.raises(StoreError, match=r"notes\.db"):
        await store.load_messages("s")
    await store.close()
    assert path.read_bytes() == before


async def test_an_unreachable_store_fails_run_before_the_llm_is_called(tmp_path: Path) -> None:
    store = sqlite_store(tmp_path / "missing-dir" / "a.db")
    llm = ScriptedLLM([LLMResponse(text="never")])
    with pytest.raises(StoreError, match="unable to open"):
        await run(Agent("a"), llm=llm, message="hi", session_id="s", store=store)
    assert llm.calls == []
    await store.close()


async def test_a_locked_database_is_a_store_error_after_the_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    async with sqlite_store(path) as setup:
        await setup.load_messages("warm-up")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        async with sqlite_store(path, busy_timeout_ms=50) as store:
            with pytest.raises(StoreError, match="locked"):
                await store.append_messages_atomic("s", 0, [Message.user("hi")])
            holder.execute("ROLLBACK")
            assert await store.load_messages("s") == []
    finally:
        holder.close()


async def test_a_failed_commit_leaves_no_transaction_open(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    store = sqlite_store(path, busy_timeout_ms=50)
    await store.append_messages_atomic("s", 0, [Message.user("hi")])
    conn = store._conn
    assert conn is not None

    await store._call(lambda c: c.execute("PRAGMA foreign_keys = ON"))

    def failing_commit() -> None:
        # A deferred constraint fails at COMMIT, and SQLite keeps the transaction open.
        conn.execute("CREATE TEMP TABLE parent (id INTEGER PRIMARY KEY)")
        conn.execute(
            "CREATE TEMP TABLE child (p INTEGER REFERENCES parent (id)"
            " DEFERRABLE INITIALLY DEFERRED)"
        )
        conn.execute("INSERT INTO child VALUES (1)")

    with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
        await store._call(lambda c: _transaction(c, failing_commit))
    assert not conn.in_transaction
    # The store (and any other writer of the file) can still write.
    await store.append_messages_atomic("s", 1, [Message.assistant("still writable")])
    other = sqlite3.connect(path, timeout=0.05)
    other.execute("BEGIN IMMEDIATE")
    other.execute("ROLLBACK")
    other.close()
    await store.close()


def test_the_empty_path_is_a_temporary_database_not_a_durable_one() -> None:
    assert sqlite_store("").durable is False


async def test_a_row_changed_outside_the_kit_is_a_clear_store_error(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    async with sqlite_store(path) as store:
        await store.append_messages_atomic("s", 0, [Message.assistant("x")])
    conn = sqlite3.connect(path)
    conn.execute("UPDATE agent_messages SET tool_calls = '{not json' WHERE session_id = 's'")
    conn.commit()
    conn.close()
    async with sqlite_store(path) as store:
        with pytest.raises(StoreError, match="message 0 of session 's'") as info:
            await store.load_messages("s")
    assert info.value.session_id == "s"


def _stored_kinds() -> list[Message]:
    call = ToolCall("c1", "record", {"item": "x"})
    malformed = MalformedToolCall("c3", "t", raw_arguments="{", arguments_error="!")
    return [
        Message("user", "héllo \ud800", request_key="k", origin="self-resumed", instructions="é"),
        Message.assistant("", [call], Usage(3, 4)),
        Message.assistant("", [ToolCall("c2", "t", {}, "p/2", {"source": "mcp"})]),
        Message.assistant("", [malformed]),
        Message.tool_result(call, "done"),
        Message.summary("so far", 2),
        Message("assistant", "stop", origin="stopped"),
    ]


async def test_loaded_messages_are_the_stored_ones_frozen_as_ever(tmp_path: Path) -> None:
    # Loading builds messages and calls by slot stores (messages.stored_message), not
    # through the dataclasses' __init__: the same objects come back, as immutable.
    stored = _stored_kinds()
    async with sqlite_store(tmp_path / "a.db") as store:
        await store.append_messages_atomic("s", 0, stored[:1])
        for seq, message in enumerate(stored[1:], 1):  # a summary folds what came before
            await store.append_messages_atomic("s", seq, [message])
        loaded = await store.load_messages("s")
    assert loaded == stored
    assert [hash(m) for m in loaded[4:]] == [hash(m) for m in stored[4:]]
    assert all(type(m) is Message for m in loaded)
    assert [type(c) for m in loaded for c in m.tool_calls] == [
        ToolCall,
        ToolCall,
        MalformedToolCall,
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        loaded[0].content = "changed"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        loaded[1].tool_calls[0].name = "changed"  # type: ignore[misc]


@pytest.mark.parametrize(
    "fields",
    [
        ("robot", "x", (), None),  # an unknown role
        ("tool", "x", (), None),  # a result without its call's id
        ("user", "x", [], None),  # tool calls as a list: made a tuple
        ("user", "caf\u00e9 \udc00", (), "\ud800"),  # lone surrogates: repaired
    ],
)
def test_stored_message_checks_and_repairs_as_message_does(
    fields: tuple[Any, str, Any, str | None],
) -> None:
    role, content, calls, instructions = fields
    args = (role, content, calls, None, None, None, None, None, None, instructions)
    try:
        expected: Message | str = Message(*args)
    except ValueError as exc:
        expected = str(exc)
    try:
        built: Message | str = stored_message(*args)
    except ValueError as exc:
        built = str(exc)
    assert built == expected


async def test_calls_run_in_order_in_one_thread_that_stops_with_the_store(
    tmp_path: Path,
) -> None:
    thread = CallThread("test-calls")
    ran: list[int] = []
    first, second = thread.call(ran.append, 1), thread.call(ran.append, 2)
    assert await first is None
    assert await second is None
    assert ran == [1, 2]
    with pytest.raises(ZeroDivisionError):
        await thread.call(lambda n: n / 0, 1)
    gate = threading.Event()
    blocking = thread.call(lambda _: gate.wait(5), None)
    cancelled = thread.call(ran.append, 3)  # queued behind the blocking call
    cancelled.cancel()
    gate.set()
    assert await blocking is True
    assert await thread.call(ran.append, 4) is None
    assert ran == [1, 2, 4]  # a call cancelled while queued never runs
    thread.stop()

    before = _store_threads()  # other tests' stores may still hold theirs
    store = sqlite_store(tmp_path / "a.db")
    await store.get_session("s")
    (own,) = _store_threads() - before
    await store.close()
    own.join(timeout=60)  # ends once the store is closed (the bound only stops a hang)
    assert not own.is_alive()


def _store_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "durable-agents-sqlite" and t.is_alive()}
