"""Several runs of ONE session at once, on one SQLite file: real processes, then in-process.

With leases (the default) runs of one session take turns: a second run waits
for the first instead of repairing its live calls, so every racer completes.
Without them (`run(lease_seconds=None)`, the `--no-lease` option) the schema
is the only guard, and the racing tests below show it is enough for safety:
every append is conditional on the history length its run loaded, so of
concurrent runs only one stores each write; the others get
`SessionConflictError` with nothing of theirs stored, and only a run that
stored a call dispatches it. What must hold, whoever wins:

- each orphaned call gets exactly one result row; an unsafe orphan's handler
  never runs (it gets a durability error), a safe one's may run in several
  racers (re-invocation is allowed) but only one result is kept;
- every racer completes or raises `SessionConflictError`, and one completes;
- of racers sending a new message to an idle session, exactly one user
  message is stored, and the losers dispatch nothing;
- the final history is well-formed and the effects agree with it.

The processes start together: each prints `ready`, then waits for a start
file the parent creates once all are ready.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Iterator, Sequence
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
    format_history,
    read_effects,
    results_by_call,
)
from tests.support.process_agent import (
    AGENT,
    CONFLICT_EXIT,
    SAFE_TOOLS,
    UNSAFE_TOOLS,
    assert_plays_script,
    child,
    deterministic_llm,
    load_history,
    make_handlers,
    outcome_of,
    reap,
    turn_message,
    wait_ready,
)

from durable_agents import (
    Message,
    RunResult,
    SessionConflictError,
    ToolCall,
    ToolDurabilityError,
    run,
)
from durable_agents.stores import sqlite_store
from durable_agents.testing import SimulatedCrash, crash_on_write

pytestmark = pytest.mark.slow

RACERS = 4
HANDLER_S = 0.004
SESSION = "shared"


async def make_orphaned_session(db: Path, effects: Path, session: str) -> list[ToolCall]:
    """A session whose turn 0 died right after step 1's write #1 (the parallel
    step: post, charge, lookup), before any of its handlers ran. Returns those
    orphaned calls."""
    async with sqlite_store(db) as store:
        with pytest.raises(SimulatedCrash):
            await run(
                AGENT,
                llm=deterministic_llm(),
                message=turn_message(0),
                session_id=session,
                store=crash_on_write(store, 3, when="after"),
                tools=make_handlers(effects, HANDLER_S),
            )
        history = await store.load_messages(session)
    orphans = list(history[-1].tool_calls)
    assert [c.name for c in orphans] == ["post", "charge", "lookup"], format_history(history)
    assert not {c.id for c in orphans} & {e.call_id for e in read_effects(effects)}
    return orphans


async def make_idle_session(db: Path, effects: Path, session: str) -> list[Message]:
    """A session with turn 0 complete, waiting for the next message."""
    async with sqlite_store(db) as store:
        result = await run(
            AGENT,
            llm=deterministic_llm(),
            message=turn_message(0),
            session_id=session,
            store=store,
            tools=make_handlers(effects, HANDLER_S),
        )
        assert result.status == "complete"
        return await store.load_messages(session)


def result_rows(db: Path, session: str, call_id: str) -> int:
    """How many tool result rows the file holds for the call (read with plain sqlite3)."""
    with sqlite3.connect(db) as conn:
        query = "SELECT count(*) FROM agent_messages WHERE session_id=? AND tool_call_id=?"
        (count,) = conn.execute(query + " AND role='tool'", (session, call_id)).fetchone()
    conn.close()
    return int(count)


@contextmanager
def started_together(
    tmp_path: Path, db: Path, effects: Path, options: list[list[str]]
) -> Iterator[list[tuple[int, str, str]]]:
    """Start one child per options list, release them at once, and yield their
    (exit code, stdout, stderr) once all ended. No child outlives the block."""
    start = tmp_path / "start"
    with ExitStack() as stack:
        procs = [
            stack.enter_context(child(db, effects, SESSION, "--start-file", str(start), *opts))
            for opts in options
        ]
        for proc in procs:
            wait_ready(proc)
        start.touch()
        yield [reap(proc, timeout=60) for proc in procs]


def outcomes_of(ends: list[tuple[int, str, str]]) -> list[dict[str, Any]]:
    """Each child's JSON outcome; asserts it either completed or lost a conflict."""
    report = "\n".join(f"exit {code}: {out.strip()} {err.strip()}" for code, out, err in ends)
    print(f"\n{report}")
    outcomes = []
    for code, out, err in ends:
        outcome = outcome_of(out)
        assert outcome is not None, f"a child printed no outcome (exit {code}):\n{out}\n{err}"
        expected = {"complete": 0, "conflict": CONFLICT_EXIT}.get(outcome["outcome"])
        assert code == expected, f"child ended with exit {code}, {outcome}:\n{err}\n{report}"
        outcomes.append(outcome)
    assert any(o["outcome"] == "complete" for o in outcomes), f"no racer completed:\n{report}"
    return outcomes


