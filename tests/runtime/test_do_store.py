"""The Durable Object store on a real local Durable Object's `ctx.storage`, inside Pyodide.

Each test binds `StoreProbe` (a Durable Object class) with the harness's
`_local_runtime` and calls it over RPC; the object builds
`durable_object_store(self.ctx.storage)` (the SDK-wrapped storage, as a Worker's
object gets it: runtime/storage.mjs's SqlStorage over better-sqlite3) and runs
the check there. A fresh binding per test: a fresh object, an empty database.
"""

import _local_runtime
from workers import DurableObject

from crash_sweep import sweep
from durable_agents.cloudflare import durable_object_store
from durable_agents.errors import SessionConflictError, StoreError
from durable_agents.messages import Message
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


def _probe(env, name):
    _local_runtime.durableObjectNamespace("STORE_PROBES", StoreProbe)
    return env.STORE_PROBES.getByName(name)


async def test_store_contract(conformance_check, env):
    assert await _probe(env, conformance_check).conformance(conformance_check) == "ok"


async def test_every_crash_point_keeps_tools_at_most_once_on_the_object(env):
    report = await _probe(env, "sweep").crash_sweep()
    print(f"crash sweep on the Durable Object store (local runtime): {report}")


async def test_a_failed_transaction_rolls_back_and_surfaces_as_its_error(env):
    result = await _probe(env, "rollback").rollback()
    assert result == {
        "kinds": ["conflict", "conflict", "store error"],
        "contents": ["hi"],
        "count": 1,
    }


async def test_schema_once_and_one_transaction_per_append(env):
    result = await _probe(env, "schema").schema_once()
    # sqlite_master + table_info + the read; then 5 inserts and the upsert in ONE transaction.
    assert result == {"statements": 3 + 6, "transactions": 1, "ddl": []}
