"""Scheduled turns, stopped turns and message origins (durable_agents.schedules,
`ToolContext.schedule`, `run(origin=)`, `stop_turn`).

The times and checks need no store; what must survive a crash runs on a real
SQLite file (crash points from durable_agents.testing), what needs no durability
on the memory store.
"""

from __future__ import annotations

import datetime
import itertools
import json
import math
import os
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from durable_agents import (
    Agent,
    ConfigurationError,
    LLMResponse,
    Message,
    SessionConflictError,
    SessionNotFoundError,
    ToolCall,
    ToolContext,
    ToolDurabilityError,
    run,
    schedule,
    stop_turn,
    tool,
)
from durable_agents.errors import ScheduleError
from durable_agents.events import MessageStored, RunEvent
from durable_agents.limits import MAX_ROW_BYTES
from durable_agents.messages import ToolErrorKind, tool_error
from durable_agents.schedules import (
    MAX_DELAY_SECONDS,
    MAX_SCHEDULES_PER_CALL,
    MAX_SCHEDULES_PER_SESSION,
    due_time,
    new_schedule,
    parse_time,
)
from durable_agents.stores import Store, memory_store, sqlite_store
from durable_agents.stores._limits import MAX_BOUND_INT
from durable_agents.stores.base import Schedule
from durable_agents.testing import (
    ScriptedLLM,
    SimulatedCrash,
    count_writes,
    crash_on_write,
)
from durable_agents.testing.conformance import ticking_clock

SESSION = "s"
NOW_MS = 1_800_000_000_000  # 2027-01-15T08:00:00Z
NOW_ISO = "2027-01-15T08:00:00Z"
DAY_MS = 86_400_000


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Store]:
    """A real SQLite file, fresh and empty."""
    store = sqlite_store(tmp_path / "agents.db", clock=ticking_clock())
    yield store
    await store.close()


def ids(prefix: str = "n") -> Callable[[], str]:
    """A run's `new_id`: n1, n2, ..."""
    counter = itertools.count(1)
    return lambda: f"{prefix}{next(counter)}"


def clock_at(ms: int = NOW_MS) -> Callable[[], float]:
    return lambda: ms / 1000


def kind(message: Message) -> str | None:
    error = tool_error(message.content)
    return None if error is None else str(error.get("kind"))


# -- due_time / parse_time / new_schedule ------------------------------------------------------


def test_a_delay_is_due_that_many_seconds_on_rounded_up_to_the_ms() -> None:
    assert due_time(NOW_MS, delay_seconds=600) == NOW_MS + 600_000
    assert due_time(NOW_MS, delay_seconds=1.5) == NOW_MS + 1500
    assert due_time(NOW_MS, delay_seconds=0) == NOW_MS
    assert due_time(NOW_MS, delay_seconds=1e-9) == NOW_MS + 1  # never earlier than asked
    assert due_time(NOW_MS, delay_seconds=MAX_DELAY_SECONDS) == NOW_MS + 400 * DAY_MS


@pytest.mark.parametrize(
    "at",
    [
        "2027-01-15T09:00:00Z",
        "2027-01-15T09:00:00z",
        "2027-01-15T09:00:00+00:00",
        "2027-01-15T10:00:00+01:00",
        "2027-01-15T04:30:00-04:30",
        "2027-01-15T09:00Z",
        " 2027-01-15T09:00:00Z ",
        datetime.datetime(2027, 1, 15, 9, tzinfo=datetime.UTC),
        datetime.datetime(2027, 1, 15, 18, tzinfo=datetime.timezone(datetime.timedelta(hours=9))),
    ],
)
def test_an_iso_time_with_a_zone_is_that_instant(at: str | datetime.datetime) -> None:
    assert due_time(NOW_MS, at=at) == NOW_MS + 3_600_000


def test_parse_time_keeps_the_offset_and_the_milliseconds() -> None:
    moment = parse_time("2027-01-15T10:00:00.250+02:00")
    assert moment.utcoffset() == datetime.timedelta(hours=2)
    assert due_time(NOW_MS, at=moment) == NOW_MS + 250


def test_a_time_in_the_past_is_due_at_once() -> None:
    assert due_time(NOW_MS, at="2027-01-15T07:59:59Z") == NOW_MS - 1000
    assert due_time(NOW_MS, at="2020-01-01T00:00:00Z") < NOW_MS
    assert due_time(NOW_MS, at="1969-12-31T00:00:00Z") == 0  # before 1970: at once, not < 0
    assert due_time(NOW_MS, at="0001-01-01T00:00:00+01:00") == 0


