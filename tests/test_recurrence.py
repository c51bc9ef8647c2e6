"""Recurring schedules on CPython (`durable_agents.recurrence`, issue 36): each occurrence
runs once on a clock the test moves, fired by `work_once` (what `durable-agents worker`
runs) on a real SQLite file; missed occurrences collapse into one catch-up turn; a cron
rule in Europe/Berlin keeps 09:00 local across both daylight-saving changes; bad rules
are refused with what is wrong. The kill -9 of a real worker during an occurrence is
tests/test_worker.py's; the Worker's API, tests/cloudflare/test_app_schedules.py.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import AsyncIterator
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from pydantic import BaseModel

from durable_agents import (
    Agent,
    LLMResponse,
    Message,
    ScheduleError,
    ToolCall,
    ToolContext,
    approve,
    pending_approvals,
    run,
    schedule,
    tool,
)
from durable_agents.recurrence import Rule, advanced, parse_rule
from durable_agents.schedules import MAX_SCHEDULES_PER_SESSION, fired_by
from durable_agents.stores import SQLiteStore, sqlite_store
from durable_agents.stores.base import Schedule
from durable_agents.testing import FunctionLLM
from durable_agents.worker import Runner, WorkReport, work_once

BERLIN = ZoneInfo("Europe/Berlin")
START = datetime.datetime(2026, 10, 22, 12, 0, tzinfo=datetime.UTC).timestamp()


class Clock:
    """Seconds that move only when the test says so."""

    def __init__(self, start: float = START) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def set(self, unix_ms: int) -> None:
        self.now = unix_ms / 1000


DEPLOY = tool(
    name="deploy", description="Deploy.", input={"properties": {}}, requires_approval=True
)
AGENT = Agent("rhythm", "Do what the message says.", [DEPLOY])


def echo_llm(seen: list[str]) -> FunctionLLM:
    """Answers each turn's message with "done: <message>" (and asks for a deploy when
    told to); `seen` gets each turn's message as the model first sees it."""

    def answer(messages: list[Message], tools: object) -> LLMResponse:
        last = messages[-1]
        if last.role == "user":
            seen.append(last.content)
            if last.content == "deploy":
                return LLMResponse("Deploying.", [ToolCall("", "deploy", {})])
        return LLMResponse(f"done: {last.content}")

    return FunctionLLM(answer)


class Nothing(BaseModel):
    """A tool's empty arguments."""


TOOLS = {"deploy": lambda args, ctx: "deployed"}


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def store(tmp_path: Path, clock: Clock) -> AsyncIterator[SQLiteStore]:
    opened = sqlite_store(tmp_path / "rhythm.db", clock=clock)
    yield opened
    await opened.close()


async def started(store: SQLiteStore, clock: Clock, seen: list[str]) -> Runner[None]:
    """Session "s" with one turn done; the runner the worker passes would run."""
    done = await run(
        AGENT, llm=echo_llm(seen), message="hello", session_id="s", store=store, tools=TOOLS,
        clock=clock,
    )  # fmt: skip
    assert done.status == "complete"
    return Runner(AGENT, echo_llm(seen), tools=TOOLS, clock=clock)


def fired(report: WorkReport) -> list[str]:
    return [i.outcome for i in report.items if i.action == "fire"]


async def scheduled_keys(store: SQLiteStore) -> list[str | None]:
    history = await store.load_messages("s")
    return [m.request_key for m in history if m.role == "user" and m.origin == "scheduled"]


# -- occurrences on a fake clock ------------------------------------------------------------


