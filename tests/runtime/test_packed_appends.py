"""Packed appends (`_appends.append_statements` past MAX_BATCH_STATEMENTS) on workerd's
own SQLite: D1 (miniflare's, through the workers SDK) and a Durable Object's.

Every append of the whole store contract goes packed here (`PACK_ABOVE` set to 0
for the test): rows as JSON in INSERT ... SELECT FROM json_each(?). And a step
of 1,000 tool calls, with texts JSON must escape (a NUL too), is one batch of
two statements on D1 and round-trips on both.
"""

from workers import DurableObject

from durable_agents.cloudflare import d1_store, durable_object_store
from durable_agents.messages import Message, ToolCall, Usage
from durable_agents.stores import _appends
from durable_agents.testing import conformance

# What JSON escapes or spells out, and what a packed text spells with U+0001.
TEXTS = [
    'q"b\\s\n\t',
    "\u2028\u2029",
    "\x01\x1f\x7f",
    "é€😀\U0010ffff",
    "null",
    "[1]",
    "a\x00\x01b",
]


def _big_step(calls):
    tool_calls = [ToolCall(f"c{n}", "get_issue", {"id": str(n)}) for n in range(calls)]
    results = [
        Message.tool_result(call, TEXTS[n % len(TEXTS)] * (n % 3 + 1))
        for n, call in enumerate(tool_calls)
    ]
    return [Message.user("go"), Message.assistant("", tool_calls, Usage(11, 7)), *results]


async def _every_append_packed(check):
    before = _appends.PACK_ABOVE
    _appends.PACK_ABOVE = 0
    try:
        await check
    finally:
        _appends.PACK_ABOVE = before


class PackedStoreProbe(DurableObject):
    async def conformance(self, name):
        store = durable_object_store(self.ctx.storage, clock=conformance.ticking_clock())
        await _every_append_packed(getattr(conformance, name)(store))
        return "ok"

    async def big_step(self, calls):
        store = durable_object_store(self.ctx.storage)
        step = _big_step(calls)
        await store.append_messages_atomic("s", 0, step)
        return await store.load_messages("s") == step


async def test_packed_d1_keeps_the_store_contract(conformance_check, env):
    store = d1_store(env.DB, clock=conformance.ticking_clock())
    await store.create_tables()
    await _every_append_packed(getattr(conformance, conformance_check)(store))


async def test_packed_durable_object_store_keeps_the_store_contract(conformance_check, env):
    probe = env.PackedStoreProbe.get(env.PackedStoreProbe.newUniqueId())
    assert await probe.conformance(conformance_check) == "ok"


async def test_a_thousand_call_step_is_one_batch_of_few_statements_on_d1(env):
    batches = []

    class CountingD1:
        def prepare(self, sql):
            return env.DB.prepare(sql)

        async def batch(self, statements):
            batches.append(len(statements))
            return await env.DB.batch(statements)

    store = d1_store(CountingD1())
    await store.create_tables()
    step = _big_step(1000)
    await store.append_messages_atomic("s", 0, step)
    assert batches == [2], batches  # the packed rows, the session row
    assert await store.load_messages("s") == step


async def test_a_thousand_call_step_round_trips_on_a_durable_object(env):
    probe = env.PackedStoreProbe.get(env.PackedStoreProbe.newUniqueId())
    assert await probe.big_step(1000) is True
