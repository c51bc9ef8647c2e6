"""The worker (`durable_agents.worker`, `durable-agents worker`): crashed turns resumed,
due schedules fired, once, by one process or two racing, killed anywhere.

In-process first (`work_once` on a SQLite store with a clock the test moves), then
real `durable-agents worker` processes (`--app tests.support.worker_app:make_runner`) on one
SQLite file: two racing, one whose resumes keep crashing, and a sweep that
SIGKILLs workers at many points of resuming and firing and checks that no
schedule is lost or run twice and no unsafe call runs twice. The race and the sweep
run on one PostgreSQL database too, with four workers (`--db postgresql://...`).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from tests.support.history_checks import (
    assert_at_most_once,
    assert_durability_errors_only_for,
    assert_effects_match_history,
    assert_well_formed,
    durability_errors,
    read_effects,
)
from tests.support.postgres_server import postgres_fixture  # noqa: F401 - fixture
from tests.support.process_agent import (
    AGENT,
    SAFE_TOOLS,
    UNSAFE_TOOLS,
    assert_plays_script,
    child,
    make_handlers,
    next_action,
    turn_message,
    wait_ready,
)
from tests.support.worker_app import read_seen, turn_starts

from durable_agents import (
    Agent,
    ConfigurationError,
    LLMResponse,
    Message,
    StoreError,
    ToolCall,
    approve,
    pending_approvals,
    run,
    schedule,
    tool,
)
from durable_agents.stores import SQLiteStore, postgres_store, sqlite_store
from durable_agents.testing import CrashingStore, FunctionLLM, ScriptedLLM, SimulatedCrash
from durable_agents.worker import Runner, WorkReport, load_runner, serve, work_once

ROOT = (
    Path(__file__).resolve().parents[1]
)  # the worker runs here: `--app tests.support.worker_app:...`
SRC = ROOT / "src"
HOST = socket.gethostname()


class Clock:
    """Seconds that move only when the test says so."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def recording_llm(seen: list[str]) -> FunctionLLM:
    """`process_agent`'s deterministic model; `seen` gets each turn's message as the
    model first sees it."""

    def answer(messages: list[Message], tools: Any) -> LLMResponse:
        first = turn_starts(messages)
        if first is not None:
            seen.append(first)
        return next_action(messages, tools)

    return FunctionLLM(answer)


def crashing_llm(store: Mortal) -> FunctionLLM:
    """A model whose every call kills the "process": the store dies with it."""

    def answer(messages: list[Message], tools: Any) -> LLMResponse:
        store.dead = True
        raise SimulatedCrash("the process died in an LLM call")

    return FunctionLLM(answer)


class Mortal:
    """A store a simulated crash kills: once `dead`, every call raises SimulatedCrash,
    so nothing releases the lease (as when the process is gone). `revive()` is the
    next process, on the same file."""

    def __init__(self, inner: SQLiteStore) -> None:
        self.inner = inner
        self.dead = False

    def revive(self) -> Mortal:
        return Mortal(self.inner)

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.inner, name)
        if not callable(found):
            return found

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.dead:
                raise SimulatedCrash("the process is dead")
            return await found(*args, **kwargs)

        return call


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def store(tmp_path: Path, clock: Clock) -> AsyncIterator[SQLiteStore]:
    opened = sqlite_store(tmp_path / "worker.db", clock=clock)
    yield opened
    await opened.close()


def runner_for(llm: Any, effects: Path, clock: Clock, **kwargs: Any) -> Runner[Any]:
    return Runner(AGENT, llm, tools=make_handlers(effects, 0), clock=clock, **kwargs)


async def complete_turn(store: Any, session_id: str, effects: Path, clock: Clock) -> None:
    result = await run(
        AGENT, llm=recording_llm([]), message=turn_message(0), session_id=session_id,
        store=store, tools=make_handlers(effects, 0), clock=clock,
    )  # fmt: skip
    assert result.status == "complete"


async def interrupted_turn(store: Any, session_id: str, effects: Path, owner: str) -> None:
    """Turn 0 stored up to write #1 of its second step (post, charge and lookup
    stored without results), and the lease its dead run left behind, for `owner`."""
    with pytest.raises(SimulatedCrash):
        await run(
            AGENT, llm=recording_llm([]), message=turn_message(0), session_id=session_id,
            store=CrashingStore(store, crash_on=3, when="after"), tools=make_handlers(effects, 0),
        )  # fmt: skip
    assert await store.acquire_lease(session_id, owner, 30_000) is None


def outcomes(report: WorkReport) -> list[tuple[str, str, str]]:
    return [(i.action, i.session_id, i.outcome) for i in report.items]


async def leftover_leases(store: Any) -> list[tuple[str, Any]]:
    return list(await store.expired_leases(limit=1000, host=HOST))


# -- in process ---------------------------------------------------------------------------


