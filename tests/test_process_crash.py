"""SIGKILL a real agent process at random points, restart it, and check at-most-once.

A child (`process_agent.py`) plays three turns of a session on a real SQLite
file, with a `safe_to_retry` lookup and two side-effecting tools, one step of
which runs three calls in parallel. Every handler logs its side effect to an
effects file. The parent kills the child after a random delay, starts a new
one on the same files (which finishes the interrupted turn, then goes on), and
after a few kills lets a last child run to the end. Then the stored history
and the effects file must agree with the contract: no unsafe side effect
twice, none for a call not stored, exactly one result per call, one user
message per turn, and durability errors only where an unsafe call's result
was lost.

The delays are drawn from a seeded generator and scaled to the time one
uninterrupted child takes here (measured first), so the kills spread over the
whole session: before a step is stored, between write #1 and the handlers,
during and after them, between steps and between turns. Where each kill
landed is read back from the store and the effects file right after it, and
printed (`pytest -s` shows it).
"""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.support.history_checks import (
    Effect,
    assert_at_most_once,
    assert_durability_errors_only_for,
    assert_effects_match_history,
    assert_well_formed,
    durability_errors,
    read_effects,
)
from tests.support.process_agent import (
    SAFE_TOOLS,
    TURNS,
    UNSAFE_TOOLS,
    assert_plays_script,
    child,
    load_history,
    reap,
    turn_message,
    wait_ready,
)

from durable_agents import Message, pending_tool_calls

pytestmark = pytest.mark.slow

SEED = 20240611
KILLS_PER_SESSION = 6
MIN_KILLS = 30
# Past TIME_BUDGET_S (a slow or loaded machine), the test settles for this many kills once
# one of them lost an unsafe call's result: it stops on what the kills showed, never on
# the clock alone, so a loaded machine takes longer but proves as much.
MIN_KILLS_WHEN_SLOW = 12
MAX_KILLS = 150  # only reached if no kill ever lost an unsafe call's result
TIME_BUDGET_S = 30.0

NOTHING_STORED = "before the first write (nothing stored)"
STEP_COMMITTED = "after write #2 / before the next write #1 (mid-turn)"
TURN_COMMITTED = "between turns (final reply stored)"
ORPHANS_NO_EFFECT = "after write #1, no handler effect yet"
ORPHANS_SOME_EFFECTS = "during handlers (some effects landed)"
ORPHANS_ALL_EFFECTS = "after all handler effects, before write #2"
FINISHED = "after the last turn's final write"
EXITED = "child had already exited"
WINDOWS = (
    NOTHING_STORED,
    ORPHANS_NO_EFFECT,
    ORPHANS_SOME_EFFECTS,
    ORPHANS_ALL_EFFECTS,
    STEP_COMMITTED,
    TURN_COMMITTED,
    FINISHED,
    EXITED,
)


def classify(history: list[Message], effects: list[Effect]) -> str:
    """Which crash window the stored state and the effects show."""
    if not history:
        return NOTHING_STORED
    orphans = pending_tool_calls(history)
    if orphans:
        ran = {e.call_id for e in effects}
        landed = sum(1 for c in orphans if c.id in ran)
        if landed == 0:
            return ORPHANS_NO_EFFECT
        return ORPHANS_ALL_EFFECTS if landed == len(orphans) else ORPHANS_SOME_EFFECTS
    if not history[-1].is_final_reply:
        return STEP_COMMITTED
    turns = sum(1 for m in history if m.role == "user")
    return FINISHED if turns == TURNS else TURN_COMMITTED


def measure_session(db: Path, effects: Path, session: str) -> float:
    """Seconds one child takes, from `ready` to exit, to play a whole session."""
    with child(db, effects, session) as proc:
        wait_ready(proc)
        started = time.monotonic()
        code, out, err = reap(proc)
        elapsed = time.monotonic() - started
    assert code == 0, f"calibration child failed ({code}):\n{out}\n{err}"
    return elapsed