def test_400_days_ahead_is_the_furthest() -> None:
    limit = datetime.datetime.fromtimestamp(NOW_MS / 1000, datetime.UTC) + datetime.timedelta(
        days=400
    )
    assert due_time(NOW_MS, at=limit) == NOW_MS + 400 * DAY_MS
    for later in (limit + datetime.timedelta(milliseconds=1), "9999-12-31T23:59:59Z"):
        with pytest.raises(ScheduleError, match="at most 400 days ahead"):
            due_time(NOW_MS, at=later)
    with pytest.raises(ScheduleError, match="at most 34,560,000"):
        due_time(NOW_MS, delay_seconds=MAX_DELAY_SECONDS + 0.001)


def test_exactly_one_of_delay_and_at() -> None:
    with pytest.raises(ScheduleError, match="exactly one"):
        due_time(NOW_MS)
    with pytest.raises(ScheduleError, match="exactly one"):
        due_time(NOW_MS, delay_seconds=5, at=NOW_ISO)
    assert isinstance(ScheduleError("x"), ConfigurationError)  # a setup mistake
    assert ScheduleError.code == "invalid-schedule"


@pytest.mark.parametrize(
    ("delay", "match"),
    [
        (-1, "0 or more"),
        (-0.001, "0 or more"),
        (math.nan, "0 or more"),
        (math.inf, "0 or more"),
        (-math.inf, "0 or more"),
        (True, "must be a number"),
        (False, "must be a number"),
        ("60", "must be a number"),
        (1e308, "at most"),
        (10**20, "at most"),
    ],
)
def test_a_bad_delay_is_a_schedule_error(delay: Any, match: str) -> None:
    with pytest.raises(ScheduleError, match=match):
        due_time(NOW_MS, delay_seconds=delay)


def test_an_integer_delay_past_a_doubles_range_is_a_schedule_error() -> None:
    with pytest.raises(ScheduleError):
        due_time(NOW_MS, delay_seconds=10**400)


@pytest.mark.parametrize(
    ("at", "match"),
    [
        ("2027-01-15T09:00:00", "needs a time zone"),
        ("2027-01-15", "needs a time zone"),
        (datetime.datetime(2027, 1, 15, 9), "needs a time zone"),  # naive
        ("tomorrow at nine", "ISO 8601 time with a time zone"),
        ("2027-13-01T00:00:00Z", "ISO 8601 time with a time zone"),
        ("2027-01-15T25:00:00Z", "ISO 8601 time with a time zone"),
        ("1800000000", "ISO 8601 time with a time zone"),
        ("Z", "ISO 8601 time with a time zone"),
        ("", "ISO 8601 string"),
        ("2027-01-15T09:00:00Z" + " " * 60, "ISO 8601 string"),  # over 64 characters
        (1_800_000_000, "ISO 8601 string"),
        (True, "ISO 8601 string"),
        (datetime.date(2027, 1, 15), "ISO 8601 string"),
    ],
)
def test_a_bad_time_is_a_schedule_error(at: Any, match: str) -> None:
    with pytest.raises(ScheduleError, match=match):
        due_time(NOW_MS, at=at)


def test_new_schedule_checks_its_message() -> None:
    made = new_schedule("ping", schedule_id="sch_1", now_ms=NOW_MS, delay_seconds=60)
    assert made == Schedule("sch_1", "ping", NOW_MS + 60_000, NOW_MS)
    assert made.request_key == "schedule:sch_1"
    for empty in ("", "   \n", None, 42):
        with pytest.raises(ScheduleError, match="needs a message"):
            new_schedule(empty, schedule_id="x", now_ms=NOW_MS, delay_seconds=1)  # type: ignore[arg-type]
    # The limit counts UTF-8 bytes: 50 "é" are 100 bytes.
    assert (
        new_schedule(
            "é" * 50, schedule_id="x", now_ms=NOW_MS, delay_seconds=1, max_message_bytes=100
        ).message
        == "é" * 50
    )
    with pytest.raises(ScheduleError, match="over the agent's 100-byte limit"):
        new_schedule(
            "é" * 50 + "x", schedule_id="x", now_ms=NOW_MS, delay_seconds=1, max_message_bytes=100
        )
    with pytest.raises(ScheduleError, match="outside what a store keeps"):
        new_schedule("late", schedule_id="x", now_ms=MAX_BOUND_INT, delay_seconds=1)


# -- a tool schedules with its step's write #2 ----------------------------------------------------


class Lookup(BaseModel):
    q: str


class Reminder(BaseModel):
    text: str
    delay_seconds: float = 600


class Effects(Counter[str]):
    """Handler runs by tool name."""