async def test_a_turn_whose_process_died_is_resumed_once_its_lease_expires(
    store: Any, clock: Clock, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.log"
    await interrupted_turn(store, "s1", effects, owner="elsewhere/4242/run1")
    await complete_turn(store, "done", effects, clock)
    seen: list[str] = []
    runner = runner_for(recording_llm(seen), effects, clock)

    assert outcomes(await work_once(runner, store)) == []  # another host's run, still alive
    clock.advance(30)
    report = await work_once(runner, store)
    assert outcomes(report) == [("resume", "s1", "resumed")]
    assert report.items[0].status == "complete"

    history = await store.load_messages("s1")
    turns = assert_well_formed(history, turns=1, user_messages=[turn_message(0)])
    assert_plays_script(turns)
    assert sorted(e.tool_name for e in durability_errors(history).values()) == ["charge", "post"]
    resumed = history[4:]  # after the user message, the first step and write #1 of the second
    assert resumed
    assert {m.origin for m in resumed} == {"self-resumed"}
    assert {m.origin for m in history[:4]} == {None}
    assert seen == []  # the turn went on: the model never saw its message start a turn again
    assert_effects_match_history(
        history, read_effects(effects), session_id="s1", safe_tools=SAFE_TOOLS,
        unsafe_tools=UNSAFE_TOOLS,
    )  # fmt: skip
    assert await leftover_leases(store) == []
    assert outcomes(await work_once(runner, store)) == []


async def test_a_dead_process_of_this_host_is_resumed_at_once(
    store: Any, clock: Clock, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.log"
    await interrupted_turn(store, "s1", effects, owner=f"{HOST}/{_dead_pid()}/run1")
    report = await work_once(runner_for(recording_llm([]), effects, clock), store)
    assert outcomes(report) == [("resume", "s1", "resumed")]  # no wait for the expiry
    assert (await store.load_messages("s1"))[-1].is_final_reply


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait()
    return proc.pid


async def test_a_due_schedule_fires_once_and_a_cancelled_one_never(
    store: Any, clock: Clock, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.log"
    for session in ("a", "b"):
        await complete_turn(store, session, effects, clock)
    kept = await schedule(store, "a", "check ticket A again", delay_seconds=60, clock=clock)
    dropped = await schedule(store, "b", "check ticket B again", delay_seconds=60, clock=clock)
    assert await store.delete_schedule("b", dropped.schedule_id)
    seen: list[str] = []
    runner = runner_for(recording_llm(seen), effects, clock)

    assert outcomes(await work_once(runner, store)) == []  # not due yet
    clock.advance(60)
    report = await work_once(runner, store)
    assert outcomes(report) == [("fire", "a", "fired")]
    assert (report.items[0].schedule_id, report.items[0].status) == (kept.schedule_id, "complete")
    assert outcomes(await work_once(runner, store)) == []

    history = await store.load_messages("a")
    turns = assert_well_formed(history, user_messages=[turn_message(0), "check ticket A again"])
    assert_plays_script(turns)
    assert turns[1].user.request_key == kept.request_key
    assert {m.origin for m in history[len(history) - 10 :]} == {"scheduled"}  # the whole turn
    assert seen == ["check ticket A again"]  # the model saw it once
    assert await store.load_schedules("a") == []
    assert len(await store.load_messages("b")) == 10  # turn 0 only


class FinishedByAnother:
    """A store on which another worker finishes the turn between this worker's look at
    the session and its claim: the first load shows the interrupted turn, the claim (an
    `acquire_lease`) lands after the other worker ran it to the end and let go."""

    def __init__(self, inner: Any, finish: Any) -> None:
        self.inner = inner
        self.finish = finish

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def acquire_lease(self, session_id: str, owner: str, ttl_ms: int, **kw: Any) -> Any:
        if self.finish is not None:
            finish, self.finish = self.finish, None
            await finish()
        return await self.inner.acquire_lease(session_id, owner, ttl_ms, **kw)


async def test_a_turn_another_worker_finished_after_the_look_is_cleared_not_run(
    store: Any, clock: Clock, tmp_path: Path
) -> None:
    """Two workers race for a dead run's turn: the one whose claim lands after the other
    finished the turn reports "cleared" and never calls the model (it once ran
    `run(message=None)` on the finished turn and reported a second resume)."""
    effects = tmp_path / "effects.log"
    await interrupted_turn(store, "s1", effects, owner=f"{HOST}/{_dead_pid()}/run1")
    other = runner_for(recording_llm([]), effects, clock)

    async def finish() -> None:
        assert outcomes(await work_once(other, store)) == [("resume", "s1", "resumed")]

    calls: list[int] = []

    def model(messages: list[Message], tools: Any) -> LLMResponse:
        calls.append(len(messages))
        return next_action(messages, tools)

    llm = FunctionLLM(model)
    report = await work_once(runner_for(llm, effects, clock), FinishedByAnother(store, finish))
    assert outcomes(report) == [("resume", "s1", "cleared")]
    assert "finished the turn meanwhile" in report.items[0].detail
    assert calls == []
    assert await leftover_leases(store) == []


class CancelsWhileListed:
    """A store whose due schedules are cancelled right after they are listed (by a
    person, or fired by another worker)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def due_schedules(self, before_ms: int, *, limit: int = 100) -> Any:
        due = await self.inner.due_schedules(before_ms, limit=limit)
        for session_id, found in due:
            await self.inner.delete_schedule(session_id, found.schedule_id)
        return due


async def test_a_schedule_cancelled_while_the_worker_fires_it_does_not_run(
    store: Any, clock: Clock, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.log"
    await complete_turn(store, "a", effects, clock)
    await schedule(store, "a", "too late", delay_seconds=0, clock=clock)
    seen: list[str] = []
    runner = runner_for(recording_llm(seen), effects, clock)
    report = await work_once(runner, CancelsWhileListed(store))
    assert outcomes(report) == [("fire", "a", "gone")]
    assert seen == []  # found gone before the model was asked

    # Cancelled while the model thinks: the trigger refuses the turn's first write.
    cancelled = await schedule(store, "a", "cancelled meanwhile", delay_seconds=0, clock=clock)

    def cancel_then_answer(messages: list[Message], tools: Any) -> Any:
        asyncio.get_running_loop().create_task(store.delete_schedule("a", cancelled.schedule_id))
        return asyncio.sleep(0.05, next_action(messages, tools))

    runner = runner_for(FunctionLLM(cancel_then_answer), effects, clock)
    report = await work_once(runner, store)
    assert outcomes(report) == [("fire", "a", "gone")]
    assert len(await store.load_messages("a")) == 10  # turn 0 only
    assert await leftover_leases(store) == []


DEPLOY = tool(
    name="deploy", description="Deploy.", input={"properties": {}}, requires_approval=True
)
APPROVING = Agent("approving", "Deploy when asked.", [DEPLOY])


async def test_a_schedule_waits_while_calls_await_approval(store: Any, clock: Clock) -> None:
    llm = ScriptedLLM([
        LLMResponse("Deploying.", [ToolCall("", "deploy", {})]),
        LLMResponse("Deployed."),
        LLMResponse("Checked the deploy."),
    ])  # fmt: skip
    tools = {"deploy": lambda args, ctx: "ok"}
    first = await run(
        APPROVING, llm=llm, message="deploy", session_id="s", store=store, tools=tools, clock=clock
    )
    assert first.status == "awaiting_approval"
    await schedule(store, "s", "check the deploy", delay_seconds=0, clock=clock)
    runner = Runner(APPROVING, llm, tools=tools, clock=clock)

    for _ in range(2):
        report = await work_once(runner, store)
        assert outcomes(report) == [("fire", "s", "waiting")]
        assert "approval" in report.items[0].detail
        assert len(await store.load_schedules("s")) == 1

    (waiting,) = await pending_approvals(store, "s")
    await approve(store, "s", waiting.tool_call_id, digest=waiting.digest, approved=True)
    assert (await run(APPROVING, llm=llm, session_id="s", store=store, tools=tools)).response == (
        "Deployed."
    )
    report = await work_once(runner, store)
    assert outcomes(report) == [("fire", "s", "fired")]
    assert (await store.load_messages("s"))[-1].content == "Checked the deploy."


async def test_resumes_that_keep_crashing_back_off_then_the_turn_is_stopped(
    tmp_path: Path, clock: Clock
) -> None:
    effects = tmp_path / "effects.log"
    inner = sqlite_store(tmp_path / "worker.db", clock=clock)
    await interrupted_turn(inner, "s1", effects, owner="elsewhere/1/run1")
    clock.advance(30)
    ids = iter(range(1000))
    kwargs = {"lease_seconds": 5.0, "new_id": lambda: f"id{next(ids)}"}
    options = {"max_resumes": 3, "backoff_seconds": 10.0}

    store = Mortal(inner)
    began: list[float] = []
    for attempt in (1, 2, 3):
        began.append(clock.now)
        with pytest.raises(SimulatedCrash):
            await work_once(
                runner_for(crashing_llm(store), effects, clock, **kwargs), store, **options
            )
        ((_, holder),) = await inner.expired_leases(limit=10, host=HOST)
        assert holder.owner.split("/", 2)[2].startswith(
            f"worker.{attempt}.{int(clock.now * 1000)}."
        )
        store = store.revive()
        clock.advance(5)  # the lease expires
        wait = 10 * 2 ** (attempt - 1) - 5  # the back-off after try n: 10 s, doubling
        if attempt < 3:
            report = await work_once(
                runner_for(crashing_llm(store), effects, clock, **kwargs), store, **options
            )
            assert outcomes(report) == [("resume", "s1", "waiting")], report
            assert f"try {attempt + 1} in" in report.items[0].detail
            clock.advance(wait)
    assert [round(b - began[0]) for b in began] == [0, 10, 30]

    seen: list[str] = []
    report = await work_once(
        runner_for(recording_llm(seen), effects, clock, **kwargs), store, **options
    )
    assert outcomes(report) == [("resume", "s1", "stopped")]
    assert seen == []  # stopped, not run: the model is not asked again
    history = await inner.load_messages("s1")
    note = history[-1]
    assert (note.role, note.origin) == ("assistant", "stopped")
    assert note.content.startswith(
        "This turn was stopped by durable-agents: it was resumed 3 times"
    )
    assert_well_formed(history, turns=1)  # every call answered, then the note as the reply
    assert sorted(e.tool_name for e in durability_errors(history).values()) == ["charge", "post"]
    (info,) = (await inner.list_sessions()).sessions
    assert info.state == "stopped"
    assert await leftover_leases(inner) == []
    assert outcomes(await work_once(runner_for(recording_llm(seen), effects, clock), inner)) == []

    # The next message starts a new turn, and a turn that finishes resets the count.
    result = await run(
        AGENT, llm=recording_llm(seen), message=turn_message(1), session_id="s1", store=inner,
        tools=make_handlers(effects, 0), clock=clock,
    )  # fmt: skip
    assert result.status == "complete"
    await inner.close()


async def test_a_firing_that_keeps_crashing_is_held_until_cancelled(
    tmp_path: Path, clock: Clock
) -> None:
    effects = tmp_path / "effects.log"
    inner = sqlite_store(tmp_path / "worker.db", clock=clock)
    await complete_turn(inner, "s", effects, clock)
    poison = await schedule(inner, "s", "the poison pill", delay_seconds=0, clock=clock)
    options = {"max_resumes": 2, "backoff_seconds": 0.0}
    store = Mortal(inner)
    for _ in range(2):
        with pytest.raises(SimulatedCrash):
            await work_once(runner_for(crashing_llm(store), effects, clock), store, **options)
        store = store.revive()
        clock.advance(30)
    runner = runner_for(recording_llm([]), effects, clock)
    for _ in range(2):
        report = await work_once(runner, inner, **options)
        assert outcomes(report) == [("fire", "s", "error")]
        assert "crashed the worker 2 times" in report.items[0].detail
    assert len(await inner.load_schedules("s")) == 1
    assert len(await inner.load_messages("s")) == 10

    assert await inner.delete_schedule("s", poison.schedule_id)
    report = await work_once(runner, inner, **options)
    assert outcomes(report) == [("resume", "s", "cleared")]
    assert await leftover_leases(inner) == []
    await inner.close()


class BrokenSession:
    """A store that fails every read of one session."""

    def __init__(self, inner: Any, broken: str) -> None:
        self.inner = inner
        self.broken = broken

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.inner, name)
        if not callable(found) or name in ("expired_leases", "due_schedules"):
            return found

        async def call(*args: Any, **kwargs: Any) -> Any:
            if args and args[0] == self.broken:
                raise StoreError(f"cannot read {self.broken}", session_id=self.broken)
            return await found(*args, **kwargs)

        return call


async def test_one_broken_session_never_stops_the_others(
    store: Any, clock: Clock, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.log"
    for session in ("broken", "fine"):
        await interrupted_turn(store, session, effects, owner=f"elsewhere/1/{session}")
        await schedule(store, session, f"later for {session}", delay_seconds=0, clock=clock)
    other = Agent("another-agent", "Someone else's.", [])
    await run(other, llm=ScriptedLLM([LLMResponse("hi")]), message="hi", session_id="theirs",
              store=store)  # fmt: skip
    await schedule(store, "theirs", "not for this worker", delay_seconds=0, clock=clock)
    clock.advance(30)
    runner = runner_for(recording_llm([]), effects, clock)
    report = await work_once(runner, BrokenSession(store, "broken"))
    assert sorted(outcomes(report)) == [
        ("fire", "broken", "waiting"),  # its interrupted turn comes first
        ("fire", "fine", "fired"),
        ("fire", "theirs", "skipped"),
        ("resume", "broken", "error"),
        ("resume", "fine", "resumed"),
    ]
    (error,) = report.errors
    assert error.detail == "StoreError: cannot read broken"
    assert await store.load_messages("theirs") != []
    assert len(await store.load_schedules("theirs")) == 1


async def test_serve_passes_until_stopped(store: Any, clock: Clock, tmp_path: Path) -> None:
    effects = tmp_path / "effects.log"
    await complete_turn(store, "a", effects, clock)
    runner = runner_for(recording_llm([]), effects, clock)
    stop = asyncio.Event()
    reports: list[WorkReport] = []

    await schedule(store, "a", "in a minute", delay_seconds=60, clock=clock)

    def on_report(report: WorkReport) -> None:
        reports.append(report)
        if len(reports) == 2:
            clock.advance(60)
        if any(i.outcome == "fired" for i in report.items):
            stop.set()

    await asyncio.wait_for(
        serve(runner, store, poll=0.01, stop=stop, on_report=on_report), timeout=10
    )
    assert [outcomes(r) for r in reports] == [[], [], [("fire", "a", "fired")]]
    assert (await store.load_messages("a"))[-1].origin == "scheduled"


def test_load_runner_takes_a_runner_or_a_function_returning_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "my_worker_app.py").write_text(
        "from durable_agents import Agent\n"
        "from durable_agents.testing import ScriptedLLM\n"
        "from durable_agents.worker import Runner\n"
        "runner = Runner(Agent('a', 'x', []), ScriptedLLM([]))\n"
        "def make():\n    return runner\n"
        "class Holder:\n    nested = runner\n"
        "not_a_runner = 42\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    runner = load_runner("my_worker_app:runner")
    assert isinstance(runner, Runner)
    assert load_runner("my_worker_app:make") is runner
    assert load_runner("my_worker_app:Holder.nested") is runner
    for spec, problem in [
        ("my_worker_app", "MODULE:ATTR"),
        ("no_such_module_here:x", "no module"),
        ("my_worker_app:missing", "has no 'missing'"),
        ("my_worker_app:not_a_runner", "names int"),
    ]:
        with pytest.raises(ConfigurationError, match=problem):
            load_runner(spec)


# -- real processes -----------------------------------------------------------------------


# Where a worker's sessions are: a SQLite file, or a PostgreSQL database (its URL) shared by
# more workers than one machine's file would see (tests/support/postgres_server.py).
Where = Path | str


def store_at(db: Where) -> Any:
    return postgres_store(db) if isinstance(db, str) else sqlite_store(db)


def sessions_at(request: pytest.FixtureRequest, backend: str, file: Path) -> Where:
    """A fresh SQLite file, or a fresh PostgreSQL schema on this process's server."""
    return request.getfixturevalue("postgres").fresh_dsn() if backend == "postgres" else file


def worker_command() -> list[str]:
    script = Path(sys.executable).parent / "durable-agents"
    return [str(script)] if script.exists() else [sys.executable, "-m", "durable_agents.cli"]


@contextmanager
def worker(db: Where, files: Path, *options: str, **env: str) -> Iterator[subprocess.Popen[str]]:
    """A `durable-agents worker` process on `db`, run from the repository's root (so
    `--app tests.support.worker_app:...` is found from the current directory); killed
    and reaped on leaving."""
    environ = dict(os.environ)
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), environ.get("PYTHONPATH")]))
    environ["WORKER_APP_EFFECTS"] = str(files / "effects.log")
    environ["WORKER_APP_SEEN"] = str(files / "seen.log")
    environ.update(env)
    command = [
        *worker_command(),
        "worker",
        "--db",
        str(db),
        "--app",
        "tests.support.worker_app:make_runner",
    ]
    proc = subprocess.Popen(
        [*command, *options], cwd=ROOT, env=environ, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return proc.returncode, err


def prepare(
    db: Where, files: Path, plan: dict[str, Sequence[str]], interrupted: Sequence[str]
) -> None:
    """Work on `db`: each session of `plan` (with turn 0 done, if it has no turn yet)
    gets a due schedule per message, due in that order; each of `interrupted` gets a
    turn 0 cut short by a crash, its lease held by a process of this host that is gone."""

    async def make() -> None:
        clock = Clock(time.time() - 3600)
        async with store_at(db) as store:
            for session, messages in plan.items():
                if not await store.load_messages(session):
                    await complete_turn(store, session, files / "effects.log", clock)
                for n, message in enumerate(messages):
                    await schedule(store, session, message, at=_iso(clock.now + n))
            for session in interrupted:
                owner = f"{HOST}/{_dead_pid()}/crashed"
                await interrupted_turn(store, session, files / "effects.log", owner)

    asyncio.run(make())


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def check_store(
    db: Where, files: Path, plan: dict[str, Sequence[str]], interrupted: Sequence[str]
) -> Counter[str]:
    """Every session finished as planned: each schedule's message once, in due order,
    every turn played through; no schedule or lease left; no unsafe call twice, none
    run unstored. Returns how many times the model saw each scheduled message."""

    async def load() -> tuple[dict[str, list[Message]], list[Any], list[Any]]:
        async with store_at(db) as store:
            sessions = [*plan, *interrupted]
            histories = {s: await store.load_messages(s) for s in sessions}
            schedules = [x for s in sessions for x in await store.load_schedules(s)]
            return histories, schedules, await store.expired_leases(limit=100, host=HOST)

    histories, schedules, leases = asyncio.run(load())
    assert schedules == [], "schedules never fired"
    assert leases == [], "leases left behind"
    effects = read_effects(files / "effects.log")
    assert_at_most_once(effects, UNSAFE_TOOLS)
    for session, history in histories.items():
        wanted = [turn_message(0), *plan.get(session, ())]
        turns = assert_well_formed(history, user_messages=wanted)
        assert_plays_script(turns)
        assert_durability_errors_only_for(history, UNSAFE_TOOLS)
        assert_effects_match_history(
            history, effects, session_id=session, safe_tools=SAFE_TOOLS, unsafe_tools=UNSAFE_TOOLS
        )
        for turn in turns[1:]:
            assert (turn.user.origin, turn.user.request_key[:9]) == ("scheduled", "schedule:")
    seen = Counter(read_seen(files / "seen.log"))
    for messages in plan.values():
        for message in messages:
            assert seen[message] >= 1, f"the model never saw {message!r}"
    return seen


RACE_PLAN = {
    "r1": ["r1 first", "r1 second"],
    "r2": ["r2 only"],
    "r3": ["r3 only"],
    "r4": ["r4 only"],
}
RACE_INTERRUPTED = ["r5", "r6"]


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "workers"), [("sqlite", 2), ("postgres", 4)])
def test_workers_racing_run_each_schedule_and_resume_once(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str, workers: int
) -> None:
    db = sessions_at(request, backend, tmp_path / "race.db")
    prepare(db, tmp_path, RACE_PLAN, RACE_INTERRUPTED)
    start = tmp_path / "start"
    options = ("--once", "--backoff", "0")
    with ExitStack() as running:
        procs = [
            running.enter_context(worker(db, tmp_path, *options, WORKER_APP_START_FILE=str(start)))
            for _ in range(workers)
        ]
        start.touch()
        results = [finish(proc) for proc in procs]
    for code, err in results:
        assert code == 0, err
    logs = "\n".join(err for _, err in results)
    print(logs)
    seen = check_store(db, tmp_path, RACE_PLAN, RACE_INTERRUPTED)
    scheduled = [m for messages in RACE_PLAN.values() for m in messages]
    assert {m: seen[m] for m in scheduled} == dict.fromkeys(scheduled, 1)  # the model saw each once
    assert sum(seen.values()) == len(scheduled)  # and never an interrupted turn's message again
    assert logs.count(": fired (complete)") == len(scheduled)
    assert logs.count(": resumed (complete)") == len(RACE_INTERRUPTED)


