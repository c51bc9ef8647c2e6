"""The Durable Object store on CPython, over a sqlite3 stand-in for `ctx.storage`.

The stand-in has the shape of workerd's API (`sql.exec(query, *bindings)`
returning a cursor with `raw()`; `transactionSync(fn)` committing fn's
writes or rolling them back if it throws), so the store's own logic (the
transaction per append, conflict detection, rollback, schema once) is
checked here. It binds as workerd does from Python (measured on workerd by
test_workerd_behaviour.py): True as the text 'true', an int beyond
±(2**53 - 2) refused (Pyodide makes it a BigInt), BEGIN / SAVEPOINT / RELEASE
refused (transactionSync is the only transaction).
"""

from __future__ import annotations

import pytest
from tests.support.crash_sweep import sweep
from tests.support.do_storage import FakeDurableObjectStorage

from durable_agents.cloudflare import DurableObjectStore, durable_object_store
from durable_agents.errors import ConfigurationError, SessionConflictError, StoreError
from durable_agents.messages import Message, Usage
from durable_agents.stores import Store, _limits, _schema
from durable_agents.stores.base import ApprovalChange, Lease
from durable_agents.testing.conformance import CHECKS, Check, ticking_clock


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
    # sqlite_master, the columns of each table a migration altered, the read
    assert len(storage.sql.statements) == 1 + len(_schema.altered_tables()) + 1


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


def test_the_stand_in_binds_as_workerd(storage: FakeDurableObjectStorage) -> None:
    storage.sql.exec("CREATE TABLE v (x)")
    storage.sql.exec("INSERT INTO v VALUES (?), (?), (?)", True, 2**53 - 2, -(2**53 - 2))
    rows = storage.sql.exec("SELECT x, typeof(x) FROM v").raw()
    assert list(rows) == [("true", "text"), (2**53 - 2, "integer"), (-(2**53 - 2), "integer")]
    for beyond in (2**53 - 1, -(2**53 - 1), 2**63):
        with pytest.raises(TypeError, match="BigInt"):
            storage.sql.exec("INSERT INTO v VALUES (?)", beyond)
    for statement in ("BEGIN", "SAVEPOINT a", "RELEASE a"):
        with pytest.raises(RuntimeError, match="transactionSync"):
            storage.sql.exec(statement)


async def test_the_first_page_binds_nothing_beyond_2_53(storage: FakeDurableObjectStorage) -> None:
    # Was: the first page bound 2**53 - 1 as its cursor, a BigInt on workerd: a 503.
    store = durable_object_store(storage, clock=ticking_clock())
    for name in ("a", "b", "c"):
        await store.append_messages_atomic(name, 0, [Message.user(name)])
    page = await store.list_sessions(limit=2)
    assert [i.id for i in page.sessions] == ["c", "b"]
    rest = await store.list_sessions(limit=2**60, cursor=page.next_cursor)  # clamped, not bound
    assert [i.id for i in rest.sessions] == ["a"]
    assert rest.next_cursor is None


async def test_no_bool_and_no_bigint_is_ever_bound(storage: FakeDurableObjectStorage) -> None:
    store = durable_object_store(storage, clock=ticking_clock())
    await store.append_messages_atomic("s", 0, [Message.user("q")], approvals=[])
    assert await store.acquire_lease("s", "run", 2**60) is None  # held "forever": clamped
    await store.append_messages_atomic(
        "s", 1, [Message.assistant("a", usage=Usage(2**53 - 2, 0))], lease=Lease("run", 2**60)
    )
    await store.list_sessions()
    assert await store.delete_idle(-(2**60)) == 0
    assert await store.delete_idle(2**60, limit=2**60) == 1
    ints = [v for v in storage.sql.bound if isinstance(v, int)]
    assert ints  # the log saw them
    assert not [v for v in ints if isinstance(v, bool) or abs(v) > 2**53 - 2], ints


async def test_an_integer_beyond_2_53_is_refused_by_name(
    storage: FakeDurableObjectStorage,
) -> None:
    store = durable_object_store(storage, clock=ticking_clock())
    await store.append_messages_atomic("s", 0, [Message.user("q")])
    too_many = Message.assistant("a", usage=Usage(3, 2**53 - 1))
    with pytest.raises(
        StoreError, match=r"output tokens of message 1 \(assistant\) is 9007199254740991"
    ):
        await store.append_messages_atomic("s", 1, [too_many])
    assert await store.load_messages("s") == [Message.user("q")]
    with pytest.raises(SessionConflictError, match="no session holds more than"):
        await store.append_messages_atomic("s", 2**53 - 2, [Message.user("far")])
    info = await store.get_session("s")
    assert info is not None
    assert (info.message_count, info.output_tokens) == (1, 0)


def test_bools_are_bound_as_integers() -> None:
    assert _limits.bound_params("UPDATE t SET x = ?", [True, False, None, 1, "s"]) == [
        1,
        0,
        None,
        1,
        "s",
    ]
    with pytest.raises(StoreError, match="'t' is -9007199254740991"):
        _limits.bound_params("UPDATE t SET x = ?", [-(2**53 - 1)])