def reminder_agent(effects: Effects, **options: Any) -> Agent:
    @tool
    async def remind(args: Reminder, ctx: ToolContext) -> dict[str, Any]:
        """Remind the user later (schedules a turn)."""
        effects["remind"] += 1
        made = ctx.schedule(args.text, delay_seconds=args.delay_seconds)
        return {"schedule_id": made.schedule_id}

    @tool(safe_to_retry=True)
    async def remind_safely(args: Reminder, ctx: ToolContext) -> str:
        """The same, declared safe to run again."""
        effects["remind_safely"] += 1
        ctx.schedule(args.text, delay_seconds=args.delay_seconds)
        return "ok"

    @tool
    async def remind_then_fail(args: Reminder, ctx: ToolContext) -> str:
        """Schedules, then raises."""
        effects["remind_then_fail"] += 1
        ctx.schedule(args.text, delay_seconds=args.delay_seconds)
        raise RuntimeError("the calendar is down")

    @tool
    async def remind_many(args: Reminder, ctx: ToolContext) -> str:
        """Schedules until it is refused, and returns."""
        effects["remind_many"] += 1
        for n in range(MAX_SCHEDULES_PER_CALL + 5):
            try:
                ctx.schedule(f"{args.text} {n}", delay_seconds=args.delay_seconds + n)
            except ScheduleError as exc:
                return str(exc)
        return "all of them"

    @tool
    async def remind_too_many(args: Reminder, ctx: ToolContext) -> str:
        """Schedules past the limit and lets the refusal raise."""
        effects["remind_too_many"] += 1
        for n in range(MAX_SCHEDULES_PER_CALL + 1):
            ctx.schedule(f"{args.text} {n}", delay_seconds=args.delay_seconds)
        return "unreachable"

    @tool
    async def note(args: Reminder, ctx: ToolContext) -> str:
        """Schedules nothing."""
        effects["note"] += 1
        return "noted"

    tools = [remind, remind_safely, remind_then_fail, remind_many, remind_too_many, note]
    return Agent("reminders", "You set reminders.", tools, **options)


def calling(
    name: str, call_id: str = "c1", text: str = "Check the build", **more: Any
) -> ScriptedLLM:
    """A script: one call of `name`, then a reply."""
    return ScriptedLLM([
        LLMResponse(tool_calls=[ToolCall(call_id, name, {"text": text, **more})]),
        LLMResponse(text="Done."),
    ])  # fmt: skip


async def turn(store: Store, agent: Agent, llm: ScriptedLLM, message: str | None = "remind me",
               **options: Any) -> Any:  # fmt: skip
    return await run(agent, llm=llm, message=message, session_id=SESSION, store=store,
                     new_id=ids(), clock=clock_at(), **options)  # fmt: skip


async def test_a_tools_schedule_is_stored_with_write_2_and_costs_no_write(db: Store) -> None:
    effects = Effects()
    agent = reminder_agent(effects)
    plain = count_writes(db)
    await run(agent, llm=calling("note"), message="note it", session_id="other", store=plain)
    writes = count_writes(db)
    result = await turn(writes, agent, calling("remind"))
    assert result.status == "complete"
    assert writes.appends == plain.appends == 3  # write #1, write #2, the reply
    (made,) = await db.load_schedules(SESSION)
    assert made == Schedule("sch_n1", "Check the build", NOW_MS + 600_000, NOW_MS)
    assert made.schedule_id == "sch_" + "n1"  # the run's new_id
    result_message = next(m for m in result.messages if m.role == "tool")
    assert json.loads(result_message.content) == {"schedule_id": "sch_n1"}
    assert effects == {"note": 1, "remind": 1}
    assert await db.load_schedules("other") == []


async def test_write_2_is_where_it_lands(db: Store) -> None:
    before = crash_on_write(db, 2)
    with pytest.raises(SimulatedCrash):
        await turn(before, reminder_agent(Effects()), calling("remind"))
    assert await db.load_schedules(SESSION) == []  # write #1 landed, write #2 did not
    assert len(await db.load_messages(SESSION)) == 2


async def test_a_handler_that_schedules_then_raises_schedules_nothing(db: Store) -> None:
    result = await turn(db, reminder_agent(Effects()), calling("remind_then_fail"))
    assert result.status == "complete"
    (failed,) = [m for m in result.messages if m.role == "tool"]
    assert kind(failed) == ToolErrorKind.TOOL_FAILED
    assert "the calendar is down" in failed.content
    assert await db.load_schedules(SESSION) == []


async def test_a_crash_before_write_2_schedules_nothing_and_the_resume_neither(db: Store) -> None:
    effects = Effects()
    agent = reminder_agent(effects)
    llm = calling("remind")
    with pytest.raises(SimulatedCrash):
        await turn(crash_on_write(db, 2), agent, llm)
    assert effects == {"remind": 1}  # it ran: its effect may have landed, its schedule did not
    assert await db.load_schedules(SESSION) == []
    resumed = await turn(db, agent, llm, message=None)
    assert resumed.status == "complete"
    assert effects == {"remind": 1}  # not run again: remind is not safe_to_retry
    (lost,) = [m for m in resumed.messages if m.role == "tool"]
    assert kind(lost) == ToolErrorKind.TOOL_DURABILITY_ERROR
    assert await db.load_schedules(SESSION) == []


