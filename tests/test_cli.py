"""The `durable-agents` command, run as a real process, on a store a crashed run left."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from durable_agents import Agent, LLMResponse, ToolCall, run, tool
from durable_agents.stores import sqlite_store
from durable_agents.testing import ScriptedLLM, SimulatedCrash, crash_on_write

SESSION = "cli-session-1"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable_agents.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


class Target(BaseModel):
    to: str


@tool
async def send(args: Target) -> dict[str, bool]:
    """Send something (a side effect)."""
    return {"sent": True}


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A session whose send's result was lost in a crash, then resumed."""

    async def make(path: Path) -> None:
        agent = Agent("cli-test", "Send when asked.", [send])
        llm = ScriptedLLM([
            LLMResponse("Sending.", [ToolCall("c1", "send", {"to": "ops"})]),
            LLMResponse("It may have been sent; please check."),
        ])  # fmt: skip
        store = sqlite_store(path)
        try:
            with pytest.raises(SimulatedCrash):
                await run(agent, llm=llm, message="send it", session_id=SESSION,
                          store=crash_on_write(store, 2))  # fmt: skip
            await run(agent, llm=llm, session_id=SESSION, store=store)
        finally:
            await store.close()

    path = tmp_path_factory.mktemp("cli") / "agents.db"
    asyncio.run(make(path))
    return path


def test_sessions_list_and_show(db: Path) -> None:
    listed = cli("sessions", "list", "--db", str(db))
    assert listed.returncode == 0, listed.stderr
    assert SESSION in listed.stdout
    assert "cli-test" in listed.stdout
    assert "idle" in listed.stdout
    shown = cli("sessions", "show", SESSION, "--db", str(db))
    assert shown.returncode == 0, shown.stderr
    assert "send result = tool-durability-error (not re-invoked)" in shown.stdout
    as_json = cli("sessions", "show", SESSION, "--db", str(db), "--json")
    assert as_json.returncode == 0
    messages = json.loads(as_json.stdout)["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert json.loads(messages[2]["content"])["kind"] == "tool-durability-error"


def test_unknown_session_and_missing_db_are_clear_errors(db: Path, tmp_path: Path) -> None:
    unknown = cli("sessions", "show", "nope", "--db", str(db))
    assert unknown.returncode == 1
    assert "no session 'nope'" in unknown.stderr
    missing = cli("sessions", "list", "--db", str(tmp_path / "absent.db"))
    assert missing.returncode == 2
    assert "no database" in missing.stderr
    assert not (tmp_path / "absent.db").exists()


def test_the_command_knows_no_example() -> None:
    helped = cli("--help")
    assert helped.returncode == 0
    assert "sessions" in helped.stdout
    assert "demo" not in helped.stdout
    assert cli("demo").returncode == 2