@pytest.mark.slow
def test_a_kill_during_a_recurring_occurrence_runs_it_once_and_the_next_on_time(
    tmp_path: Path,
) -> None:
    """A real worker SIGKILLed in a handler of a recurring schedule's occurrence (its first
    write landed: the message, and the rule moved on); the next worker resumes that turn
    and fires nothing: the occurrence ran once, the next is where the rule puts it."""
    db, effects = tmp_path / "rhythm.db", tmp_path / "effects.log"

    async def make() -> Any:
        clock = Clock(time.time() - 630)  # the first occurrence was due 30 s ago
        async with sqlite_store(db) as store:
            await complete_turn(store, "k", effects, clock)
            return await schedule(store, "k", "k every ten minutes", every_seconds=600, clock=clock)

    made = asyncio.run(make())

    async def load() -> tuple[list[Message], list[Any]]:
        async with sqlite_store(db) as store:
            return await store.load_messages("k"), await store.load_schedules("k")

    options = ("--once", "--backoff", "0")
    with worker(db, tmp_path, *options, WORKER_APP_DIE_AT="2", WORKER_APP_DIE_ON="tool") as proc:
        code, err = finish(proc)
    assert code == -signal.SIGKILL, err
    history, rows = asyncio.run(load())
    occurrence = [m for m in history if m.request_key == made.request_key]
    assert [m.origin for m in occurrence] == ["scheduled"]  # stored, the turn cut short
    assert [r.due_at for r in rows] == [made.due_at + 600_000]  # and the rule moved on

    with worker(db, tmp_path, *options) as proc:
        code, err = finish(proc)
    assert code == 0, err
    assert "resume session k: resumed (complete)" in err, err
    assert "fire" not in err, err  # the next occurrence is not due: nothing fired
    history, rows = asyncio.run(load())
    turns = assert_well_formed(history, user_messages=[turn_message(0), "k every ten minutes"])
    assert_plays_script(turns)
    assert turns[1].user.request_key == made.request_key
    assert [r.due_at for r in rows] == [made.due_at + 600_000]  # on time, from the rule
    logged = read_effects(effects)
    assert_at_most_once(logged, UNSAFE_TOOLS)
    assert_effects_match_history(
        history, logged, session_id="k", safe_tools=SAFE_TOOLS, unsafe_tools=UNSAFE_TOOLS
    )
    assert Counter(read_seen(tmp_path / "seen.log"))["k every ten minutes"] == 1