async def test_a_crash_after_write_2_leaves_exactly_one(db: Store) -> None:
    effects = Effects()
    agent = reminder_agent(effects)
    llm = calling("remind")
    with pytest.raises(SimulatedCrash):
        await turn(crash_on_write(db, 2, when="after"), agent, llm)
    resumed = await turn(db, agent, llm, message=None)
    assert resumed.status == "complete"
    assert effects == {"remind": 1}
    assert [s.schedule_id for s in await db.load_schedules(SESSION)] == ["sch_n1"]


async def test_a_safe_tool_rerun_on_resume_schedules_once(db: Store) -> None:
    effects = Effects()
    agent = reminder_agent(effects)
    llm = calling("remind_safely")
    with pytest.raises(SimulatedCrash):
        await turn(crash_on_write(db, 2), agent, llm)
    writes = count_writes(db)
    resumed = await turn(writes, agent, llm, message=None)
    assert resumed.status == "complete"
    assert effects == {"remind_safely": 2}  # re-invoked; only the second run's schedule landed
    assert writes.appends == 2  # the repair (with the schedule), the reply
    (made,) = await db.load_schedules(SESSION)
    assert made.message == "Check the build"


async def test_a_run_without_a_durable_store_cannot_schedule() -> None:
    effects = Effects()
    store = memory_store()
    result = await run(reminder_agent(effects), llm=calling("remind"), message="remind me",
                       store=store)  # fmt: skip
    assert result.status == "complete"
    (failed,) = [m for m in result.messages if m.role == "tool"]
    assert kind(failed) == ToolErrorKind.TOOL_FAILED
    assert "ConfigurationError: ctx.schedule needs a durable run" in failed.content
    assert effects == {"remind": 1}
    assert await store.load_schedules(result.session_id) == []


async def test_a_bad_time_in_a_handler_is_a_failed_call(db: Store) -> None:
    result = await turn(db, reminder_agent(Effects()), calling("remind", delay_seconds=-5))
    (failed,) = [m for m in result.messages if m.role == "tool"]
    assert kind(failed) == ToolErrorKind.TOOL_FAILED
    assert "ScheduleError: delay_seconds must be 0 or more" in failed.content
    assert await db.load_schedules(SESSION) == []


async def test_a_handler_over_its_message_limit_is_refused(db: Store) -> None:
    agent = reminder_agent(Effects(), max_message_bytes=20)
    result = await turn(db, agent, calling("remind", text="x" * 21))
    (failed,) = [m for m in result.messages if m.role == "tool"]
    assert "over the agent's 20-byte limit" in failed.content
    assert await db.load_schedules(SESSION) == []


async def test_one_call_schedules_at_most_ten(db: Store) -> None:
    effects = Effects()
    agent = reminder_agent(effects)
    result = await turn(db, agent, calling("remind_many"))
    (answer,) = [m for m in result.messages if m.role == "tool"]
    assert f"one tool call may schedule at most {MAX_SCHEDULES_PER_CALL}" in answer.content
    assert len(await db.load_schedules(SESSION)) == MAX_SCHEDULES_PER_CALL
    # One that lets the refusal raise fails, and schedules none of them.
    more = await run(agent, llm=calling("remind_too_many", "c2"), message="again",
                     session_id=SESSION, store=db)  # fmt: skip
    assert kind([m for m in more.messages if m.role == "tool"][-1]) == ToolErrorKind.TOOL_FAILED
    assert len(await db.load_schedules(SESSION)) == MAX_SCHEDULES_PER_CALL


async def test_two_calls_of_one_step_both_schedule_with_write_2(db: Store) -> None:
    llm = ScriptedLLM([
        LLMResponse(tool_calls=[ToolCall("a", "remind", {"text": "one"}),
                                ToolCall("b", "remind_then_fail", {"text": "never"}),
                                ToolCall("c", "remind", {"text": "two", "delay_seconds": 5})]),
        LLMResponse(text="Done."),
    ])  # fmt: skip
    writes = count_writes(db)
    await turn(writes, reminder_agent(Effects()), llm)
    assert writes.appends == 3
    made = await db.load_schedules(SESSION)
    assert [s.message for s in made] == ["two", "one"]  # earliest due first; "never" failed


# -- firing: a schedule's message as a turn, once ---------------------------------------------


PLAIN = Agent("plain", "You answer.", [])


async def scheduled_session(store: Store) -> Schedule:
    """Session SESSION with one finished turn and a schedule due now."""
    await run(PLAIN, llm=ScriptedLLM([LLMResponse(text="Hi.")]), message="hello",
              session_id=SESSION, store=store)  # fmt: skip
    return await schedule(store, SESSION, "Check the build", delay_seconds=0, new_id=ids("f"))


