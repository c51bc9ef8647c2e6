"""D1's limits on statements and batches, held by every SQL store (`stores/_limits.py`).

D1 refuses a statement of more than 100 bound parameters or 100 KB of SQL, a
value over 2 MB, and a batch of more statements than an invocation may make
queries (50 on Workers Free); miniflare's D1 and CPython's SQLite refuse only
some of that. An append of one INSERT per row made a step of 1,000 tool calls a
batch of 1,002 statements: now such an append is packed (its rows as JSON, a
few INSERT ... SELECT FROM json_each statements), and every statement is checked
before anything is written. Here: the packed form keeps the whole store contract
on every CPython backend (SQLite, D1 over sqlite3, the Durable Object store over
sqlite3), big steps are a few statements, and what D1 would refuse is refused.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.do_storage import FakeDurableObjectStorage

from durable_agents.cloudflare import d1_store, durable_object_store
from durable_agents.errors import SessionConflictError, StoreError
from durable_agents.messages import Message, ToolCall, Usage
from durable_agents.stores import (
    Store,
    _appends,
    _limits,
    _rows,
    _schema,
    _statements,
    sqlite_store,
)
from durable_agents.stores.base import ApprovalChange, Lease
from durable_agents.testing.conformance import CHECKS, Check, ticking_clock
from durable_agents.testing.fake_d1 import FakeD1Database


@pytest.fixture(params=["sqlite", "d1-fake", "durable-object"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """Each SQL store on CPython, fresh and empty."""
    if request.param == "sqlite":
        sqlite = sqlite_store(tmp_path / "store.db", clock=ticking_clock())
        yield sqlite
        await sqlite.close()
    elif request.param == "d1-fake":
        database = FakeD1Database(str(tmp_path / "d1.db"))
        d1 = d1_store(database, clock=ticking_clock())
        await d1.create_tables()
        yield d1
        database.close()
    else:
        yield durable_object_store(FakeDurableObjectStorage(), clock=ticking_clock())


@pytest.fixture
def every_append_packed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pack every append, however small (normally only one past MAX_BATCH_STATEMENTS)."""
    monkeypatch.setattr(_appends, "PACK_ABOVE", 0)


def _step(calls: int, prefix: str = "c") -> list[Message]:
    """One step of `calls` tool calls and their results, as the run loop appends it."""
    tool_calls = [ToolCall(f"{prefix}{n}", "get_issue", {"id": str(n)}) for n in range(calls)]
    results = [Message.tool_result(c, f'{{"id": "{c.id}", "title": "é😀"}}') for c in tool_calls]
    return [Message.assistant("", tool_calls, Usage(11, 7)), *results]


def _append_statements(messages: list[Message], **kwargs: Any) -> list[_limits.Statement]:
    options: dict[str, Any] = {"agent_name": "a", "lease": None, "approvals": ()}
    return _appends.append_statements("s", 1, messages, 1, **{**options, **kwargs})


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
async def test_packed_appends_keep_the_store_contract(
    every_append_packed: None, store: Store, check: Check
) -> None:
    await check(store)


async def test_a_thousand_call_step_is_a_few_statements_and_round_trips(store: Store) -> None:
    await store.append_messages_atomic("s", 0, [Message.user("go")])
    step = _step(1000)
    statements = _append_statements(step, lease=Lease("me", 30_000))
    assert [sql for sql, _ in statements] == [
        _appends.INSERT_MESSAGES, _statements.UPSERT_SESSION, _statements.RENEW_LEASE,
    ]  # fmt: skip
    assert await store.append_messages_atomic("s", 1, step[:1]) == 2
    assert await store.append_messages_atomic("s", 2, step[1:]) == 1002
    assert await store.load_messages("s") == [Message.user("go"), *step]
    # A stale writer of a packed append still conflicts, and writes nothing.
    with pytest.raises(SessionConflictError):
        await store.append_messages_atomic("s", 2, step[1:])
    assert len(await store.load_messages("s")) == 1002


def test_a_pack_ends_before_its_json_would_pass_the_value_limit(every_append_packed: None) -> None:
    big = [Message.user("x" * 700_000) for _ in range(5)]
    huge = Message.user('"' * 1_000_000)  # 2 MB as JSON: too big for any pack
    statements = _append_statements([*big, huge, Message.user("after")])
    packs = [params for sql, params in statements if sql == _appends.INSERT_MESSAGES]
    assert [p[1] for p in packs] == [1, 3, 5, 7]  # the first seq of each pack
    assert (_statements.INSERT_MESSAGE, _rows.message_row("s", 6, huge, 1)) in statements
    assert all(len(p[3].encode()) <= _appends.PACK_BYTES for p in packs)


async def test_texts_json_must_escape_round_trip_packed(
    every_append_packed: None, store: Store
) -> None:
    # SQLite's json_extract on CPython (3.40) ends a text at an escaped U+0000: a
    # packed text spells U+0000 and U+0001 with U+0001, and the statement undoes it.
    texts = ["\x00", "\x01", "\x01\x00\x02", "\x00\x01\x01\x02", 'q"b\\s\n', "\u2028é😀"]
    call = ToolCall("c\x00\x01", "t\x01", {"a": "\x00"})
    messages = [
        *(Message.user(text) for text in texts),
        Message.assistant("\x01", [call]),
        Message.tool_result(call, "r\x00"),
        Message("user", "k", request_key="k\x01\x00"),
    ]
    assert {sql for sql, _ in _append_statements(messages)} == {
        _appends.INSERT_MESSAGES,
        _statements.UPSERT_SESSION,
    }
    await store.append_messages_atomic("s", 0, messages)
    assert await store.load_messages("s") == messages
    requests = [ApprovalChange("c\x00\x01", "requested", "d\x00", tool_name="t\x01")]
    decision = [ApprovalChange("c\x00\x01", "approved", "d\x00", reason="\x01\x00ok")]
    await store.append_messages_atomic("s", len(messages), [], approvals=requests)
    await store.append_messages_atomic("s", len(messages), [], approvals=decision)
    events = await store.load_approvals("s")
    assert [(e.tool_call_id, e.event, e.tool_name, e.digest, e.reason) for e in events] == [
        ("c\x00\x01", "requested", "t\x01", "d\x00", None),
        ("c\x00\x01", "approved", "t\x01", "d\x00", "\x01\x00ok"),
    ]