@pytest.mark.slow
def test_two_workers_racing_run_a_recurring_occurrence_once(tmp_path: Path) -> None:
    db = tmp_path / "race.db"

    async def make() -> Any:
        clock = Clock(time.time() - 630)  # the first occurrence was due 30 s ago
        async with sqlite_store(db) as store:
            await complete_turn(store, "r", tmp_path / "effects.log", clock)
            return await schedule(store, "r", "r every ten minutes", every_seconds=600, clock=clock)

    made = asyncio.run(make())
    start = tmp_path / "start"
    options = ("--once", "--backoff", "0")
    with (
        worker(db, tmp_path, *options, WORKER_APP_START_FILE=str(start)) as one,
        worker(db, tmp_path, *options, WORKER_APP_START_FILE=str(start)) as two,
    ):
        start.touch()
        results = [finish(one), finish(two)]
    for code, err in results:
        assert code == 0, err
    logs = "\n".join(err for _, err in results)
    assert logs.count(": fired (complete)") == 1, logs

    async def load() -> tuple[list[Message], list[Any]]:
        async with sqlite_store(db) as store:
            return await store.load_messages("r"), await store.load_schedules("r")

    history, rows = asyncio.run(load())
    turns = assert_well_formed(history, user_messages=[turn_message(0), "r every ten minutes"])
    assert turns[1].user.request_key == made.request_key
    assert [r.due_at for r in rows] == [made.due_at + 600_000]
    assert Counter(read_seen(tmp_path / "seen.log"))["r every ten minutes"] == 1
    assert_at_most_once(read_effects(tmp_path / "effects.log"), UNSAFE_TOOLS)


