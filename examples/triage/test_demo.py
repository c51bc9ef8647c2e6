"""`python -m examples.triage.demo`, run as a real process: it SIGKILLs a real child."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_posts_once_and_the_model_sees_the_durability_error(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    done = subprocess.run(
        [sys.executable, "-m", "examples.triage.demo", "--db", str(db)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "the process was killed (exit -9)" in out
    assert "Slack received 1 post(s)" in out
    assert "'kind': 'tool-durability-error'" in out
    assert "I will not post again" in out
    slack = db.with_name(db.name + ".slack.log").read_text().splitlines()
    assert len(slack) == 1
    assert "Idempotency-Key da-" in slack[0]
    shown = subprocess.run(
        [sys.executable, "-m", "durable_agents.cli", "sessions", "show", "demo-triage-42",
         "--db", str(db), "--json"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    messages = json.loads(shown.stdout)["messages"]
    roles = [m["role"] for m in messages]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert json.loads(messages[4]["content"])["kind"] == "tool-durability-error"