async def test_requests_decisions_and_claims_of_a_big_step_are_packed(store: Store) -> None:
    calls = 60
    requests = [
        ApprovalChange(f"c{n}", "requested", f"d{n}", tool_name="refund") for n in range(calls)
    ]
    step = _step(calls)[:1]
    assert [sql for sql, _ in _append_statements(step, approvals=requests)] == [
        _appends.INSERT_MESSAGES, _statements.UPSERT_SESSION, _appends.REQUEST_APPROVALS,
    ]  # fmt: skip
    await store.append_messages_atomic("s", 0, [Message.user("go"), *step], approvals=requests)
    decisions = [ApprovalChange(f"c{n}", "approved", f"d{n}", reason="ok") for n in range(calls)]
    claims = [ApprovalChange(f"c{n}", "claimed", f"d{n}") for n in range(calls)]
    # A claim may depend on an approval of the same append: a pack ends before a
    # call id repeats, so the claims' statement sees the approvals landed.
    later = decisions[2:] + claims[2:]
    assert [sql for sql, _ in _append_statements([], approvals=later)] == [
        _appends.DEPENDENT_APPROVALS, _appends.DEPENDENT_APPROVALS,
    ]  # fmt: skip
    first = decisions[:2] + claims[:2]
    await store.append_messages_atomic("s", 2, [], approvals=first)
    await store.append_messages_atomic("s", 2, [], approvals=later)
    events = await store.load_approvals("s")
    assert [(e.tool_call_id, e.event) for e in events] == [
        (c.tool_call_id, c.event) for c in [*requests, *first, *later]
    ]
    assert {e.tool_name for e in events} == {"refund"}
    assert {e.reason for e in events if e.event == "approved"} == {"ok"}


async def test_a_refused_claim_inside_a_pack_writes_nothing(store: Store) -> None:
    requests = [ApprovalChange(f"c{n}", "requested", "d", tool_name="t") for n in range(60)]
    await store.append_messages_atomic("s", 0, [Message.user("go")], approvals=requests)
    claims = [ApprovalChange(f"c{n}", "claimed", "d") for n in range(60)]  # none approved
    with pytest.raises(SessionConflictError):
        await store.append_messages_atomic("s", 1, [Message.assistant("x")], approvals=claims)
    assert len(await store.load_approvals("s")) == 60
    assert await store.load_messages("s") == [Message.user("go")]


async def test_an_append_too_big_for_one_batch_even_packed_is_refused(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_appends, "PACK_BYTES", 100)  # each row alone: 51 statements
    rows = [Message.user("x" * 100) for _ in range(_limits.MAX_BATCH_STATEMENTS)]
    with pytest.raises(StoreError, match="51 statements, more than the 50 D1 runs in one batch"):
        await store.append_messages_atomic("s", 0, rows)
    assert await store.load_messages("s") == []
    assert await store.get_session("s") is None


def _kit_statements() -> dict[str, str]:
    """Every SQL statement the stores define, by name (the schema's by position)."""
    found: dict[str, str] = {}
    for module in (_statements, _appends):
        for name, value in vars(module).items():
            if isinstance(value, str) and re.match(
                r"\s*(SELECT|INSERT|UPDATE|DELETE|PRAGMA)", value
            ):
                found[name] = value
    found.update({f"SCHEMA[{i}]": s for i, s in enumerate(_schema.schema())})
    found.update({f"DELETE_IDLE[{i}]": s for i, s in enumerate(_statements.DELETE_IDLE)})
    return found


def test_every_statement_of_the_kit_is_within_d1_limits() -> None:
    statements = _kit_statements()
    assert {"INSERT_MESSAGE", "INSERT_MESSAGES", "REQUEST_APPROVALS"} <= statements.keys()
    for name, sql in statements.items():
        assert sql.count("?") <= 14, name
        assert len(sql.encode()) < _limits.MAX_SQL_BYTES // 50, name  # 2 KB: far within


def test_a_statement_past_a_d1_limit_is_refused_before_binding() -> None:
    too_many = "SELECT " + ", ".join("?" for _ in range(101))
    cases: list[tuple[str, tuple[Any, ...], str]] = [
        (too_many, tuple(range(101)), "binds 101 parameters"),
        ("SELECT '" + "x" * 100_000 + "'", (), "100009 bytes of SQL"),
        ("SELECT ?", ("é" * 1_000_001,), "a value of 2000002 bytes"),
        ("SELECT ?", (b"x" * 2_000_001,), "a value of 2000001 bytes"),
    ]
    for sql, params, problem in cases:
        with pytest.raises(StoreError, match=problem):
            _limits.check_statement(sql, params)
        with pytest.raises(StoreError, match=problem):
            _limits.bound_params(sql, params)  # D1's and the Durable Object's every bind
    _limits.check_statement("SELECT " + ", ".join("?" for _ in range(100)), tuple(range(100)))
    _limits.check_statement("SELECT ?", ("x" * 2_000_000,))
    with pytest.raises(StoreError, match="51 statements"):
        _limits.check_batch([("SELECT 1", ())] * 51, "s")