def kill_after(db: Path, effects: Path, session: str, delay: float) -> str:
    """Start a child, SIGKILL it `delay` s after it is ready; where the kill landed."""
    with child(db, effects, session) as proc:
        wait_ready(proc)
        time.sleep(delay)
        exited = proc.poll() is not None
        if not exited:
            proc.send_signal(signal.SIGKILL)
        code, out, err = reap(proc)
    if exited or code == 0:
        assert code == 0, f"child on {session} failed before the kill ({code}):\n{out}\n{err}"
        return EXITED
    assert code == -signal.SIGKILL, f"child on {session} exited {code}:\n{out}\n{err}"
    return classify(load_history(db, session), read_effects(effects))


def finish(db: Path, effects: Path, session: str) -> None:
    """Run a last child on the session, unharmed, to the end of its last turn."""
    with child(db, effects, session) as proc:
        wait_ready(proc)
        code, out, err = reap(proc)
    assert code == 0, f"the final child on {session} failed ({code}):\n{out}\n{err}"
    assert '"outcome": "complete"' in out, out


def check_session(
    db: Path, effects: list[Effect], session: str
) -> tuple[list[Message], Counter[str]]:
    """Every invariant of a finished session; returns its history and how many
    times each of its calls ran."""
    history = load_history(db, session)
    turns = assert_well_formed(
        history, turns=TURNS, user_messages=[turn_message(t) for t in range(TURNS)]
    )
    assert_plays_script(turns)
    assert_durability_errors_only_for(history, UNSAFE_TOOLS)
    runs = assert_effects_match_history(
        history, effects, session_id=session, safe_tools=SAFE_TOOLS, unsafe_tools=UNSAFE_TOOLS
    )
    return history, runs


def test_sigkill_at_random_points_never_repeats_a_side_effect(
    tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    db, effects = tmp_path / "agent.db", tmp_path / "effects.log"
    rng = random.Random(SEED)
    started = time.monotonic()

    span = measure_session(db, effects, "calibration")
    max_delay = 1.6 * span / KILLS_PER_SESSION  # together, the kills of a session span it
    sessions = ["calibration"]
    windows: Counter[str] = Counter()
    kills = 0
    lost_unsafe = 0  # unsafe calls whose result a kill lost (stored durability errors)

    while kills < MIN_KILLS or (lost_unsafe == 0 and kills < MAX_KILLS):
        slow = time.monotonic() - started > TIME_BUDGET_S
        if slow and lost_unsafe and kills >= MIN_KILLS_WHEN_SLOW:
            break  # a slow machine: fewer kills, but never a vacuous run
        session = f"s{len(sessions)}"
        sessions.append(session)
        for n in range(KILLS_PER_SESSION):
            # The first kill of a session draws from a shorter range, so the
            # narrow window before its first write gets hit too.
            delay = rng.uniform(0, max_delay / 4 if n == 0 else max_delay)
            window = kill_after(db, effects, session, delay)
            kills += 1
            windows[window] += 1
            if window == EXITED:
                break
        finish(db, effects, session)
        lost_unsafe += len(durability_errors(load_history(db, session)))

    all_effects = read_effects(effects)
    assert_at_most_once(all_effects, UNSAFE_TOOLS)
    errors_with_effect = errors_without_effect = safe_reruns = 0
    for session in sessions:
        history, runs = check_session(db, all_effects, session)
        for call_id in durability_errors(history):
            if runs[call_id]:
                errors_with_effect += 1
            else:
                errors_without_effect += 1
        safe_reruns += sum(n - 1 for n in runs.values() if n > 1)

    elapsed = time.monotonic() - started
    print(
        f"\n{kills} kills over {len(sessions) - 1} sessions in {elapsed:.1f} s "
        f"(one session: {span * 1000:.0f} ms, delays 0-{max_delay * 1000:.0f} ms)"
    )
    for window in WINDOWS:
        print(f"  {windows[window]:3}  {window}")
    record_property("kill_windows", {w: windows[w] for w in WINDOWS})
    record_property("durability_errors", [errors_with_effect, errors_without_effect])
    print(
        f"  durability errors stored: {errors_with_effect + errors_without_effect} "
        f"({errors_with_effect} where the side effect had happened, {errors_without_effect} "
        f"where it had not); safe lookups re-invoked: {safe_reruns}"
    )
    assert errors_with_effect + errors_without_effect > 0, (
        f"no kill lost an unsafe call's result, so the test proved nothing: {dict(windows)}"
    )
