"""Checks that a D1 binding behaves the way `d1_store` relies on.

Run them against miniflare's real D1 inside the local runtime
(tests/runtime/test_d1_store.py) and against `FakeD1Database` on CPython
(tests/cloudflare/test_d1_store.py): passing both keeps the fake honest, so a
CPython test that passes on the fake means something on Cloudflare. The
store-level contract is `testing.conformance`; these are what lies beneath
it (batch atomicity, the error texts `is_conflict` reads, value shapes) plus
the D1 store's own behaviour that the contract leaves open.

Each check takes a fresh, empty binding (`env.DB` in a Worker).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from durable_agents.errors import MessageTooLargeError, SessionConflictError, StoreError
from durable_agents.messages import Message, ToolCall, Usage
from durable_agents.stores import _rows, _schema, _statements
from durable_agents.stores.d1 import d1_store
from durable_agents.testing.conformance import ticking_clock

Check = Callable[[Any], Awaitable[None]]
E = TypeVar("E", bound=BaseException)


async def _raised(call: Awaitable[Any], kind: type[E]) -> E:
    try:
        await call
    except kind as exc:
        return exc
    raise AssertionError(f"expected {kind.__name__}, but the call succeeded")


async def _error_text(call: Awaitable[Any]) -> str:
    try:
        await call
    except Exception as exc:
        return str(exc)
    raise AssertionError("the call succeeded, but D1 should have refused it")


async def schema_applies_statement_by_statement(db: Any) -> None:
    store = d1_store(db)
    await store.create_tables()
    await store.create_tables()  # IF NOT EXISTS everywhere: idempotent
    rows = await db.prepare(
        "SELECT type, name FROM sqlite_master WHERE name LIKE 'agent_%' ORDER BY type, name"
    ).raw()
    assert [list(r) for r in rows] == [
        ["index", "agent_approvals_one_decision"],
        ["index", "agent_messages_one_result_per_call"],
        ["index", "agent_messages_one_turn_per_request_key"],
        ["index", "agent_messages_summaries"],
        ["index", "agent_schedules_by_due"],
        ["index", "agent_sessions_by_creation"],
        ["index", "agent_sessions_by_name"],
        ["index", "agent_sessions_by_update"],
        ["table", "agent_approvals"],
        ["table", "agent_leases"],
        ["table", "agent_messages"],
        ["table", "agent_schedules"],
        ["table", "agent_sessions"],
        ["trigger", "agent_messages_append_only_in_order"],
        ["trigger", "agent_messages_scheduled_occurrence"],
    ], rows


async def multi_line_exec_rejects_the_trigger(db: Any) -> None:
    # Why create_tables() uses prepare().run(): D1's exec() splits its input
    # on newlines, which cuts the trigger's BEGIN...END body apart.
    text = await _error_text(db.exec(_schema.schema_script()))
    assert "D1_EXEC_ERROR" in text, text


async def batch_is_all_or_nothing(db: Any) -> None:
    await db.prepare("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)").run()
    insert = "INSERT INTO t (k, v) VALUES (?, ?)"
    text = await _error_text(
        db.batch([db.prepare(insert).bind(1, "a"), db.prepare(insert).bind(1, "dup")])
    )
    assert "UNIQUE constraint failed: t.k" in text, text
    assert await db.prepare("SELECT count(*) AS n FROM t").first("n") == 0


async def transactions_are_refused(db: Any) -> None:
    text = await _error_text(db.prepare("BEGIN TRANSACTION").run())
    assert "D1_ERROR" in text, text


async def values_keep_their_shape(db: Any) -> None:
    await db.prepare("CREATE TABLE v (i INTEGER, r REAL, s TEXT, n TEXT)").run()
    s = "é€😀\nline\x00after-nul"
    await db.prepare("INSERT INTO v VALUES (?, ?, ?, ?)").bind(2**52 + 1, 2.5, s, None).run()
    assert await db.prepare("SELECT i, r, s, n FROM v").raw() == [[2**52 + 1, 2.5, s, None]]
    result = await db.prepare("SELECT i, s, n FROM v").all()
    assert result["success"] is True
    assert result["results"] == [{"i": 2**52 + 1, "s": s, "n": None}]
    assert result.meta["rows_read"] >= 1  # dict with attribute access, as the SDK gives
    assert await db.prepare("SELECT s FROM v WHERE i = ?").bind(0).first() is None
    assert await db.prepare("SELECT s FROM v").first("s") == s
    changed = await db.prepare("UPDATE v SET n = ?").bind("x").run()
    assert changed["meta"]["changes"] == 1


async def integers_beyond_2_53_minus_2_are_refused(db: Any) -> None:
    # A Python Worker hands D1 an int beyond ±(2**53 - 2) as a JavaScript BigInt
    # (Pyodide's Number test is strict: 2**53 - 1 is a BigInt), and D1 refuses it.
    await db.prepare("CREATE TABLE b (i INTEGER)").run()

    async def insert(value: int) -> None:
        await db.prepare("INSERT INTO b VALUES (?)").bind(value).run()

    for value in (2**53 - 2, -(2**53 - 2)):
        await insert(value)
    rows = await db.prepare("SELECT i FROM b ORDER BY i").raw()
    assert [list(r) for r in rows] == [[-(2**53 - 2)], [2**53 - 2]]
    for value in (2**53 - 1, -(2**53 - 1), 2**53, 2**63):
        text = await _error_text(insert(value))
        assert f"D1_TYPE_ERROR: Type 'bigint' not supported for value '{value}'" in text, text


async def the_store_binds_no_integer_d1_refuses(db: Any) -> None:
    store = d1_store(db, clock=ticking_clock())
    await store.create_tables()
    for name in ("a", "b", "c"):
        await store.append_messages_atomic(name, 0, [Message.user(name)])
    # The first page had a cursor of 2**53 - 1, above every row: D1 refused it.
    first = await store.list_sessions(limit=2)
    assert [i.id for i in first.sessions] == ["c", "b"]
    rest = await store.list_sessions(limit=2**60, cursor=first.next_cursor)
    assert [i.id for i in rest.sessions] == ["a"]
    assert await store.acquire_lease("a", "run", 2**60) is None  # until the end of time
    assert await store.delete_idle(-(2**60)) == 0
    idle = await store.idle_sessions(2**60, limit=2**60)
    assert [i.id for i in idle] == ["a", "b", "c"]
    # Data beyond the range is refused by name, before anything is written.
    large = Message.assistant("x", usage=Usage(2**53 - 1, 0))
    refused = await _raised(store.append_messages_atomic("a", 1, [large]), StoreError)
    assert "the input tokens of message 1 (assistant) is 9007199254740991" in str(refused)
    assert "nothing was written" in str(refused)
    assert await store.load_messages("a") == [Message.user("a")]
    summed = dataclasses.replace(idle[0], output_tokens=2**53)  # as an index mirrors it
    refused = await _raised(store.put_session_summary(summed), StoreError)
    assert "its output tokens is 9007199254740992" in str(refused), str(refused)
    assert await store.delete_idle(2**60, limit=2**60) == 3


async def too_many_parameters_are_refused(db: Any) -> None:
    sql = "SELECT " + ", ".join("?" * 101)
    text = await _error_text(db.prepare(sql).bind(*range(101)).all())
    assert "too many SQL variables" in text, text


async def conflicts_read_as_conflicts(db: Any) -> None:
    # The texts of both constraint failures an append can hit are what
    # `_statements.is_conflict` recognises; any other failure is a StoreError.
    store = d1_store(db)
    await store.create_tables()
    row = _rows.message_row("s", 0, Message.user("a"), 1)
    await db.prepare(_statements.INSERT_MESSAGE).bind(*row).run()
    unique = await _error_text(db.prepare(_statements.INSERT_MESSAGE).bind(*row).run())
    assert _statements.is_conflict(unique), unique
    gap = _rows.message_row("s", 5, Message.user("b"), 1)
    trigger = await _error_text(db.prepare(_statements.INSERT_MESSAGE).bind(*gap).run())
    assert _statements.is_conflict(trigger), trigger


async def conflict_names_session_and_position(db: Any) -> None:
    store = d1_store(db)
    await store.create_tables()
    await store.append_messages_atomic("s", 0, [Message.user("a")])
    late = store.append_messages_atomic("s", 0, [Message.user("late")])
    conflict = await _raised(late, SessionConflictError)
    assert (conflict.session_id, conflict.expected_seq) == ("s", 0)
    assert "UNIQUE constraint failed" in str(conflict), str(conflict)
    negative = store.append_messages_atomic("s", -1, [Message.user("negative")])
    await _raised(negative, SessionConflictError)


async def missing_tables_are_a_store_error(db: Any) -> None:
    store = d1_store(db)
    actions: list[Callable[[], Awaitable[Any]]] = [
        lambda: store.append_messages_atomic("s", 0, [Message.user("a")]),
        lambda: store.load_messages("s"),
        lambda: store.list_sessions(),
        lambda: store.delete_session("s"),
        lambda: store.delete_idle(1),
        lambda: store.find_sessions("s"),
        lambda: store.load_timeline("s"),
    ]
    for action in actions:
        error = await _raised(action(), StoreError)  # not SessionConflictError: not a race
        assert "no such table" in str(error), str(error)


async def timestamps_are_unix_milliseconds(db: Any) -> None:
    store = d1_store(db, clock=ticking_clock(start=1_800_000_000.25, step=0.5))
    await store.create_tables()
    await store.append_messages_atomic("s", 0, [Message.user("a")], agent_name="bot")
    await store.append_messages_atomic("s", 1, [Message.assistant("b", usage=Usage(3, 4))])
    info = await store.get_session("s")
    assert info is not None
    assert (info.created_at, info.updated_at) == (1_800_000_000_250, 1_800_000_000_750), info
    stored = await db.prepare(
        "SELECT seq, created_at, input_tokens, output_tokens FROM agent_messages ORDER BY seq"
    ).raw()
    assert [list(r) for r in stored] == [[0, 1_800_000_000_250, None, None],
                                         [1, 1_800_000_000_750, 3, 4]]  # fmt: skip


async def custom_row_limit_is_enforced_before_writing(db: Any) -> None:
    store = d1_store(db, max_row_bytes=1_000)
    await store.create_tables()
    call = ToolCall("c1", "t", {"big": "x" * 1_000})
    messages = [Message.user("ok"), Message.assistant("", [call])]
    await _raised(store.append_messages_atomic("s", 0, messages), MessageTooLargeError)
    assert await store.get_session("s") is None


async def five_racing_writers_one_wins(db: Any) -> None:
    store = d1_store(db)
    await store.create_tables()
    await store.append_messages_atomic("s", 0, [Message.user("go")])
    batches = [[Message.assistant(f"w{i}-{j}") for j in range(3)] for i in range(5)]
    outcomes = await asyncio.gather(
        *(store.append_messages_atomic("s", 1, b) for b in batches), return_exceptions=True
    )
    winners = [i for i, o in enumerate(outcomes) if o == 4]
    assert len(winners) == 1, outcomes
    assert all(isinstance(o, SessionConflictError) for o in outcomes if o != 4), outcomes
    assert await store.load_messages("s") == [Message.user("go"), *batches[winners[0]]]


class _CountingD1:
    """A binding that records each round trip: ("batch", n statements) or ("run"/"raw", 1)."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.trips: list[tuple[str, int]] = []

    def prepare(self, sql: str) -> Any:
        statement, trips = self.db.prepare(sql), self.trips

        class Counted:
            def __init__(self, inner: Any) -> None:
                self.inner = inner

            def bind(self, *values: Any) -> Any:
                return Counted(self.inner.bind(*values))

            async def run(self) -> Any:
                trips.append(("run", 1))
                return await self.inner.run()

            async def raw(self) -> Any:
                trips.append(("raw", 1))
                return await self.inner.raw()

        return Counted(statement)

    async def batch(self, statements: list[Any]) -> Any:
        self.trips.append(("batch", len(statements)))
        return await self.db.batch([s.inner for s in statements])


