"""The crash sweep over a session object's alarm: self-resume and schedule firing.

Runs inside workerd (tests/runtime/test_alarm_sweep.py), on a real Durable Object's
`ctx.storage` (the turn mark and the alarm) and a real store (the object's SQLite or
D1). One workload per scenario, each in its own session and with its own mark:

    turn "Post the news":      lookup ‖ post ‖ remind    (remind: ctx.schedule(...),
                               then the final reply       due at once)
    turn "Send the reminder":  post, then the final reply (the schedule's turn)

The client sends the first message (`serve_session`, as the object's fetch does);
from then on only the alarm acts (`serve_alarm`, as the object's alarm() does).
Crash points, one per scenario: every append of the store and every write to the
object's storage (the mark, the alarm), each before and after it lands; every
handler call, before and after its side effect. A crash kills the "instance": the
next one (a new `LiveSession` and `ObjectAlarm`, the same storage and store) gets
the alarm, as after a reset. If the first message never landed, the client sends
it again with the same Idempotency-Key (what a client without an answer does).

Each crash point is played twice: the alarm alone, and the first alarm after the
crash racing a client's POST /resume. Invariants after every scenario: the history
is well formed and every turn ended; no unsafe side effect twice; a durability
error only for unsafe tools; the reminder ran as a turn exactly once if `remind`'s
result was stored, and never if it was lost (the schedule goes with the result, or
not at all); no schedule left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tests.support.history_checks import (
    Effect,
    assert_at_most_once,
    assert_durability_errors_only_for,
    durability_errors,
)

from durable_agents import Agent, LLMResponse, Message, ToolCall, ToolContext, ToolSpec, tool
from durable_agents.cloudflare.alarms import ObjectAlarm
from durable_agents.cloudflare.app import Command, LiveSession, serve_alarm, serve_session
from durable_agents.stores import Store
from durable_agents.testing import FunctionLLM, SimulatedCrash, crash_on_write

FIRST, REMINDER = "Post the news", "Send the reminder"
UNSAFE = frozenset({"post", "remind"})


def policy(messages: list[Message], tools: Sequence[ToolSpec] = ()) -> LLMResponse:
    last_user = max(i for i, m in enumerate(messages) if m.role == "user")
    turn = messages[last_user].content
    step = sum(1 for m in messages[last_user:] if m.role == "assistant")
    if step == 0 and turn == FIRST:
        calls = [ToolCall("", "lookup", {"q": "news"}), ToolCall("", "post", {"text": "news"}),
                 ToolCall("", "remind", {})]  # fmt: skip
        return LLMResponse("", calls)
    if step == 0 and turn == REMINDER:
        return LLMResponse("", [ToolCall("", "post", {"text": "reminder"})])
    return LLMResponse(f"{turn}: done")


Crash = tuple[Literal["append", "storage", "handler"], int, Literal["before", "after"]]


@dataclass
class _World:
    """What survives a crash: the effects the outside world saw, and the counters."""

    crash: Crash | None
    effects: list[Effect] = field(default_factory=list)
    handler_calls: int = 0
    storage_writes: int = 0
    crashed: bool = False

    def due(self, kind: str, n: int) -> Literal["before", "after"] | None:
        if self.crash is None or self.crashed or self.crash[0] != kind or self.crash[1] != n:
            return None
        self.crashed = True
        return self.crash[2]


class _CrashingStorage:
    """The object's storage, except that its n-th write (put, delete, setAlarm,
    deleteAlarm) raises SimulatedCrash, before or after it lands."""

    def __init__(self, storage: Any, world: _World) -> None:
        self._storage, self._world = storage, world

    async def get(self, key: str) -> Any:
        return await self._storage.get(key)

    async def _write(self, name: str, *args: Any) -> Any:
        self._world.storage_writes += 1
        when = self._world.due("storage", self._world.storage_writes)
        if when == "before":
            raise SimulatedCrash(f"before storage write #{self._world.storage_writes} ({name})")
        result = await getattr(self._storage, name)(*args)
        if when == "after":
            raise SimulatedCrash(f"after storage write #{self._world.storage_writes} ({name})")
        return result

    async def put(self, key: str, value: str) -> Any:
        return await self._write("put", key, value)

    async def delete(self, key: str) -> Any:
        return await self._write("delete", key)

    async def setAlarm(self, at: int) -> Any:
        return await self._write("setAlarm", at)

    async def deleteAlarm(self) -> Any:
        return await self._write("deleteAlarm")


def _agent(world: _World) -> Agent[Any]:
    def make(name: str) -> Callable[..., Any]:
        async def handler(args: dict[str, Any], ctx: ToolContext) -> str:
            world.handler_calls += 1
            when = world.due("handler", world.handler_calls)
            if when == "before":
                raise SimulatedCrash(f"before the effect of {name}")
            world.effects.append(Effect(name, ctx.tool_call_id, ctx.idempotency_key))
            if name == "remind":
                ctx.schedule(REMINDER, delay_seconds=0)
            if when == "after":
                raise SimulatedCrash(f"after the effect of {name}")
            return f"{name} ok"

        return handler

    schema = {"type": "object"}
    tools = [
        tool(name="lookup", description="Read.", input=schema, handler=make("lookup"),
             safe_to_retry=True),
        tool(name="post", description="Post.", input=schema, handler=make("post")),
        tool(name="remind", description="Schedule a reminder.", input=schema,
             handler=make("remind")),
    ]  # fmt: skip
    return Agent("alarm-sweeper", "Follow the plan.", tools, max_steps=6)


_Instance = tuple[LiveSession, ObjectAlarm, Callable[[Command], Any]]


def _instance(session_id: str, store: Store, agent: Agent[Any], alarm: ObjectAlarm) -> _Instance:
    """A new instance of the session's object, as after a reset: its own lock and alarm
    state over the same storage and store, and how it serves a command."""
    live = LiveSession()

    async def serve(command: Command) -> Any:
        return await serve_session(
            command, session_id=session_id, store=store, env={}, live=live, agent=agent,
            make_deps=lambda env, http: None, llm=FunctionLLM(policy), alarm=alarm,
        )  # fmt: skip

    return live, alarm, serve


@dataclass
class Outcome:
    crash: Crash | None
    history: list[Message]
    effects: list[Effect]
    appends: int
    storage_writes: int
    handler_calls: int
    alarms: int


async def play(
    store: Store, storage: Any, session_id: str, crash: Crash | None, race: bool = False
) -> Outcome:
    """Play the workload with one crash; with `race`, the first alarm after the crash meets
    a client's POST /resume sent at the same moment (the object's lock orders them)."""
    world = _World(crash)
    agent = _agent(world)
    appends = crash_on_write(store, crash[1], when=crash[2]) if crash and crash[0] == "append" \
        else crash_on_write(store, 10**9)  # fmt: skip
    key = f"durable-agents:turn:{session_id}"

    def instance() -> _Instance:
        alarm = ObjectAlarm(_CrashingStorage(storage, world), key=key, watch_seconds=1)
        return _instance(session_id, appends, agent, alarm)

    live, alarm, serve = instance()
    try:
        await serve(Command("message", FIRST, request_key="first"))
    except SimulatedCrash:
        live, alarm, serve = instance()
    alarms = 0
    for _ in range(12):  # the alarm, again and again, as the platform would fire it
        history = await store.load_messages(session_id)
        if not any(m.role == "user" and m.content == FIRST for m in history):
            try:  # the first message never landed: the client sends it again
                await serve(Command("message", FIRST, request_key="first"))
            except SimulatedCrash:
                live, alarm, serve = instance()
            continue
        mark = await alarm.mark()
        schedules = await store.load_schedules(session_id)
        if mark is None and not schedules and history[-1].is_final_reply:
            break
        alarms += 1
        try:
            if race and world.crashed and alarms == 1:
                outcomes = await asyncio.gather(
                    serve_alarm(session_id, appends, live, alarm, serve),
                    serve(Command("resume")),
                    return_exceptions=True,
                )
                for raised in outcomes:
                    if isinstance(raised, BaseException):
                        raise raised
            else:
                await serve_alarm(session_id, appends, live, alarm, serve)
        except SimulatedCrash:
            live, alarm, serve = instance()
        await asyncio.sleep(0)
    return Outcome(
        crash, await store.load_messages(session_id), world.effects, appends.appends,
        world.storage_writes, world.handler_calls, alarms,
    )  # fmt: skip


def check(outcome: Outcome) -> None:
    history = outcome.history
    where = f"crash at {outcome.crash}"
    assert history, where
    assert history[-1].is_final_reply, (where, history[-1])
    assert [m.content for m in history if m.role == "user"].count(FIRST) == 1, where
    assert_durability_errors_only_for(history, UNSAFE)
    assert_at_most_once(outcome.effects, UNSAFE)
    results = {m.tool_name: m for m in history if m.role == "tool"}
    remind = results.get("remind")
    lost = remind is None or remind.tool_call_id in durability_errors(history)
    reminders = [m for m in history if m.role == "user" and m.content == REMINDER]
    assert len(reminders) == (0 if lost else 1), (where, len(reminders), lost)
    assert all(m.origin == "scheduled" for m in reminders), where
    for message in history:
        if message.role == "assistant":  # every call answered once
            for call in message.tool_calls:
                answers = [m for m in history if m.role == "tool" and m.tool_call_id == call.id]
                assert len(answers) == 1, (where, call.id, len(answers))


@dataclass
class Report:
    scenarios: int
    appends: int
    storage_writes: int
    handler_calls: int
    most_alarms: int
    self_resumed: int

    def __str__(self) -> str:
        return (
            f"{self.scenarios} crash points, each with the alarm alone and racing a client's "
            f"/resume (baseline {self.appends} appends, "
            f"{self.storage_writes} storage writes, {self.handler_calls} handler calls; "
            f"{self.self_resumed} scenarios finished by a self-resume; at most "
            f"{self.most_alarms} alarms per scenario): every one at most once"
        )


async def sweep(store: Store, storage: Any, prefix: str) -> Report:
    baseline = await play(store, storage, f"{prefix}-baseline", None)
    check(baseline)
    assert [m.content for m in baseline.history if m.role == "user"] == [FIRST, REMINDER]
    crashes: list[Crash] = [
        (kind, n, when)
        for kind, total in (
            ("append", baseline.appends),
            ("storage", baseline.storage_writes),
            ("handler", baseline.handler_calls),
        )
        for n in range(1, total + 1)
        for when in ("before", "after")
    ]
    most, resumed = 0, 0
    for index, crash in enumerate(crashes):
        for race in (False, True):
            outcome = await play(store, storage, f"{prefix}-{index}-{race}", crash, race)
            check(outcome)
            most = max(most, outcome.alarms)
            resumed += any(m.origin == "self-resumed" for m in outcome.history)
    return Report(
        len(crashes), baseline.appends, baseline.storage_writes, baseline.handler_calls,
        most, resumed,
    )  # fmt: skip


async def crash_loop(store: Store, storage: Any, session_id: str) -> dict[str, Any]:
    """A turn whose every run crashes (a safe tool that takes the process down each time
    it runs): the alarm resumes it MAX_SELF_RESUMES times, each after a longer wait, then
    stops it. The clock is the test's: an alarm that fires before a mark's check does
    nothing, and the clock then moves to that check. Returns what happened."""
    world = _World(None)
    now = [1_900_000_000.0]

    async def boom(args: dict[str, Any], ctx: ToolContext) -> str:
        world.handler_calls += 1
        raise SimulatedCrash("the lookup takes the process down")

    plain = _agent(world)
    tools = [t.with_handler(boom) if t.name == "lookup" else t for t in plain.tools]
    agent = Agent(plain.name, plain.instructions, tools, max_steps=6)
    key = f"durable-agents:turn:{session_id}"

    def instance() -> _Instance:
        alarm = ObjectAlarm(storage, key=key, watch_seconds=30, clock=lambda: now[0])
        return _instance(session_id, store, agent, alarm)

    live, alarm, serve = instance()
    try:
        await serve(Command("message", FIRST, request_key="first"))
    except SimulatedCrash:
        live, alarm, serve = instance()
    crashed_at = now[0]
    resumed_after: list[float] = []  # seconds from the crash before it to each resume
    for _ in range(20):
        mark = await alarm.mark()
        if mark is None:
            break
        calls = world.handler_calls
        try:
            await serve_alarm(session_id, store, live, alarm, serve)
        except SimulatedCrash:
            live, alarm, serve = instance()
        if world.handler_calls > calls:  # it resumed (and crashed again)
            resumed_after.append(now[0] - crashed_at)
            crashed_at = now[0]
        elif await alarm.mark() == mark:  # too early: wait for the mark's check
            now[0] = max(now[0], int(mark["check_at"]) / 1000)
        now[0] += 1
    info = await store.get_session(session_id)
    return {
        "history": await store.load_messages(session_id),
        "handler_calls": world.handler_calls,
        "effects": world.effects,
        "state": None if info is None else info.state,
        "resumed_after": resumed_after,
        "mark": await alarm.mark(),
        "schedules": len(await store.load_schedules(session_id)),
    }


async def deferred_step_meets_a_client(
    store: Store, storage: Any, session_id: str
) -> dict[str, Any]:
    """A step over its invocation's budget is deferred ("continues" mark, alarm for now);
    a client's message arriving before the alarm is refused (409) and leaves the mark as
    it was; then the alarm, a fresh invocation each time, runs the rest to the end."""
    from durable_agents.budget import InvocationBudget, spend

    ran: list[str] = []

    async def post(args: dict[str, Any], ctx: ToolContext) -> str:
        spend(subrequests=1)  # as a fetch does
        ran.append(ctx.tool_call_id)
        return "posted"

    def many(messages: list[Message], tools: Sequence[ToolSpec] = ()) -> LLMResponse:
        last_user = max(i for i, m in enumerate(messages) if m.role == "user")
        if any(m.role == "assistant" for m in messages[last_user:]):
            return LLMResponse("all posted")
        return LLMResponse("", [ToolCall(f"p{i}", "post", {"n": i}) for i in range(10)])

    agent = Agent("poster", "Post.", [tool(name="post", description="Post.",
                                           input={"type": "object"}, handler=post)])  # fmt: skip
    alarm = ObjectAlarm(storage, key=f"durable-agents:turn:{session_id}", watch_seconds=30)
    live = LiveSession()

    async def serve(command: Command) -> Any:
        return await serve_session(
            command, session_id=session_id, store=store, env={}, live=live, agent=agent,
            make_deps=lambda env, http: None, llm=FunctionLLM(many), alarm=alarm,
            budget=InvocationBudget(subrequests=6, queries=1_000),
        )  # fmt: skip

    first = await serve(Command("message", "post ten"))
    after_first = await alarm.mark()
    client = await serve(Command("message", "something else"))
    after_client = await alarm.mark()
    alarms = 0
    while (await alarm.mark()) is not None and alarms < 10:
        alarms += 1
        await serve_alarm(session_id, store, live, alarm, serve)
    history = await store.load_messages(session_id)
    return {
        "first": [first.status, first.body.get("status")],
        "client": [client.status, client.body.get("error", {}).get("code")],
        "continues": [
            bool((after_first or {}).get("continues")),
            bool((after_client or {}).get("continues")),
        ],
        "alarms": alarms,
        "ran": ran,
        "results": len([m for m in history if m.role == "tool"]),
        "last": history[-1].content,
        "users": [m.content for m in history if m.role == "user"],
    }
