"""Recurring schedules inside workerd (issue 36): Pyodide has no zone database of its own,
so the Worker ships the `tzdata` package and `cronsim`; a cron rule in Europe/Berlin keeps
09:00 local across the end of summer time, each occurrence fired once on a fake clock by
its turn's first write to a real Durable Object's SQLite. The CPython side of these
checks is tests/test_recurrence.py."""

import datetime
import json
import zoneinfo

from workers import DurableObject

from durable_agents import Agent, LLMResponse, ScheduleError, run, schedule
from durable_agents.cloudflare import durable_object_store
from durable_agents.recurrence import parse_rule
from durable_agents.testing import FunctionLLM

BERLIN = "Europe/Berlin"
AGENT = Agent("rhythm", "Do what the message says.", [])
ECHO = FunctionLLM(lambda messages, tools: LLMResponse(f"done: {messages[-1].content}"))


def test_zones_come_from_the_tzdata_package():
    zone = zoneinfo.ZoneInfo(BERLIN)
    summer = datetime.datetime(2026, 7, 1, 12, tzinfo=zone)
    winter = datetime.datetime(2026, 12, 1, 12, tzinfo=zone)
    assert (summer.utcoffset(), winter.utcoffset()) == (
        datetime.timedelta(hours=2),
        datetime.timedelta(hours=1),
    )
    refused = None
    try:
        parse_rule(cron="0 9 * * *", timezone="Mars/Olympus")
    except ScheduleError as exc:
        refused = str(exc)
    assert refused is not None
    assert "unknown time zone" in refused


class RhythmProbe(DurableObject):
    async def digests(self):
        now = [datetime.datetime(2026, 10, 22, 12, tzinfo=datetime.UTC).timestamp()]
        store = durable_object_store(self.ctx.storage)
        await run(AGENT, llm=ECHO, message="hello", session_id="s", store=store,
                  lease_seconds=None, clock=lambda: now[0])  # fmt: skip
        made = await schedule(store, "s", "digest", cron="0 9 * * *", timezone=BERLIN,
                              clock=lambda: now[0])  # fmt: skip
        dues = [made.due_at]
        for _ in range(5):
            (row,) = await store.load_schedules("s")
            now[0] = row.due_at / 1000
            await run(AGENT, llm=ECHO, message=row.message, session_id="s", store=store,
                      request_key=row.request_key, origin="scheduled", lease_seconds=None,
                      clock=lambda: now[0])  # fmt: skip
            (moved,) = await store.load_schedules("s")
            dues.append(moved.due_at)
        history = await store.load_messages("s")
        keys = [m.request_key for m in history if m.origin == "scheduled" and m.role == "user"]
        return json.dumps({"dues": dues, "keys": keys, "id": made.schedule_id})


async def test_a_berlin_cron_fires_at_nine_local_across_the_end_of_summer_time(env):
    probe = env.RhythmProbe.get(env.RhythmProbe.newUniqueId())
    outcome = json.loads(await probe.digests())
    zone = zoneinfo.ZoneInfo(BERLIN)
    local = [datetime.datetime.fromtimestamp(d / 1000, zone) for d in outcome["dues"]]
    assert [(t.day, t.hour, t.minute) for t in local] == [(d, 9, 0) for d in range(23, 29)]
    assert [t.utcoffset().total_seconds() / 3600 for t in local] == [2, 2, 1, 1, 1, 1]
    # Each occurrence ran once, under its own key.
    assert outcome["keys"] == [f"schedule:{outcome['id']}@{d}" for d in outcome["dues"][:5]]