async def fire(store: Store, made: Schedule, llm: ScriptedLLM, agent: Agent = PLAIN) -> Any:
    return await run(agent, llm=llm, message=made.message, request_key=made.request_key,
                     origin="scheduled", session_id=SESSION, store=store)  # fmt: skip


async def test_firing_runs_the_message_once_and_removes_the_schedule(db: Store) -> None:
    made = await scheduled_session(db)
    assert made.schedule_id == "sch_f1"
    assert await db.load_schedules(SESSION) == [made]
    writes = count_writes(db)
    result = await fire(writes, made, ScriptedLLM([LLMResponse(text="The build is green.")]))
    assert result.status == "complete"
    assert result.response == "The build is green."
    assert writes.appends == 1  # the user message fires it in the turn's one write
    assert await db.load_schedules(SESSION) == []
    history = await db.load_messages(SESSION)
    assert [(m.role, m.content, m.origin) for m in history] == [
        ("user", "hello", None),
        ("assistant", "Hi.", None),
        ("user", "Check the build", "scheduled"),
        ("assistant", "The build is green.", "scheduled"),
    ]
    assert history[2].request_key == "schedule:sch_f1"
    # Fired again (the same key): no new turn, no LLM call, the same reply.
    idle = ScriptedLLM([])
    again = await fire(writes, made, idle)
    assert (again.status, again.response) == ("complete", "The build is green.")
    assert idle.calls == []
    assert writes.appends == 1
    assert len(await db.load_messages(SESSION)) == 4


async def test_a_cancelled_schedule_never_runs(db: Store) -> None:
    made = await scheduled_session(db)
    assert await db.delete_schedule(SESSION, made.schedule_id) is True
    with pytest.raises(SessionConflictError, match="cancelled or has fired already"):
        await fire(db, made, ScriptedLLM([LLMResponse(text="The build is green.")]))
    assert len(await db.load_messages(SESSION)) == 2
    info = await db.get_session(SESSION)
    assert info is not None
    assert info.state == "idle"
    # Nothing was left behind: the session goes on, without waiting for a lease.
    result = await run(PLAIN, llm=ScriptedLLM([LLMResponse(text="Yes.")]), message="still there?",
                       session_id=SESSION, store=db, wait_seconds=0)  # fmt: skip
    assert result.status == "complete"


async def test_a_crash_mid_firing_is_finished_by_a_resume(db: Store) -> None:
    made = await scheduled_session(db)
    effects = Effects()
    agent = reminder_agent(effects)
    llm = calling("note")
    with pytest.raises(SimulatedCrash):  # write #1 (the message, the call) lands, #2 does not
        await fire(crash_on_write(db, 2), made, llm, agent)
    assert await db.load_schedules(SESSION) == []  # fired by write #1
    resumed = await run(agent, llm=llm, message=None, session_id=SESSION, store=db)
    assert resumed.status == "complete"
    history = await db.load_messages(SESSION)
    assert [m.content for m in history if m.role == "user"] == ["hello", "Check the build"]
    assert kind(history[4]) == ToolErrorKind.TOOL_DURABILITY_ERROR  # note is not safe_to_retry
    # The firing again (the worker retrying it) starts nothing: that turn is over.
    again = await fire(db, made, ScriptedLLM([]), agent)
    assert again.status == "complete"
    assert len(await db.load_messages(SESSION)) == len(history)


async def test_a_crash_before_the_firing_write_leaves_the_schedule(db: Store) -> None:
    made = await scheduled_session(db)
    with pytest.raises(SimulatedCrash):
        await fire(crash_on_write(db, 1), made, ScriptedLLM([LLMResponse(text="Green.")]))
    assert await db.load_schedules(SESSION) == [made]
    result = await fire(db, made, ScriptedLLM([LLMResponse(text="Green.")]))
    assert result.status == "complete"
    assert await db.load_schedules(SESSION) == []


# -- schedule(store, session_id, ...) ----------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "memory":
        yield memory_store(clock=ticking_clock())
        return
    made = sqlite_store(tmp_path / "agents.db", clock=ticking_clock())
    yield made
    await made.close()


async def test_schedule_needs_a_stored_session(store: Store) -> None:
    with pytest.raises(SessionNotFoundError):
        await schedule(store, "nobody", "ping", delay_seconds=1)
    assert await store.load_schedules("nobody") == []
    assert await store.get_session("nobody") is None


async def test_schedule_stores_one_with_one_write(store: Store) -> None:
    await store.append_messages_atomic(SESSION, 0, [Message.user("hi")])
    writes = count_writes(store)
    made = await schedule(writes, SESSION, "ping", at="2027-01-15T09:00:00+01:00",
                          new_id=lambda: "x", clock=clock_at())  # fmt: skip
    assert made == Schedule("sch_x", "ping", NOW_MS, NOW_MS)
    assert writes.appends == 1
    assert await store.load_schedules(SESSION) == [made]
    assert len(await store.load_messages(SESSION)) == 1  # no message was written
    with pytest.raises(ScheduleError):
        await schedule(store, SESSION, "ping", delay_seconds=-1)
    assert await store.load_schedules(SESSION) == [made]


