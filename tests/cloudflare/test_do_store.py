"""The Durable Object store on CPython, over a sqlite3 stand-in for `ctx.storage`.

The stand-in has the shape of workerd's API (`sql.exec(query, *bindings)`
returning a cursor with `raw()`; `transactionSync(fn)` committing fn's
writes or rolling them back if it throws), so the store's own logic (the
transaction per append, conflict detection, rollback, schema once) is
checked here; tests/runtime/test_do_store.py runs the same checks on the
runtime's real `ctx.storage` inside Pyodide.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from crash_sweep import sweep
from durable_agents.cloudflare import DurableObjectStore, durable_object_store
from durable_agents.errors import ConfigurationError, SessionConflictError, StoreError
from durable_agents.messages import Message
from durable_agents.stores import Store
from durable_agents.stores.base import ApprovalChange
from durable_agents.testing.conformance import CHECKS, Check, ticking_clock


class _Cursor:
    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self._rows = rows

    def raw(self) -> Iterator[tuple[Any, ...]]:
        return iter(self._rows)


class _Sql:
    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection
        self.statements: list[str] = []

    def exec(self, query: str, *bindings: Any) -> _Cursor:
        self.statements.append(query)
        return _Cursor(self._connection.execute(query, bindings).fetchall())


class FakeDurableObjectStorage:
    """`ctx.storage`'s SQL half on sqlite3 (autocommit outside transactionSync, as on workerd)."""

    def __init__(self) -> None:
        self.connection = sqlite3.connect(":memory:", isolation_level=None)
        self.sql = _Sql(self.connection)
        self.transactions = 0

    def transactionSync(self, callback: Callable[[], Any]) -> Any:
        self.transactions += 1
        self.connection.execute("SAVEPOINT tx")
        try:
            result = callback()
        except BaseException:
            self.connection.execute("ROLLBACK TO tx")
            self.connection.execute("RELEASE tx")
            raise
        self.connection.execute("RELEASE tx")
        return result


@pytest.fixture
def storage() -> FakeDurableObjectStorage:
    return FakeDurableObjectStorage()


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
async def test_store_contract(storage: FakeDurableObjectStorage, check: Check) -> None:
    await check(durable_object_store(storage, clock=ticking_clock()))


async def test_crash_sweep(storage: FakeDurableObjectStorage) -> None:
    store = durable_object_store(storage)
    report = await sweep(store, prefix="do-sweep")
    assert report.scenarios == 2 * (report.baseline_appends + report.baseline_handler_calls)


async def test_is_a_durable_store(storage: FakeDurableObjectStorage) -> None:
    store = durable_object_store(storage)
    assert isinstance(store, Store)
    assert isinstance(store, DurableObjectStore)
    assert store.durable


async def test_each_append_is_one_transaction(storage: FakeDurableObjectStorage) -> None:
    store = durable_object_store(storage)
    await store.load_messages("s")  # the schema: one transaction of its own
    before = storage.transactions
    await store.append_messages_atomic("s", 0, [Message.user(str(n)) for n in range(5)])
    await store.append_messages_atomic("s", 5, [Message.assistant("ok")])
    assert storage.transactions - before == 2
    assert [m.content for m in await store.load_messages("s")] == ["0", "1", "2", "3", "4", "ok"]


async def test_schema_is_applied_once_per_object(storage: FakeDurableObjectStorage) -> None:
    await durable_object_store(storage).load_messages("s")
    storage.sql.statements.clear()
    transactions = storage.transactions
    # A new store on the same object finds the schema and only reads the catalogue.
    await durable_object_store(storage).load_messages("s")
    assert storage.transactions == transactions
    assert not [s for s in storage.sql.statements if s.startswith(("CREATE", "ALTER", "UPDATE"))]
    assert len(storage.sql.statements) == 3  # sqlite_master, table_info, the read


async def test_a_failed_statement_rolls_the_whole_append_back(
    storage: FakeDurableObjectStorage,
) -> None:
    store = durable_object_store(storage)
    await store.append_messages_atomic("s", 0, [Message.user("hi")])
    # The messages would land, but a decision for a call never requested fails: nothing lands.
    denied = ApprovalChange("call_1", "approved", digest="d")
    with pytest.raises(SessionConflictError):
        await store.append_messages_atomic("s", 1, [Message.assistant("a")], approvals=[denied])
    assert [m.content for m in await store.load_messages("s")] == ["hi"]
    info = await store.get_session("s")
    assert info is not None
    assert info.message_count == 1


async def test_a_stale_position_is_a_conflict(storage: FakeDurableObjectStorage) -> None:
    store = durable_object_store(storage)
    await store.append_messages_atomic("s", 0, [Message.user("a"), Message.assistant("b")])
    for stale in (0, 1, 3):
        with pytest.raises(SessionConflictError):
            await store.append_messages_atomic("s", stale, [Message.user("c")])
    assert len(await store.load_messages("s")) == 2


async def test_an_engine_failure_is_a_store_error_with_nothing_written(
    storage: FakeDurableObjectStorage,
) -> None:
    store = durable_object_store(storage)
    await store.append_messages_atomic("s", 0, [Message.user("a")])
    storage.connection.execute("DROP TABLE agent_approvals")  # the engine now fails mid-append
    request = ApprovalChange("call_1", "requested", digest="d", tool_name="t")
    with pytest.raises(StoreError, match="nothing was written") as caught:
        await store.append_messages_atomic("s", 1, [Message.assistant("b")], approvals=[request])
    assert not isinstance(caught.value, SessionConflictError)
    assert [m.content for m in await store.load_messages("s")] == ["a"]


async def test_the_sdk_wrapper_is_unwrapped(storage: FakeDurableObjectStorage) -> None:
    class _BindingWrapper:  # the workers SDK's wrapper, by name
        def __init__(self, binding: object) -> None:
            self._binding = binding

    store = durable_object_store(_BindingWrapper(storage))
    await store.append_messages_atomic("s", 0, [Message.user("a")])
    assert storage.transactions >= 1


def test_rows_must_stay_below_the_2_mb_value_limit(storage: FakeDurableObjectStorage) -> None:
    with pytest.raises(ConfigurationError):
        durable_object_store(storage, max_row_bytes=2 * 1024 * 1024)