def check_resumed(db: Path, effects: Path, orphans: list[ToolCall]) -> list[Message]:
    """The invariants after racers resumed the orphaned session of make_orphaned_session."""
    history = load_history(db, SESSION)
    turns = assert_well_formed(history, turns=1, user_messages=[turn_message(0)])
    assert_plays_script(turns)
    assert_durability_errors_only_for(history, UNSAFE_TOOLS)
    log = read_effects(effects)
    assert_at_most_once(log, UNSAFE_TOOLS)
    runs = assert_effects_match_history(
        history, log, session_id=SESSION, safe_tools=SAFE_TOOLS, unsafe_tools=UNSAFE_TOOLS
    )
    errors = durability_errors(history)
    results = results_by_call(history)
    for call in orphans:
        assert result_rows(db, SESSION, call.id) == 1, f"{call.name}#{call.id}"
        if call.name in UNSAFE_TOOLS:
            assert runs[call.id] == 0, f"unsafe orphan {call.name}#{call.id} ran on resume"
            assert call.id in errors, f"unsafe orphan {call.name}#{call.id}: {results[call.id]}"
        else:
            assert runs[call.id] >= 1, f"safe orphan {call.name}#{call.id} was not re-invoked"
            assert call.id not in errors
    print(f"safe orphan runs: {[runs[c.id] for c in orphans if c.name in SAFE_TOOLS]}")
    return history


def check_one_new_turn(
    db: Path, effects: Path, before: list[Message], messages: list[str]
) -> Message:
    """The invariants after racers each sent one of `messages` to the idle session
    `before`: one of them, and only one, became turn 1. Returns its user message."""
    history = load_history(db, SESSION)
    assert history[: len(before)] == before, "the racers changed what was stored before"
    turns = assert_well_formed(history, turns=2)
    assert_plays_script(turns)
    assert turns[1].user.content in messages
    assert_durability_errors_only_for(history, UNSAFE_TOOLS)
    assert not durability_errors(history), "no call was orphaned, so none needs a durability error"
    log = read_effects(effects)
    assert_at_most_once(log, UNSAFE_TOOLS)
    assert_effects_match_history(
        history, log, session_id=SESSION, safe_tools=SAFE_TOOLS, unsafe_tools=UNSAFE_TOOLS
    )
    return turns[1].user


# -- real processes ---------------------------------------------------------------


@pytest.mark.parametrize("round_", range(3))  # the interleavings differ from run to run
def test_processes_resuming_one_crashed_session_repair_it_once(tmp_path: Path, round_: int) -> None:
    db, effects = tmp_path / "agent.db", tmp_path / "effects.log"
    orphans = asyncio.run(make_orphaned_session(db, effects, SESSION))
    began = time.monotonic()
    with started_together(tmp_path, db, effects, [["--mode", "resume"]] * RACERS) as ends:
        outcomes = outcomes_of(ends)
    print(f"{RACERS} racers in {time.monotonic() - began:.2f} s")
    for outcome in outcomes:
        if outcome["outcome"] == "complete":
            assert outcome["response"] == "done with turn 0", outcome
    check_resumed(db, effects, orphans)