async def test_a_session_holds_at_most_100() -> None:
    store = memory_store()
    await store.append_messages_atomic(SESSION, 0, [Message.user("hi")])
    for n in range(MAX_SCHEDULES_PER_SESSION):
        await schedule(store, SESSION, f"ping {n}", delay_seconds=n)
    with pytest.raises(ScheduleError, match="has 100 schedules waiting already"):
        await schedule(store, SESSION, "one too many", delay_seconds=1)
    assert len(await store.load_schedules(SESSION)) == MAX_SCHEDULES_PER_SESSION
    # A cancelled one makes room.
    first = (await store.load_schedules(SESSION))[0]
    assert await store.delete_schedule(SESSION, first.schedule_id)
    await schedule(store, SESSION, "now it fits", delay_seconds=1)


async def fill(store: Store, count: int) -> None:
    """Session SESSION with one finished turn and `count` schedules waiting."""
    await run(PLAIN, llm=ScriptedLLM([LLMResponse(text="Hi.")]), message="hello",
              session_id=SESSION, store=store)  # fmt: skip
    for n in range(count):
        await schedule(store, SESSION, f"ping {n}", delay_seconds=60 + n, new_id=ids(f"f{n}_"))


async def test_a_tools_schedule_counts_against_the_sessions_100(db: Store) -> None:
    # Every door counts against the same limit: a tool's ctx.schedule too. The refusal
    # is the call's result (the model reads it), never a crash, and nothing is stored.
    await fill(db, MAX_SCHEDULES_PER_SESSION)
    effects = Effects()
    result = await turn(db, reminder_agent(effects), calling("remind"), message="one more")
    assert result.status == "complete"
    (answer,) = [m for m in result.messages if m.role == "tool"]
    assert kind(answer) == ToolErrorKind.TOOL_FAILED
    assert "has 100 schedules waiting already" in answer.content
    assert effects == {"remind": 1}
    for n in range(5):  # and again, turn after turn
        await turn(db, reminder_agent(effects), calling("remind", f"c{n}"), message=f"more {n}")
    assert len(await db.load_schedules(SESSION)) == MAX_SCHEDULES_PER_SESSION


async def test_the_calls_of_one_step_share_the_room_left(db: Store) -> None:
    # 95 waiting: of a step of 20 calls each scheduling once, 5 are stored with write #2,
    # 15 answered with the refusal; a call that fails gives its place back.
    await fill(db, MAX_SCHEDULES_PER_SESSION - 5)
    calls = [ToolCall("x", "remind_then_fail", {"text": "never"})]
    calls += [ToolCall(f"c{n}", "remind", {"text": f"r{n}"}) for n in range(20)]
    llm = ScriptedLLM([LLMResponse(tool_calls=calls), LLMResponse(text="Done.")])
    result = await turn(db, reminder_agent(Effects()), llm, message="many")
    results = [m for m in result.messages if m.role == "tool"]
    refused = [m for m in results if "schedules waiting already" in m.content]
    assert (len(results), len(refused)) == (21, 15)
    assert len(await db.load_schedules(SESSION)) == MAX_SCHEDULES_PER_SESSION
    # A tool that catches the refusal goes on: its schedules up to the limit are kept.
    (first,) = [s for s in await db.load_schedules(SESSION) if s.message == "ping 0"]
    assert await db.delete_schedule(SESSION, first.schedule_id)
    again = await turn(db, reminder_agent(Effects()), calling("remind_many", "m1"), message="m")
    answer = [m for m in again.messages if m.role == "tool"][-1]
    assert "schedules waiting already" in answer.content
    assert len(await db.load_schedules(SESSION)) == MAX_SCHEDULES_PER_SESSION


async def test_a_lone_surrogate_in_a_scheduled_message_is_stored_repaired(db: Store) -> None:
    await db.append_messages_atomic(SESSION, 0, [Message.user("hi")])
    made = await schedule(db, SESSION, "file caf\udce9.txt", delay_seconds=1)
    assert made.message == "file caf\ufffd.txt"
    assert await db.load_schedules(SESSION) == [made]


@tool(safe_to_retry=True)
async def remind_about_file(args: Lookup, ctx: ToolContext) -> str:
    """Schedules a reminder naming a file as the OS gave it (undecodable bytes and all)."""
    ctx.schedule(f"Look at {os.fsdecode(b'caf' + bytes([0xE9]))}", delay_seconds=60)
    return "ok"