async def every_write_is_one_batch(db: Any) -> None:
    counting = _CountingD1(db)
    store = d1_store(counting, clock=ticking_clock())
    await store.create_tables()
    counting.trips.clear()
    await store.append_messages_atomic("s", 0, [Message.user("a"), Message.assistant("b")])
    await store.append_messages_atomic("t", 0, [Message.user("c")], session_name="tee")
    assert counting.trips == [("batch", 3), ("batch", 2)], counting.trips
    counting.trips.clear()
    assert await store.delete_session("s") is True
    # messages, lease, approvals, schedules, row
    assert counting.trips == [("batch", 5)], counting.trips
    counting.trips.clear()
    info = await store.get_session("t")
    assert info is not None
    assert await store.delete_idle(info.updated_at + 1, limit=10) == 1
    assert counting.trips == [("raw", 1), ("batch", 5)], counting.trips
    counting.trips.clear()
    await store.list_sessions(limit=5)
    await store.find_sessions("tee")
    await store.load_timeline("t")
    assert counting.trips == [("raw", 1)] * 3, counting.trips


async def migration_0004_names_and_sums_old_sessions(db: Any) -> None:
    # A database that applied 0001-0003 and holds sessions, then gets 0004.
    for _, statements in _schema.migrations()[:3]:
        for statement in statements:
            await db.prepare(statement).run()
    await db.prepare(
        "INSERT INTO agent_sessions VALUES ('old', 'bot', 'idle', 3, 1000, 2000)"
    ).run()
    for seq, (inp, out) in enumerate([(None, None), (10, 3), (5, 4)]):
        await (
            db.prepare(
                "INSERT INTO agent_messages (session_id, seq, role, content, input_tokens, "
                "output_tokens, created_at) VALUES ('old', ?, 'assistant', 'x', ?, ?, 1000)"
            )
            .bind(seq, inp, out)
            .run()
        )
    for statement in _schema.migrations()[3].statements:  # as wrangler applies the file
        await db.prepare(statement).run()
    store = d1_store(db)
    await store.create_tables()  # on a migrated database: adds nothing twice
    info = await store.get_session("old")
    assert info is not None
    assert (info.name, info.input_tokens, info.output_tokens) == ("old", 15, 7), info
    await store.append_messages_atomic("old", 3, [Message.assistant("y", usage=Usage(1, 2))])
    page = await store.list_sessions()
    assert [(i.id, i.name, i.input_tokens, i.output_tokens) for i in page.sessions] == [
        ("old", "old", 16, 9)
    ], page


CHECKS: tuple[Check, ...] = (
    schema_applies_statement_by_statement,
    multi_line_exec_rejects_the_trigger,
    batch_is_all_or_nothing,
    transactions_are_refused,
    values_keep_their_shape,
    integers_beyond_2_53_minus_2_are_refused,
    the_store_binds_no_integer_d1_refuses,
    too_many_parameters_are_refused,
    conflicts_read_as_conflicts,
    conflict_names_session_and_position,
    missing_tables_are_a_store_error,
    timestamps_are_unix_milliseconds,
    custom_row_limit_is_enforced_before_writing,
    five_racing_writers_one_wins,
    every_write_is_one_batch,
    migration_0004_names_and_sums_old_sessions,
)