def test_processes_sending_to_one_idle_session_store_one_turn(tmp_path: Path) -> None:
    db, effects = tmp_path / "agent.db", tmp_path / "effects.log"
    before = asyncio.run(make_idle_session(db, effects, SESSION))
    messages = [f"turn 1 from racer {n}" for n in range(RACERS)]
    gated = ["--no-lease", "--gate-dir", str(tmp_path / "gate"), "--gate-count", str(RACERS)]
    options = [["--mode", "send", "--message", text, *gated] for text in messages]
    with started_together(tmp_path, db, effects, options) as ends:
        outcomes = outcomes_of(ends)
    winners = [o for o in outcomes if o["outcome"] == "complete"]
    assert len(winners) == 1, outcomes
    # Every racer loaded the idle session before any wrote (the gate), so every
    # loser failed on its first write, after one LLM call and before any handler.
    for outcome in outcomes:
        if outcome["outcome"] == "conflict":
            assert outcome["llm_calls"] == 1, outcome
    assert winners[0]["response"] == "done with turn 1"
    user = check_one_new_turn(db, effects, before, messages)
    assert user.content == winners[0]["message"], "the stored turn is not the winner's"


def test_processes_sending_to_one_session_with_leases_take_turns(tmp_path: Path) -> None:
    db, effects = tmp_path / "agent.db", tmp_path / "effects.log"
    before = asyncio.run(make_idle_session(db, effects, SESSION))
    messages = [f"turn 1 from racer {n}" for n in range(RACERS)]
    options = [["--mode", "send", "--message", text] for text in messages]
    with started_together(tmp_path, db, effects, options) as ends:
        outcomes = outcomes_of(ends)
    assert [o["outcome"] for o in outcomes] == ["complete"] * RACERS, outcomes
    history = load_history(db, SESSION)
    log = read_effects(effects)
    assert not durability_errors(history), format_history(history)
    assert_at_most_once(log, UNSAFE_TOOLS)
    assert_effects_match_history(
        history, log, session_id=SESSION, safe_tools=SAFE_TOOLS, unsafe_tools=UNSAFE_TOOLS
    )
    new_turns = history[len(before) :]
    assert sorted(m.content for m in new_turns if m.role == "user") == sorted(messages)
    assert_well_formed(new_turns, turns=RACERS)


# -- in one process, one store ----------------------------------------------------


async def race(
    db: Path, effects: Path, messages: Sequence[str | None], *, gated: bool = False
) -> list[RunResult | BaseException]:
    """`run()` once per message, all at once, on one session of one sqlite store,
    without leases: the schema's conditional appends are the only guard."""
    barrier = asyncio.Barrier(len(messages))
    async with sqlite_store(db) as store:
        return await asyncio.gather(
            *(
                run(
                    AGENT,
                    llm=deterministic_llm(gate=barrier.wait if gated else None),
                    message=message,
                    session_id=SESSION,
                    store=store,
                    tools=make_handlers(effects, HANDLER_S),
                    lease_seconds=None,
                )
                for message in messages
            ),
            return_exceptions=True,
        )


def completed(results: list[RunResult | BaseException]) -> list[RunResult]:
    """The runs that completed; asserts every other one lost a conflict."""
    for r in results:
        if isinstance(r, BaseException) and not isinstance(r, SessionConflictError):
            raise r
    done = [r for r in results if isinstance(r, RunResult)]
    assert all(r.status == "complete" for r in done), done
    assert done, "no run completed"
    return done


async def test_in_process_resumes_of_one_crashed_session_repair_it_once(tmp_path: Path) -> None:
    db, effects = tmp_path / "agent.db", tmp_path / "effects.log"
    orphans = await make_orphaned_session(db, effects, SESSION)
    results = await race(db, effects, [None, None])
    for r in completed(results):
        assert r.response == "done with turn 0"
    await asyncio.to_thread(check_resumed, db, effects, orphans)


async def test_in_process_sends_to_one_idle_session_store_one_turn(tmp_path: Path) -> None:
    db, effects = tmp_path / "agent.db", tmp_path / "effects.log"
    before = await make_idle_session(db, effects, SESSION)
    messages = ["turn 1 from task 0", "turn 1 from task 1"]
    results = await race(db, effects, messages, gated=True)
    (winner,) = completed(results)
    assert sum(isinstance(r, SessionConflictError) for r in results) == 1, results
    assert winner.response == "done with turn 1"
    user = await asyncio.to_thread(check_one_new_turn, db, effects, before, messages)
    assert user.content == messages[results.index(winner)]