async def test_a_handler_scheduling_a_lone_surrogate_still_stores_its_step(db: Store) -> None:
    agent = Agent("files", "You watch files.", [remind_about_file])
    llm = ScriptedLLM([
        LLMResponse(tool_calls=[ToolCall("c1", "remind_about_file", {"q": "x"})]),
        LLMResponse(text="Done."),
    ])  # fmt: skip
    result = await run(agent, llm=llm, message="watch", session_id=SESSION, store=db)
    assert result.status == "complete"
    assert [s.message for s in await db.load_schedules(SESSION)] == ["Look at caf\ufffd"]


async def test_schedule_refuses_a_message_no_turn_can_take(db: Store) -> None:
    await db.append_messages_atomic(SESSION, 0, [Message.user("hi")])
    with pytest.raises(ScheduleError):
        await schedule(db, SESSION, "x" * (MAX_ROW_BYTES + 1), delay_seconds=1)
    assert await db.load_schedules(SESSION) == []


# -- stop_turn: end a turn whose resumes keep crashing ------------------------------------------


def flaky_agent(effects: Effects) -> Agent:
    @tool
    async def post(args: Lookup, ctx: ToolContext) -> str:
        """A side effect."""
        effects["post"] += 1
        return "posted"

    @tool(safe_to_retry=True)
    async def fetch(args: Lookup, ctx: ToolContext) -> str:
        """A read."""
        effects["fetch"] += 1
        return "fetched"

    return Agent("flaky", "You work.", [post, fetch])


STOP_REASON = "Stopped: resuming this turn kept crashing."


async def test_stop_turn_answers_the_orphans_without_running_them(db: Store) -> None:
    effects = Effects()
    agent = flaky_agent(effects)
    llm = ScriptedLLM([LLMResponse(tool_calls=[ToolCall("p1", "post", {"q": "a"}),
                                               ToolCall("f1", "fetch", {"q": "b"})])])  # fmt: skip
    with pytest.raises(SimulatedCrash):
        await run(agent, llm=llm, message="go", session_id=SESSION, store=crash_on_write(db, 2))
    assert effects == {"post": 1, "fetch": 1}
    writes = count_writes(db)
    stopped = await stop_turn(agent, store=writes, session_id=SESSION, reason=STOP_REASON)
    assert (stopped.status, stopped.error, stopped.error_code) == (
        "error", STOP_REASON, "turn-stopped",
    )  # fmt: skip
    assert writes.appends == 1
    assert effects == {"post": 1, "fetch": 1}  # neither handler ran, safe_to_retry or not
    history = await db.load_messages(SESSION)
    assert [m.role for m in history] == ["user", "assistant", "tool", "tool", "assistant"]
    for lost, (name, call_id) in zip(history[2:4], [("post", "p1"), ("fetch", "f1")], strict=True):
        error = ToolDurabilityError.from_message(lost)
        assert error is not None
        assert (error.tool_name, error.tool_call_id) == (name, call_id)
    note = history[-1]
    assert (note.content, note.origin, note.tool_calls) == (STOP_REASON, "stopped", ())
    assert [m.origin for m in history[:-1]] == [None] * 4
    info = await db.get_session(SESSION)
    assert info is not None
    assert info.state == "stopped"
    # The next message starts a new turn as usual (and the lease was let go).
    llm = ScriptedLLM([LLMResponse(text="Starting over.")])
    fresh = await run(agent, llm=llm, message="try again", session_id=SESSION, store=db,
                      wait_seconds=0)  # fmt: skip
    assert (fresh.status, fresh.response) == ("complete", "Starting over.")
    sent = llm.calls[0].messages
    assert [m.content for m in sent[-2:]] == [STOP_REASON, "try again"]
    assert effects == {"post": 1, "fetch": 1}
    info = await db.get_session(SESSION)
    assert info is not None
    assert info.state == "idle"
    assert [m.origin for m in (await db.load_messages(SESSION))[-2:]] == [None, None]


async def test_stop_turn_after_a_failed_llm_call_stores_only_the_note(db: Store) -> None:
    failed = await run(PLAIN, llm=ScriptedLLM([RuntimeError("down")]), message="hello",
                       session_id=SESSION, store=db)  # fmt: skip
    assert failed.status == "error"
    await stop_turn(PLAIN, store=db, session_id=SESSION, reason=STOP_REASON)
    history = await db.load_messages(SESSION)
    assert [(m.role, m.origin) for m in history] == [("user", None), ("assistant", "stopped")]
    idle = ScriptedLLM([])
    again = await run(PLAIN, llm=idle, message=None, session_id=SESSION, store=db)
    assert (again.status, again.response, idle.calls) == ("complete", STOP_REASON, [])