async def test_every_occurrence_runs_once_on_the_rules_grid(
    store: SQLiteStore, clock: Clock
) -> None:
    seen: list[str] = []
    runner = await started(store, clock, seen)
    made = await schedule(store, "s", "check the queue", every_seconds=900, clock=clock)
    first = made.due_at
    assert first == int(START * 1000) + 900_000
    assert made.to_dict()["every_seconds"] == 900
    assert made.to_dict()["next_at"] == made.to_dict()["at"]

    assert fired(await work_once(runner, store)) == []  # not due yet
    for n in range(4):
        # Each pass a little late (as a worker polls): the next one is still on the grid.
        clock.set(first + n * 900_000 + 7_000)
        assert fired(await work_once(runner, store)) == ["fired"]
        assert fired(await work_once(runner, store)) == []  # the same occurrence: never again
        (row,) = await store.load_schedules("s")
        assert row.due_at == first + (n + 1) * 900_000  # from the rule, not from the turn's end
    assert seen[1:] == ["check the queue"] * 4
    assert await scheduled_keys(store) == [
        f"schedule:{made.schedule_id}@{first + n * 900_000}" for n in range(4)
    ]


async def test_a_day_of_downtime_is_one_catch_up_turn_then_the_rhythm_resumes(
    store: SQLiteStore, clock: Clock
) -> None:
    seen: list[str] = []
    runner = await started(store, clock, seen)
    made = await schedule(store, "s", "check the queue", every_seconds=900, clock=clock)
    clock.set(made.due_at + 86_400_000 + 60_000)  # 97 occurrences went by unrun
    assert fired(await work_once(runner, store)) == ["fired"]
    assert fired(await work_once(runner, store)) == []
    assert seen[1:] == ["check the queue"]  # once, not 97 times
    (row,) = await store.load_schedules("s")
    # The next occurrence is the first on the grid after now: 14 minutes on.
    assert row.due_at == made.due_at + 97 * 900_000
    assert row.due_at - int(clock() * 1000) == 840_000
    clock.set(row.due_at)
    assert fired(await work_once(runner, store)) == ["fired"]
    assert len(seen) == 3
    assert (await scheduled_keys(store))[0] == made.request_key  # the catch-up: the missed one


async def test_a_cron_in_berlin_fires_at_nine_local_across_daylight_saving(
    store: SQLiteStore, clock: Clock
) -> None:
    seen: list[str] = []
    runner = await started(store, clock, seen)
    made = await schedule(
        store, "s", "daily digest", cron="0 9 * * *", timezone="Europe/Berlin", clock=clock
    )
    dues = [made.due_at]
    for _ in range(5):  # 23 to 28 October 2026: summer time ends on the 25th, at 03:00
        clock.set(dues[-1])
        assert fired(await work_once(runner, store)) == ["fired"]
        (row,) = await store.load_schedules("s")
        dues.append(row.due_at)
    local = [datetime.datetime.fromtimestamp(d / 1000, BERLIN) for d in dues]
    assert [(t.day, t.hour, t.minute) for t in local] == [(d, 9, 0) for d in range(23, 29)]
    assert [t.utcoffset() for t in local] == [
        datetime.timedelta(hours=h) for h in (2, 2, 1, 1, 1, 1)
    ]
    assert len(seen) == 6  # turn 0 and five digests
    # And spring forward (28 March 2027): still 09:00, now at +02:00.
    rule = parse_rule(cron="0 9 * * *", timezone="Europe/Berlin")
    before = int(datetime.datetime(2027, 3, 27, 10, tzinfo=BERLIN).timestamp() * 1000)
    after = rule.next_after(rule.next_after(before, before), before)
    moment = datetime.datetime.fromtimestamp(after / 1000, BERLIN)
    assert (moment.day, moment.hour, moment.utcoffset()) == (29, 9, datetime.timedelta(hours=2))