@pytest.mark.slow
def test_a_worker_whose_resumes_keep_crashing_stops_the_turn(tmp_path: Path) -> None:
    db = tmp_path / "poison.db"
    prepare(db, tmp_path, {}, ["p1"])
    options = ("--once", "--backoff", "0", "--max-resumes", "3")
    for _ in range(3):  # each worker dies at its first LLM call
        with worker(db, tmp_path, *options, WORKER_APP_DIE_AT="1", WORKER_APP_DIE_ON="llm") as proc:
            code, err = finish(proc)
        assert code == -signal.SIGKILL, err
    with worker(db, tmp_path, *options, WORKER_APP_DIE_AT="1", WORKER_APP_DIE_ON="llm") as proc:
        code, err = finish(proc)
    assert code == 0, err
    assert "resume session p1: stopped" in err

    async def load() -> tuple[list[Message], Any]:
        async with store_at(db) as store:
            return await store.load_messages("p1"), (await store.list_sessions()).sessions[0]

    history, info = asyncio.run(load())
    assert (history[-1].origin, info.state) == ("stopped", "stopped")
    assert_well_formed(history, turns=1)
    effects = read_effects(tmp_path / "effects.log")
    assert_at_most_once(effects, UNSAFE_TOOLS)
    assert_effects_match_history(
        history, effects, session_id="p1", safe_tools=SAFE_TOOLS, unsafe_tools=UNSAFE_TOOLS
    )


