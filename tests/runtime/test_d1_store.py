"""The D1 store against workerd's D1, inside workerd, through the workers SDK's wrapper."""

from tests.support import d1_checks

from durable_agents.cloudflare import d1_store
from durable_agents.testing import conformance


async def test_store_contract(conformance_check, env):
    store = d1_store(env.DB, clock=conformance.ticking_clock())
    await store.create_tables()
    check = getattr(conformance, conformance_check)
    await check(store)


async def test_d1_binding(d1_check, env):
    await getattr(d1_checks, d1_check)(env.DB)


async def test_binding_is_the_sdk_wrapped_d1(env):
    from pyodide.ffi import JsException
    from workers.rpc import _BindingWrapper

    assert isinstance(env.DB, _BindingWrapper)
    error = None
    try:
        await env.DB.prepare("SELECT * FROM missing").run()
    except JsException as exc:
        error = str(exc)
    assert error is not None, "a query on a missing table succeeded"
    assert "D1_ERROR: no such table: missing" in error


async def test_append_is_one_batch(env):
    # One append = one batch() = one round trip, whatever the message count.
    calls = []

    class CountingD1:
        def __init__(self, db):
            self._db = db

        def prepare(self, sql):
            return self._db.prepare(sql)

        async def batch(self, statements):
            calls.append(len(statements))
            return await self._db.batch(statements)

    from durable_agents.messages import Message

    store = d1_store(CountingD1(env.DB))
    await store.create_tables()
    await store.append_messages_atomic("s", 0, [Message.user(str(n)) for n in range(5)])
    assert calls == [6]  # 5 inserts + the session upsert
