"""The Durable Object store on a real Durable Object's `ctx.storage`, inside workerd.

`StoreProbe` (a Durable Object class) is bound as `env.StoreProbe` by the test
Worker (`durable_agents.testing.pytest_plugin`); each test calls a fresh object
(`newUniqueId()`: an empty database) over RPC, and the object builds
`durable_object_store(self.ctx.storage)` (the SDK-wrapped storage, as a Worker's
object gets it: workerd's SQLite-backed storage) and runs the check there.
"""

import time

from tests.support.crash_sweep import sweep
from workers import DurableObject

from durable_agents.cloudflare import d1_store, durable_object_store
from durable_agents.errors import SessionConflictError, StoreError
from durable_agents.messages import Message
from durable_agents.stores import _schema
from durable_agents.stores.base import ApprovalChange
from durable_agents.testing import conformance


class StoreProbe(DurableObject):
    async def conformance(self, name):
        store = durable_object_store(self.ctx.storage, clock=conformance.ticking_clock())
        await getattr(conformance, name)(store)
        return "ok"

    async def crash_sweep(self):
        report = await sweep(durable_object_store(self.ctx.storage), prefix="do-sweep")
        assert report.scenarios == 2 * (report.baseline_appends + report.baseline_handler_calls)
        return str(report)

    async def rollback(self):
        store = durable_object_store(self.ctx.storage)
        await store.append_messages_atomic("s", 0, [Message.user("hi")])
        kinds = []
        # A decision for a call never requested fails inside transactionSync: nothing lands.
        approve = ApprovalChange("call_1", "approved", digest="d")
        try:
            await store.append_messages_atomic(
                "s", 1, [Message.assistant("a")], approvals=[approve]
            )
        except SessionConflictError:
            kinds.append("conflict")
        try:
            await store.append_messages_atomic("s", 0, [Message.user("again")])
        except SessionConflictError:
            kinds.append("conflict")
        self.ctx.storage.sql.exec("DROP TABLE agent_approvals")
        request = ApprovalChange("call_1", "requested", digest="d", tool_name="t")
        try:
            await store.append_messages_atomic(
                "s", 1, [Message.assistant("b")], approvals=[request]
            )
        except SessionConflictError:
            kinds.append("conflict?")
        except StoreError as exc:
            kinds.append("store error" if "nothing was written" in str(exc) else str(exc))
        contents = [m.content for m in await store.load_messages("s")]
        info = await store.get_session("s")
        return {"kinds": kinds, "contents": contents, "count": info.message_count}

    async def schema_once(self):
        await durable_object_store(self.ctx.storage).load_messages("s")
        seen = []
        real = self.ctx.storage._binding  # the JS object, as the store unwraps it

        class Counting:
            def __init__(self):
                self.sql = self
                self.transactions = 0

            def exec(self, query, *bindings):
                seen.append(query)
                return real.sql.exec(query, *bindings)

            def transactionSync(self, callback):
                self.transactions += 1
                return real.transactionSync(callback)

        counting = Counting()
        store = durable_object_store(counting)
        await store.load_messages("s")
        await store.append_messages_atomic("s", 0, [Message.user(str(n)) for n in range(5)])
        return {
            "statements": len(seen),
            "transactions": counting.transactions,
            "ddl": [s for s in seen if s.startswith(("CREATE", "ALTER"))],
        }

    async def python_error_rolls_back(self):
        store = durable_object_store(self.ctx.storage)
        await store.append_messages_atomic("s", 0, [Message.user("hi")])

        def half_then_fail():
            store._exec("DELETE FROM agent_messages")
            raise ValueError("raised in Python, inside transactionSync")

        try:
            store._transaction(half_then_fail)
        except ValueError as exc:
            error = f"ValueError: {exc}"
        return {"error": error, "contents": [m.content for m in await store.load_messages("s")]}

    async def time_appends(self, n):
        store = durable_object_store(self.ctx.storage)
        await store.load_messages("warm")
        started = time.perf_counter()
        for seq in range(n):
            await store.append_messages_atomic("t", seq, [Message.user(str(seq))])
        return (time.perf_counter() - started) * 1000 / n


def _probe(env, name):
    """A fresh StoreProbe (`name` only says what for: every test gets a new object)."""
    return env.StoreProbe.get(env.StoreProbe.newUniqueId())


async def test_store_contract(conformance_check, env):
    assert await _probe(env, conformance_check).conformance(conformance_check) == "ok"


async def test_every_crash_point_keeps_tools_at_most_once_on_the_object(env):
    report = await _probe(env, "sweep").crash_sweep()
    print(f"crash sweep on the Durable Object store (workerd): {report}")


async def test_a_failed_transaction_rolls_back_and_surfaces_as_its_error(env):
    result = await _probe(env, "rollback").rollback()
    assert result == {
        "kinds": ["conflict", "conflict", "store error"],
        "contents": ["hi"],
        "count": 1,
    }


async def test_schema_once_and_one_transaction_per_append(env):
    result = await _probe(env, "schema").schema_once()
    # sqlite_master + a table_info per altered table + the read; then 5 inserts and the
    # upsert in ONE transaction.
    reads = 1 + len(_schema.altered_tables()) + 1
    assert result == {"statements": reads + 6, "transactions": 1, "ddl": []}


async def test_the_schema_is_read_from_the_migration_files_beside_the_modules():
    # Inside workerd: the .sql files are Text modules of the Worker, which Python reads as
    # files beside the modules (/session/metadata/...), with importlib.resources.
    import sys

    assert sys.platform == "emscripten"
    names = [migration.name for migration in _schema.migrations()]
    assert names[:2] == ["0001_init.sql", "0002_session_leases.sql"], names
    assert _schema.migrations()[0].statements[0].startswith("CREATE TABLE IF NOT EXISTS")
    assert _schema.__file__.startswith("/session/metadata/"), _schema.__file__


async def test_a_python_exception_inside_the_transaction_rolls_back_and_surfaces(env):
    result = await _probe(env, "python-error").python_error_rolls_back()
    assert result == {
        "error": "ValueError: raised in Python, inside transactionSync",
        "contents": ["hi"],
    }


async def test_append_cost_against_d1(env):
    # Not a benchmark (issue 14 item 4 is): one figure each, same runtime, printed.
    n = 200
    do_ms = await _probe(env, "timing").time_appends(n)
    store = d1_store(env.DB)
    await store.create_tables()
    started = time.perf_counter()
    for seq in range(n):
        await store.append_messages_atomic("t", seq, [Message.user(str(seq))])
    d1_ms = (time.perf_counter() - started) * 1000 / n
    print(
        f"ms per 1-message append: Durable Object store {do_ms:.3f}, D1 {d1_ms:.3f}, "
        f"ratio {do_ms / d1_ms:.3f}"
    )
    assert len(await store.load_messages("t")) == n