# -- a new message while another run is mid-step ----------------------------------


async def send_during_live_step(
    db: Path, effects: Path, *, leases: bool
) -> tuple[BaseException | RunResult, RunResult, list[Message]]:
    """Run A plays turn 0; while its step-2 `post` is in flight (side effect done,
    result not yet stored), run B sends a new message to the session; A's post
    answers 0.3 s later. Returns (A's outcome, B's result, the stored history)."""
    lease_seconds = 30.0 if leases else None
    in_flight, release = asyncio.Event(), asyncio.Event()
    handlers = make_handlers(effects, 0)

    async def held_post(args: dict[str, Any], ctx: Any) -> Any:
        result = await handlers["post"](args, ctx)
        if " s2 " in args["text"]:
            in_flight.set()
            await release.wait()
        return result

    async with sqlite_store(db) as store_a, sqlite_store(db) as store_b:
        a = asyncio.create_task(
            run(
                AGENT,
                llm=deterministic_llm(),
                message=turn_message(0),
                session_id=SESSION,
                store=store_a,
                tools={**handlers, "post": held_post},
                lease_seconds=lease_seconds,
            )
        )
        await asyncio.wait_for(in_flight.wait(), 10)
        asyncio.get_running_loop().call_later(0.3, release.set)
        b = await run(
            AGENT,
            llm=deterministic_llm(),
            message="a second message",
            session_id=SESSION,
            store=store_b,
            tools=handlers,
            lease_seconds=lease_seconds,
        )
        (a_outcome,) = await asyncio.gather(a, return_exceptions=True)
        return a_outcome, b, await store_b.load_messages(SESSION)


async def test_send_during_a_live_step_waits_for_the_lease(tmp_path: Path) -> None:
    """With leases B waits for A's turn to end, then runs its own: no conflict,
    no durability error, both turns whole."""
    db, effects = tmp_path / "agent.db", tmp_path / "effects.log"
    a, b, history = await send_during_live_step(db, effects, leases=True)
    assert isinstance(a, RunResult), a
    assert a.status == "complete", a
    assert b.status == "complete"
    assert not durability_errors(history), format_history(history)
    log = read_effects(effects)
    assert_at_most_once(log, UNSAFE_TOOLS)
    assert_effects_match_history(
        history, log, session_id=SESSION, safe_tools=SAFE_TOOLS, unsafe_tools=UNSAFE_TOOLS
    )
    assert_plays_script(assert_well_formed(history, turns=2))


async def test_send_during_a_live_step_without_a_lease_keeps_side_effects_at_most_once(
    tmp_path: Path,
) -> None:
    """Without leases, B cannot tell A's in-flight call from a crashed one: it
    stores a durability error for it and takes the session over; A's result
    write then conflicts. No side effect is repeated or lost track of.

    By design, a new message on a session whose last turn is unfinished closes
    that turn (its orphans are repaired) and starts the next one on top: the
    LLM sees the interrupted turn and the new message. Use `message=None` to
    finish a turn instead; the Durable Object serialises runs per session."""
    db, effects = tmp_path / "agent.db", tmp_path / "effects.log"
    a, b, history = await send_during_live_step(db, effects, leases=False)
    assert isinstance(a, SessionConflictError), a
    assert b.status == "complete"
    held = history[7].tool_calls[0]
    assert held.name == "post", format_history(history)
    assert ToolDurabilityError.from_message(history[8]) is not None, format_history(history)
    log = read_effects(effects)
    assert [e.call_id for e in log].count(held.id) == 1, "the held post ran once"
    assert_at_most_once(log, UNSAFE_TOOLS)
    assert_durability_errors_only_for(history, UNSAFE_TOOLS)
    assert_effects_match_history(
        history, log, session_id=SESSION, safe_tools=SAFE_TOOLS, unsafe_tools=UNSAFE_TOOLS
    )
    assert_well_formed(history[:9], allow_unfinished=True)  # A's turn, cut after step 2
    assert_plays_script(assert_well_formed(history[9:], turns=1), first=1)  # B's turn