SWEEP_SESSIONS = 4
SWEEP_SEED = 2112
SWEEP_KILLS = 20  # kills wanted, in SWEEP_BUDGET_S
SWEEP_MIN_KILLS = 12  # on a slow machine, past the budget: no fewer
SWEEP_BUDGET_S = 8.0


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "workers", "apps"), [("sqlite", 2, 0), ("postgres", 4, 2)])
def test_workers_killed_anywhere_lose_no_schedule_and_repeat_no_side_effect(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str, workers: int, apps: int
) -> None:
    """Rounds of `workers` `--once` workers at once (two on a SQLite file, four on one
    PostgreSQL database, as hosts would share it), each SIGKILLed at a checkpoint drawn at
    random (`worker_app`: before or after an LLM call, in a handler before or after
    its effect) or, now and then, by the test after a random delay; then the next
    round on the same file. When all the work is done, more is added (a schedule per
    session, another interrupted turn), until enough kills landed. With `apps`, each round
    the first round of each batch also starts that many processes of the app itself
    playing turns of sessions of their own, each SIGKILLed at a random time while the
    workers run (their turns left behind are the next rounds' to resume)."""
    db = sessions_at(request, backend, tmp_path / "sweep.db")
    plan: dict[str, list[str]] = {f"w{n}": [] for n in range(SWEEP_SESSIONS)}
    interrupted: list[str] = []
    app_sessions: list[str] = []
    rng = random.Random(SWEEP_SEED)
    app_rng = random.Random(SWEEP_SEED + 1)  # the workers' kills drawn as without apps
    batch_begins = False
    options = ("--once", "--backoff", "0", "--max-resumes", "1000")
    kills_file = tmp_path / "kills.log"
    started = time.monotonic()
    timed_kills = app_kills = rounds = epochs = 0
    done = True
    while True:
        elapsed = time.monotonic() - started
        kills = len(read_lines(kills_file)) + timed_kills
        enough = kills >= SWEEP_KILLS or (elapsed > SWEEP_BUDGET_S and kills >= SWEEP_MIN_KILLS)
        if done:
            if enough:
                break
            more = {s: [f"{s} scheduled {epochs}.{n}" for n in range(2)] for s in plan}
            for session, messages in more.items():
                plan[session] += messages
            interrupted.append(f"i{epochs}")
            prepare(db, tmp_path, more, interrupted[-1:])
            epochs += 1
        batch_begins = done  # the apps run with a batch's first round
        rounds += 1
        left = _work_left(db, [*plan, *interrupted, *app_sessions])
        die_at = [0 if enough or rng.random() < 0.1 else rng.randint(1, 40) for _ in range(workers)]
        delay = None if enough or rng.random() < 0.6 else rng.uniform(0.0, 0.2)
        env = {"WORKER_APP_KILLS": str(kills_file)}
        ready = tmp_path / f"ready-{rounds}"
        with ExitStack() as running:
            procs = [
                running.enter_context(
                    worker(
                        db, tmp_path, *options, WORKER_APP_DIE_AT=str(die),
                        **({"WORKER_APP_READY_FILE": str(ready)} if n == 0 else {}), **env,
                    )
                )
                for n, die in enumerate(die_at)
            ]  # fmt: skip
            if delay is not None:
                timed_kills += _kill_after_start(procs[0], ready, delay)
            started_apps = [f"app{rounds}.{n}" for n in range(apps if batch_begins else 0)]
            app_sessions += started_apps
            # An app killed mid-turn leaves work of its own.
            killed_apps = _apps_killed(db, tmp_path / "effects.log", started_apps, app_rng)
            app_kills += killed_apps
            results = [finish(proc) for proc in procs]
        for code, err in results:
            assert code in (0, -signal.SIGKILL), err
        # Nobody killed: a whole pass each, and no new work left behind.
        clean = all(code == 0 for code, _ in results) and not killed_apps
        now_left = _work_left(db, [*plan, *interrupted, *app_sessions])
        # Bound by outcome, not time (the machine may be loaded): a round whose workers
        # both finished their pass got work done; once enough kills landed, no more are
        # planned, so the rounds end.
        assert not clean or now_left < left or now_left == 0, (
            f"a round without kills did no work: {left} -> {now_left} left, round {rounds}"
        )
        done = clean and now_left == 0

    seen = check_store(db, tmp_path, plan, interrupted)
    check_app_sessions(db, tmp_path / "effects.log", app_sessions)
    lost = sum(  # unsafe calls of scheduled turns whose result a kill lost
        len(durability_errors(history[10:])) for history in load_histories(db, list(plan))
    )
    where = Counter(read_lines(kills_file))
    where["by the test, at a random time"] = timed_kills
    if apps:
        where["app processes, by the test at a random time"] = app_kills
    shown_again = sum(n - 1 for n in seen.values())
    print(
        f"\n{sum(where.values())} workers killed over {rounds} rounds, {epochs} batches of work "
        f"({sum(map(len, plan.values()))} schedules, {len(interrupted)} interrupted turns), "
        f"in {time.monotonic() - started:.1f} s; where:"
    )
    for place, count in sorted(where.items(), key=lambda kv: -kv[1]):
        print(f"  {count:3}  {place}")
    print(
        f"  scheduled messages the model saw again (killed before their first write): {shown_again}"
    )
    print(f"  unsafe calls of scheduled turns answered as lost (durability errors): {lost}")
    assert sum(where.values()) >= SWEEP_MIN_KILLS, f"only {dict(where)}: the sweep proved little"
    assert lost, "no kill lost an unsafe call's result: the sweep proved little"