async def test_an_occurrence_waits_for_an_approval_and_does_not_pile_up(
    store: SQLiteStore, clock: Clock
) -> None:
    seen: list[str] = []
    runner = await started(store, clock, seen)
    asked = await run(
        AGENT, llm=echo_llm(seen), message="deploy", session_id="s", store=store, tools=TOOLS,
        clock=clock,
    )  # fmt: skip
    assert asked.status == "awaiting_approval"
    made = await schedule(store, "s", "tick", every_seconds=60, clock=clock)
    for minutes in (1, 5, 30):  # occurrences go by while the call waits for a person
        clock.set(made.due_at + minutes * 60_000)
        assert fired(await work_once(runner, store)) == ["waiting"]
        assert await store.load_schedules("s") == [made]  # one row, its due time kept
    (waiting,) = await pending_approvals(store, "s")
    await approve(store, "s", waiting.tool_call_id, digest=waiting.digest, approved=True)
    resumed = await run(AGENT, llm=echo_llm(seen), session_id="s", store=store, tools=TOOLS)
    assert resumed.status == "complete"
    assert fired(await work_once(runner, store)) == ["fired"]
    assert fired(await work_once(runner, store)) == []
    assert seen.count("tick") == 1
    (row,) = await store.load_schedules("s")
    assert row.due_at > clock() * 1000


async def test_deleting_a_rule_stops_every_occurrence(store: SQLiteStore, clock: Clock) -> None:
    seen: list[str] = []
    runner = await started(store, clock, seen)
    made = await schedule(store, "s", "tick", every_seconds=60, clock=clock)
    clock.set(made.due_at)
    assert fired(await work_once(runner, store)) == ["fired"]
    assert await store.delete_schedule("s", made.schedule_id)
    clock.set(made.due_at + 3_600_000)
    assert fired(await work_once(runner, store)) == []
    assert seen[1:] == ["tick"]
    # An occurrence's turn that was about to start (the row read before the delete): its
    # first write is refused, nothing of it lands.
    again = await schedule(store, "s", "tock", every_seconds=60, clock=clock)
    assert await store.delete_schedule("s", again.schedule_id)
    before = len(await store.load_messages("s"))
    with pytest.raises(Exception, match="cancelled or has fired"):
        await run(
            AGENT, llm=echo_llm(seen), message="tock", session_id="s", store=store,
            tools=TOOLS, clock=clock, request_key=again.request_key, origin="scheduled",
        )  # fmt: skip
    assert len(await store.load_messages("s")) == before


async def test_a_rule_counts_once_against_the_sessions_schedules(
    store: SQLiteStore, clock: Clock
) -> None:
    seen: list[str] = []
    await started(store, clock, seen)
    rule = await schedule(store, "s", "tick", cron="*/5 * * * *", clock=clock)
    for n in range(MAX_SCHEDULES_PER_SESSION - 1):
        await schedule(store, "s", f"once {n}", delay_seconds=3600, clock=clock)
    with pytest.raises(ScheduleError, match="100 schedules waiting"):
        await schedule(store, "s", "one more", every_seconds=60, clock=clock)
    assert rule in await store.load_schedules("s")


async def test_a_tool_schedules_a_rule_with_its_step(store: SQLiteStore, clock: Clock) -> None:
    @tool
    async def remind(args: Nothing, ctx: ToolContext) -> str:
        """Remind every weekday."""
        made = ctx.schedule("stand-up", cron="30 9 * * 1-5", timezone="America/New_York")
        return made.schedule_id

    agent = Agent("reminding", "Set reminders.", [remind])
    replies = iter([LLMResponse("Setting.", [ToolCall("", "remind", {})]), LLMResponse("Set.")])
    llm = FunctionLLM(lambda messages, tools: next(replies))
    result = await run(
        agent, llm=llm, message="remind me", session_id="t", store=store, clock=clock
    )
    assert result.status == "complete", result
    assert "sch_" in (await store.load_messages("t"))[2].content
    (row,) = await store.load_schedules("t")
    assert json.loads(row.rule or "") == {"cron": "30 9 * * 1-5", "timezone": "America/New_York"}
    due = datetime.datetime.fromtimestamp(row.due_at / 1000, ZoneInfo("America/New_York"))
    assert (due.day, due.hour, due.minute) == (22, 9, 30)  # that Thursday, 09:30 in New York


