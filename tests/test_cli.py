"""The `durable-agents` command, run as a real process (the demo SIGKILLs a real child)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durable_agents.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    db = tmp_path_factory.mktemp("demo") / "demo.db"
    done = cli("demo", "--db", str(db))
    assert done.returncode == 0, done.stdout + done.stderr
    return db, done.stdout


def test_demo_posts_once_and_the_llm_sees_the_durability_error(demo_db: tuple[Path, str]) -> None:
    db, out = demo_db
    assert "the process was killed (exit -9)" in out
    assert "Slack received 1 post(s)" in out
    assert "'kind': 'tool-durability-error'" in out
    assert "I will not post again" in out
    slack = db.with_name(db.name + ".slack.log").read_text().splitlines()
    assert len(slack) == 1
    assert "Idempotency-Key da-" in slack[0]


def test_sessions_list_and_show(demo_db: tuple[Path, str]) -> None:
    db, _ = demo_db
    listed = cli("sessions", "list", "--db", str(db))
    assert listed.returncode == 0
    assert "demo-triage-42" in listed.stdout
    assert "idle" in listed.stdout
    shown = cli("sessions", "show", "demo-triage-42", "--db", str(db), "--json")
    assert shown.returncode == 0
    messages = json.loads(shown.stdout)["messages"]
    assert [m["role"] for m in messages] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert json.loads(messages[4]["content"])["kind"] == "tool-durability-error"


def test_unknown_session_and_missing_db_are_clear_errors(
    demo_db: tuple[Path, str], tmp_path: Path
) -> None:
    db, _ = demo_db
    unknown = cli("sessions", "show", "nope", "--db", str(db))
    assert unknown.returncode == 1
    assert "no session 'nope'" in unknown.stderr
    missing = cli("sessions", "list", "--db", str(tmp_path / "absent.db"))
    assert missing.returncode == 2
    assert "no database" in missing.stderr
    assert not (tmp_path / "absent.db").exists()