def _apps_killed(db: Where, effects: Path, sessions: Sequence[str], rng: random.Random) -> int:
    """Run the app on each of `sessions` at once (two turns each) and SIGKILL each after a
    random time; how many were killed so (the others finished first)."""
    with ExitStack() as running:
        apps = [
            running.enter_context(child(db, effects, session, "--mode", "turns", "--turns", "2"))
            for session in sessions
        ]
        for app in apps:
            wait_ready(app)
        killed = 0
        for app in apps:
            time.sleep(rng.uniform(0.0, 0.15))
            if app.poll() is None:
                app.kill()
                killed += 1
        return killed


def check_app_sessions(db: Where, effects: Path, sessions: Sequence[str]) -> None:
    """The app's sessions, each turn of theirs finished by the app or resumed by a worker:
    well-formed, every unsafe call run at most once and only as stored."""
    log = read_effects(effects)
    for session, history in zip(sessions, load_histories(db, sessions), strict=True):
        if not history:
            continue  # killed before its first write
        assert_plays_script(assert_well_formed(history))
        assert_durability_errors_only_for(history, UNSAFE_TOOLS)
        assert_effects_match_history(
            history, log, session_id=session, safe_tools=SAFE_TOOLS, unsafe_tools=UNSAFE_TOOLS
        )