# -- the rule itself --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"cron": "61 * * * *"}, "not a valid expression"),
        ({"cron": "0 9 * *"}, "five fields"),
        ({"cron": "0 0 9 * * *"}, "five fields"),  # seconds: no
        ({"cron": "@reboot"}, "five fields"),
        ({"cron": "0 0 30 2 *"}, "not a valid expression"),
        ({"cron": ""}, "cron must be a cron expression"),
        ({"cron": 5}, "cron must be a cron expression"),
        ({"cron": "0 9 * * *", "timezone": "Mars/Olympus"}, "unknown time zone"),
        ({"cron": "0 9 * * *", "timezone": "../etc/passwd"}, "unknown time zone"),
        ({"cron": "0 9 * * *", "timezone": 1}, "IANA time zone name"),
        ({"every_seconds": 59}, "every_seconds must be 60"),
        ({"every_seconds": 60.5}, "whole number"),
        ({"every_seconds": True}, "whole number"),
        ({"every_seconds": 400 * 86400 + 1}, "every_seconds must be 60"),
        ({"every_seconds": 60, "timezone": "UTC"}, "timezone goes with cron"),
        ({"every_seconds": 60, "cron": "* * * * *"}, "exactly one of cron and every_seconds"),
        ({}, "exactly one of cron and every_seconds"),
    ],
)
def test_a_bad_rule_is_refused_with_what_is_wrong(fields: dict[str, object], words: str) -> None:
    with pytest.raises(ScheduleError, match=words):
        parse_rule(**fields)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"cron": "* * * * *", "delay_seconds": 5}, "delay_seconds is for a one-off"),
        ({"cron": "* * * * *", "at": "2027-01-01T00:00:00Z"}, "give no at"),
        ({"every_seconds": 60, "at": "2020-01-01"}, "time zone"),
        ({"timezone": "UTC", "delay_seconds": 5}, "timezone goes with cron"),
    ],
)
async def test_a_bad_mix_of_fields_is_refused(
    store: SQLiteStore, clock: Clock, fields: dict[str, object], words: str
) -> None:
    await started(store, clock, [])
    with pytest.raises(ScheduleError, match=words):
        await schedule(store, "s", "tick", clock=clock, **fields)  # type: ignore[arg-type]
    assert await store.load_schedules("s") == []


def test_an_interval_may_start_at_a_given_time_and_keeps_that_grid() -> None:
    rule = parse_rule(every_seconds=60)
    row = Schedule("r", "tick", 1_000_000, 0, rule.to_text())
    assert advanced(row, 1_000_000).due_at == 1_060_000
    assert advanced(row, 1_000_001).due_at == 1_060_000
    assert advanced(row, 1_059_999).due_at == 1_060_000
    assert advanced(row, 1_060_000).due_at == 1_120_000  # strictly after now
    assert advanced(row, 0).due_at == 1_060_000  # a clock behind the due time: the next one
    assert Rule.from_text(rule.to_text()) == rule


def test_timelines_and_sessions_show_name_the_rule_a_turn_came_from() -> None:
    due = int(datetime.datetime(2026, 10, 17, 9, tzinfo=datetime.UTC).timestamp() * 1000)
    assert fired_by(f"schedule:sch_1@{due}") == (
        "recurring schedule sch_1, occurrence due 2026-10-17T09:00:00.000Z"
    )
    assert fired_by("schedule:sch_2") == "schedule sch_2"
    assert fired_by("my-key") is None


def test_a_zone_where_there_is_no_zone_database_says_how_to_get_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As in a Worker without the tzdata package: a zone is refused with the way out, and
    UTC (the default) needs no database at all."""
    import zoneinfo

    def no_database(key: str) -> zoneinfo.ZoneInfo:
        raise zoneinfo.ZoneInfoNotFoundError(f"No time zone found with key {key}")

    monkeypatch.setattr(zoneinfo, "ZoneInfo", no_database)
    with pytest.raises(ScheduleError, match=r"no time zone database.*tzdata"):
        parse_rule(cron="0 9 * * *", timezone="Europe/Berlin")
    rule = parse_rule(cron="0 9 * * *")
    assert rule.timezone == "UTC"
    assert rule.next_after(0, 0) == 9 * 3600 * 1000  # 1970-01-01T09:00Z
