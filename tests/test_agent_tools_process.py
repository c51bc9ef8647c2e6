"""SIGKILL a real process while its agent calls another agent as a tool, resume it, and
check exactly once: the child's turn ran once, its side effect at most once (exactly
once where its handler got to it), and the parent's call holds the child's answer.

The process (`tests/support/delegating_process.py`) pauses at a named point, on a real
SQLite file, and is killed there with SIGKILL; a second process resumes the parent's
turn (`run(message=None)`). The points: the parent's call stored and no child turn
yet; the child's call stored and its handler not run; the child's handler in flight
after its effect; the child's final reply stored and the parent's result not.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from tests.support.delegating_process import ASK, PARENT_CALL, POINTS, SCRIPT
from tests.support.history_checks import read_effects
from tests.support.process_agent import child, load_history, outcome_of, read_line, reap, wait_ready

from durable_agents import ToolDurabilityError, idempotency_key
from durable_agents.agent_tools import child_session_name

pytestmark = pytest.mark.slow

SESSION = "parent-1"
# How many times the child's refund took effect, by where the kill landed: none where
# its handler never ran (its call is answered as lost, never run again).
REFUNDS = {"before-child": 1, "child-call-stored": 0, "child-handler": 1, "child-reply": 1}


def kill_at(db: Path, effects: Path, point: str) -> None:
    """Start the parent's turn, SIGKILL the process once it reports `point`."""
    with child(db, effects, SESSION, "--mode", "send", "--pause-at", point, script=SCRIPT) as proc:
        wait_ready(proc)
        line = read_line(proc, timeout=60)
        if line != "paused\n":
            code, out, err = reap(proc)
            raise AssertionError(f"no pause at {point} ({code}): {line}{out}\n{err}")
        proc.send_signal(signal.SIGKILL)
        code, _, err = reap(proc)
    assert code == -signal.SIGKILL, err


def resume(db: Path, effects: Path) -> str:
    """Finish the parent's turn in a new process; its reply."""
    with child(db, effects, SESSION, "--mode", "resume", script=SCRIPT) as proc:
        wait_ready(proc)
        code, out, err = reap(proc, timeout=60)
    outcome = outcome_of(out)
    assert code == 0, f"the resume failed ({code}):\n{out}\n{err}"
    assert outcome is not None
    return str(outcome["response"])


# What the store held when the kill landed: the parent's roles, the child's, and refunds made.
AT_KILL = {
    "before-child": (["user", "assistant"], [], 0),
    "child-call-stored": (["user", "assistant"], ["user", "assistant"], 0),
    "child-handler": (["user", "assistant"], ["user", "assistant"], 1),
    "child-reply": (["user", "assistant"], ["user", "assistant", "tool", "assistant"], 1),
}


def stored(db: Path, effects: Path) -> tuple[list[str], list[str], int]:
    parent = [m.role for m in load_history(db, SESSION)]
    child_roles = [m.role for m in load_history(db, child_session_name(SESSION, PARENT_CALL))]
    return parent, child_roles, sum(e.tool_name == "refund" for e in read_effects(effects))


@pytest.mark.parametrize("point", POINTS)
def test_sigkill_around_a_child_turn_runs_it_once(tmp_path: Path, point: str) -> None:
    db, effects = tmp_path / "agents.db", tmp_path / "effects.log"
    kill_at(db, effects, point)
    assert stored(db, effects) == AT_KILL[point]
    reply = resume(db, effects)

    refunds = [e for e in read_effects(effects) if e.tool_name == "refund"]
    assert len(refunds) == REFUNDS[point], refunds
    child_history = load_history(db, child_session_name(SESSION, PARENT_CALL))
    users = [m for m in child_history if m.role == "user"]
    assert [(m.content, m.request_key) for m in users] == [
        (ASK, idempotency_key(SESSION, PARENT_CALL))
    ]  # one child turn, started with the parent call's key
    assert child_history[-1].is_final_reply
    lost = [e.tool_name for m in child_history if (e := ToolDurabilityError.from_message(m))]
    assert lost == ([] if point in ("before-child", "child-reply") else ["refund"])

    parent = load_history(db, SESSION)
    (answer,) = [m for m in parent if m.role == "tool"]
    assert ToolDurabilityError.from_message(answer) is None
    assert answer.content == child_history[-1].content  # the child's answer, as it stored it
    assert reply == f"support: {answer.content}"
    if point in ("before-child", "child-reply"):
        assert answer.content == "refunds: refunded order 42"
