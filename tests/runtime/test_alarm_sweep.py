"""The crash sweep over a session object's alarm (tests/support/alarm_sweep.py), inside workerd:
the turn mark and the alarm in a real Durable Object's storage, the history in the
object's own SQLite (the Durable Object store) or in D1."""

import json

from tests.support.alarm_sweep import crash_loop, deferred_step_meets_a_client, sweep
from workers import DurableObject

from durable_agents.cloudflare import d1_store, durable_object_store


class AlarmProbe(DurableObject):
    async def sweep_on(self, where):
        store = durable_object_store(self.ctx.storage) if where == "do" else d1_store(self.env.DB)
        if where == "d1":
            await store.create_tables()
        report = await sweep(store, self.ctx.storage, prefix=f"alarm-{where}")
        await self.ctx.storage.deleteAlarm()
        return str(report)

    async def crash_loop(self):
        store = durable_object_store(self.ctx.storage)
        outcome = await crash_loop(store, self.ctx.storage, "looping")
        await self.ctx.storage.deleteAlarm()
        history = outcome.pop("history")
        outcome["roles"] = [m.role for m in history]
        outcome["last"] = [history[-1].role, history[-1].origin, history[-1].content]
        outcome["results"] = [[m.tool_name, m.content] for m in history if m.role == "tool"]
        outcome["effects"] = [e.tool_name for e in outcome["effects"]]
        return json.dumps(outcome)

    async def deferred(self):
        store = durable_object_store(self.ctx.storage)
        outcome = await deferred_step_meets_a_client(store, self.ctx.storage, "deferring")
        await self.ctx.storage.deleteAlarm()
        return json.dumps(outcome)

    async def alarm(self, *info):
        pass  # the sweep plays the alarm itself; the real one it sets may fire meanwhile


def _probe(env):
    return env.AlarmProbe.get(env.AlarmProbe.newUniqueId())


async def test_every_crash_point_of_self_resume_and_schedules_on_the_object_store(env):
    report = await _probe(env).sweep_on("do")
    print(f"alarm crash sweep, Durable Object store (workerd): {report}")


async def test_every_crash_point_of_self_resume_and_schedules_on_d1(env):
    report = await _probe(env).sweep_on("d1")
    print(f"alarm crash sweep, D1 (workerd): {report}")


async def test_a_turn_whose_resumes_keep_crashing_is_stopped_after_three_with_back_off(env):
    outcome = json.loads(await _probe(env).crash_loop())
    # The client's turn and three self-resumes each ran the lookup and crashed (and the
    # first ran post and remind, once).
    assert outcome["handler_calls"] == 4 + 2, outcome
    # The first resume at once (a client's turn a reset cut short), then 60 s, 120 s,
    # and the stop after 240 s more: each wait twice the last (30 s x 2**n).
    assert outcome["resumed_after"][0] <= 2, outcome
    assert [round(s) for s in outcome["resumed_after"][1:]] == [61, 121], outcome
    assert outcome["roles"] == ["user", "assistant", "tool", "tool", "tool", "assistant"]
    role, origin, text = outcome["last"]
    assert (role, origin) == ("assistant", "stopped")
    assert "resumed 3 times" in text
    kinds = {name: content for name, content in outcome["results"]}
    assert all("tool-durability-error" in c for c in kinds.values()), kinds  # lookup too
    assert "its turn was stopped" in kinds["lookup"]
    assert outcome["state"] == "stopped"
    assert outcome["mark"] is None
    assert outcome["effects"] == ["post", "remind"]  # each once, never again


async def test_a_deferred_step_goes_on_by_alarm_and_a_client_message_meanwhile_waits(env):
    outcome = json.loads(await _probe(env).deferred())
    assert outcome["first"] == [202, "deferred"], outcome  # room for 4 calls: 4 ran
    assert outcome["client"] == [409, "session-busy"], outcome
    assert outcome["continues"] == [True, True], outcome  # the client left the mark alone
    assert outcome["ran"] == [f"p{i}" for i in range(10)], outcome  # each once, in order
    assert outcome["results"] == 10
    assert outcome["last"] == "all posted"
    assert outcome["users"] == ["post ten"]  # the refused message was never stored
    assert outcome["alarms"] == 2  # 4 + 4 + 2: two alarms after the first invocation