def load_histories(db: Where, sessions: Sequence[str]) -> list[list[Message]]:
    async def load() -> list[list[Message]]:
        async with store_at(db) as store:
            return [await store.load_messages(s) for s in sessions]

    return asyncio.run(load())


def read_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _kill_after_start(proc: subprocess.Popen[str], ready: Path, delay: float) -> int:
    """SIGKILL the worker `delay` s into its pass; 1 if it was killed so, 0 if it ended."""
    deadline = time.monotonic() + 30
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(delay)
    if proc.poll() is not None:
        return 0
    proc.send_signal(signal.SIGKILL)
    return 1


def _work_left(db: Where, sessions: Sequence[str]) -> int:
    """What a worker still has to do: leases left behind, due schedules, unfinished turns."""

    async def check() -> int:
        async with store_at(db) as store:
            left = len(await store.expired_leases(limit=10_000, host=HOST))
            left += len(await store.due_schedules(2**52, limit=10_000))
            for session in sessions:
                history = await store.load_messages(session)
                left += bool(history) and not history[-1].is_final_reply
        return left

    return asyncio.run(check())


def _all_done(db: Where, sessions: Sequence[str]) -> bool:
    return _work_left(db, sessions) == 0


@pytest.mark.slow
def test_the_worker_command_serves_until_sigterm(tmp_path: Path) -> None:
    db = tmp_path / "serve.db"
    prepare(db, tmp_path, {"s1": ["served"]}, ["s2"])
    with worker(db, tmp_path, "--poll", "0.05") as proc:
        deadline = time.monotonic() + 30
        while not _all_done(db, ["s1", "s2"]):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the worker did not get the work done"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        code, err = finish(proc, timeout=10)
    assert code == 0, err
    assert "resume session s2: resumed (complete)" in err
    assert ": fired (complete)" in err
    check_store(db, tmp_path, {"s1": ["served"]}, ["s2"])


def test_the_worker_command_explains_a_bad_app(tmp_path: Path) -> None:
    db = tmp_path / "empty.db"
    asyncio.run(_touch_store(db))
    for db_path, app, problem in [
        (db, "tests.support.worker_app:nothing", "has no 'nothing'"),
        (tmp_path / "none.db", "tests.support.worker_app:make_runner", "no database at"),
    ]:
        bad = subprocess.run(
            [*worker_command(), "worker", "--db", str(db_path), "--app", app, "--once"],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert (bad.returncode, problem in bad.stderr) == (2, True), bad.stderr


async def _touch_store(db: Path) -> None:
    async with sqlite_store(db) as store:
        await store.list_sessions()