async def test_stop_turn_on_a_finished_turn_writes_nothing(db: Store) -> None:
    await run(PLAIN, llm=ScriptedLLM([LLMResponse(text="Hi.")]), message="hello",
              session_id=SESSION, store=db)  # fmt: skip
    writes = count_writes(db)
    result = await stop_turn(PLAIN, store=writes, session_id=SESSION, reason=STOP_REASON)
    assert (result.status, result.response) == ("complete", "Hi.")
    assert writes.appends == 0
    assert [m.content for m in await db.load_messages(SESSION)] == ["hello", "Hi."]
    with pytest.raises(SessionNotFoundError):
        await stop_turn(PLAIN, store=db, session_id="nobody", reason=STOP_REASON)
    # The lease was let go both times.
    done = await run(PLAIN, llm=ScriptedLLM([LLMResponse(text="Yes.")]), message="again",
                     session_id=SESSION, store=db, wait_seconds=0)  # fmt: skip
    assert done.status == "complete"


async def test_stop_turn_does_not_say_a_safe_tool_is_unsafe(db: Store) -> None:
    agent = flaky_agent(Effects())
    llm = ScriptedLLM([LLMResponse(tool_calls=[ToolCall("f1", "fetch", {"q": "b"})])])
    with pytest.raises(SimulatedCrash):
        await run(agent, llm=llm, message="go", session_id=SESSION, store=crash_on_write(db, 2))
    await stop_turn(agent, store=db, session_id=SESSION, reason=STOP_REASON)
    error = ToolDurabilityError.from_message((await db.load_messages(SESSION))[2])
    assert error is not None
    assert "not declared safe_to_retry" not in error.message  # fetch is
    assert "its turn was stopped before its result was stored" in error.message


class Refund(BaseModel):
    order: str


@tool(requires_approval=True)
async def refund(args: Refund, ctx: ToolContext) -> str:
    """Refund an order (a person approves it first)."""
    return "refunded"


async def test_stop_turn_does_not_call_a_call_that_never_ran_lost(db: Store) -> None:
    agent = Agent("refunds", "You refund.", [refund])
    llm = ScriptedLLM([LLMResponse(tool_calls=[ToolCall("r1", "refund", {"order": "A-1"})])])
    waiting = await run(agent, llm=llm, message="refund A-1", session_id=SESSION, store=db)
    assert waiting.status == "awaiting_approval"
    await stop_turn(agent, store=db, session_id=SESSION, reason=STOP_REASON)
    answer = (await db.load_messages(SESSION))[2]
    assert answer.tool_call_id == "r1"
    assert kind(answer) != ToolErrorKind.TOOL_DURABILITY_ERROR


# -- origin -----------------------------------------------------------------------------------


async def test_origin_marks_every_message_the_run_stores_and_none_before(db: Store) -> None:
    effects = Effects()
    agent = flaky_agent(effects)
    await run(agent, llm=ScriptedLLM([LLMResponse(text="Hi.")]), message="hello",
              session_id=SESSION, store=db)  # fmt: skip
    llm = ScriptedLLM([
        LLMResponse(tool_calls=[ToolCall("p1", "post", {"q": "a"})]),
        LLMResponse(tool_calls=[ToolCall("f1", "fetch", {"q": "b"})]),
        LLMResponse(text="Done."),
    ])  # fmt: skip
    with pytest.raises(SimulatedCrash):
        await run(agent, llm=llm, message="post it", session_id=SESSION,
                  store=crash_on_write(db, 2))  # fmt: skip
    stored: list[Message] = []

    def watch(event: RunEvent) -> None:
        if isinstance(event, MessageStored):
            stored.append(event.message)

    resumed = await run(agent, llm=llm, message=None, session_id=SESSION, store=db,
                        origin="self-resumed", on_event=watch)  # fmt: skip
    assert resumed.status == "complete"
    history = await db.load_messages(SESSION)
    assert [(m.role, m.origin) for m in history] == [
        ("user", None), ("assistant", None),  # the turn before
        ("user", None), ("assistant", None),  # this turn's write #1, before the crash
        ("tool", "self-resumed"),  # the repair
        ("assistant", "self-resumed"), ("tool", "self-resumed"),  # a step
        ("assistant", "self-resumed"),  # the reply
    ]  # fmt: skip
    assert kind(history[4]) == ToolErrorKind.TOOL_DURABILITY_ERROR
    assert stored == history[4:]  # what on_event saw is what was stored
    assert [m.origin for m in resumed.messages[1:]] == [m.origin for m in history]


async def test_origin_on_a_run_without_a_session() -> None:
    result = await run(PLAIN, llm=ScriptedLLM([LLMResponse(text="Hi.")]), message="hello",
                       origin="self-resumed")  # fmt: skip
    assert [(m.role, m.origin) for m in result.messages] == [
        ("system", None), ("user", "self-resumed"), ("assistant", "self-resumed"),
    ]  # fmt: skip


async def test_an_unknown_origin_is_refused_before_any_llm_call() -> None:
    llm = ScriptedLLM([LLMResponse(text="Hi.")])
    with pytest.raises(ConfigurationError):
        await run(PLAIN, llm=llm, message="hello", origin="bogus")  # type: ignore[arg-type]
    assert llm.calls == []
