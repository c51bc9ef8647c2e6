"""Several agents in one Worker, over HTTP: one `scripts/dev` (real workerd, Pyodide,
miniflare's D1) serving tests/agents/echo.py as the default agent (`--agent`) and the two
modules of tests/agents/several/ (`--agents`), at /agents/refunds/... and /agents/research/...

- each agent answers its own routes, and one session name under two agents is two
  sessions (two Durable Objects, two histories); the default agent's routes are as before;
- the listing filters by agent (`/agents/{agent}/sessions`, `/sessions?agent=`);
- an unknown agent is a 404 naming the served ones;
- a session token minted for one agent's session is refused on another agent's session of
  the same name (and on the default agent's);
- the banner lists each agent's base URL;
- a scheduled turn of an agent's session runs that agent from the object's alarm (which
  carries no command: the object remembers its agent).

The routing on CPython: test_served_agents.py. Needs `scripts/setup-runtime`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_agents.testing.worker import DevWorker, find_project

pytestmark = pytest.mark.slow

AGENTS = Path(__file__).parents[1] / "agents"
SECRET = "several-agents-session-token-secret-0123456789"


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevWorker]:
    state = tmp_path_factory.mktemp("several-agents-dev-worker")
    with DevWorker(
        find_project(Path(__file__).parent), state, settings={"SESSION_TOKEN_SECRET": SECRET},
        agent=AGENTS / "echo.py", agents=AGENTS / "several",
    ) as dev:  # fmt: skip
        yield dev


def say(worker: DevWorker, base: str, name: str, text: str, **kwargs: Any) -> Any:
    answer = worker.post(f"{base}/sessions/{name}/messages", {"message": text}, **kwargs)
    assert answer.status == 200, answer.text
    return answer.body


def contents(worker: DevWorker, base: str, name: str) -> list[str]:
    answer = worker.get(f"{base}/sessions/{name}")
    assert answer.status == 200, answer.text
    return [m["content"] for m in answer.body["messages"]]


def test_each_agent_serves_its_own_sessions_and_the_default_stays(worker: DevWorker) -> None:
    base = worker.url
    for line in (
        f"dev: agent echo (tests/agents/echo.py): {base}/sessions/{{name}}",
        f"dev: agent refunds-desk (tests/agents/several/refunds.py): "
        f"{base}/agents/refunds/sessions/{{name}}",
        f"dev: agent researcher (tests/agents/several/research.py): "
        f"{base}/agents/research/sessions/{{name}}",
    ):
        assert line in worker.lines, "\n".join(worker.lines)
    assert say(worker, "/agents/refunds", "shared", "refund 7")["response"] == (
        "refunds-desk heard: refund 7 (turn 1)"
    )
    assert say(worker, "/agents/research", "shared", "find x")["response"] == (
        "researcher heard: find x (turn 1)"
    )
    assert say(worker, "", "shared", "hello")["response"] == "echo heard: hello (turn 1)"
    again = say(worker, "/agents/refunds", "shared", "and 8")
    assert again["response"] == "refunds-desk heard: and 8 (turn 2)"
    # One name, three agents: three sessions, each its own object and history.
    assert contents(worker, "/agents/refunds", "shared") == [
        "refund 7", "refunds-desk heard: refund 7 (turn 1)",
        "and 8", "refunds-desk heard: and 8 (turn 2)",
    ]  # fmt: skip
    assert contents(worker, "/agents/research", "shared")[-1] == "researcher heard: find x (turn 1)"
    assert contents(worker, "", "shared") == ["hello", "echo heard: hello (turn 1)"]
    ids = {
        worker.get(f"{base}/sessions/shared").body["session_id"]
        for base in ("", "/agents/refunds", "/agents/research")
    }
    assert len(ids) == 3, ids
    # Every route is there: the timeline page, the approvals, the events' replay.
    page = worker.get("/agents/refunds/sessions/shared/view")
    assert (page.status, "refund 7" in page.text) == (200, True)
    assert worker.get("/agents/refunds/sessions/shared/approvals").body["pending"] == []
    events = worker.get("/agents/research/sessions/shared/events")
    assert events.status == 200
    assert "researcher heard: find x" in events.text


def test_the_listing_filters_by_agent(worker: DevWorker) -> None:
    say(worker, "/agents/research", "listed-r", "one")
    say(worker, "", "listed-d", "two")

    def listed(path: str) -> set[tuple[str, str]]:
        answer = worker.get(path)
        assert answer.status == 200, answer.text
        return {(s["name"], s["agent"]) for s in answer.body["sessions"]}

    research = listed("/agents/research/sessions")
    assert ("listed-r", "researcher") in research
    assert {agent for _, agent in research} == {"researcher"}
    assert listed("/sessions?agent=research") == research
    everything = listed("/sessions?limit=200")
    assert {("listed-r", "researcher"), ("listed-d", "echo")} <= everything


def test_an_unknown_agent_is_a_404_naming_the_served_ones(worker: DevWorker) -> None:
    answer = worker.post("/agents/billing/sessions/s1/messages", {"message": "hi"})
    assert (answer.status, answer.body["error"]["code"]) == (404, "unknown-agent")
    assert answer.body["error"]["message"] == (
        "this Worker serves no agent 'billing'; it serves /sessions (the default agent), "
        "/agents/refunds/sessions, /agents/research/sessions"
    )


def test_a_session_token_opens_one_agents_session_only(worker: DevWorker) -> None:
    say(worker, "/agents/refunds", "tok", "mine")
    minted = worker.post("/agents/refunds/sessions/tok/token", {"ttl_seconds": 600})
    assert minted.status == 200, minted.text
    token = minted.body["token"]
    assert worker.get("/agents/refunds/sessions/tok", token=token).status == 200
    say(worker, "/agents/research", "tok", "theirs")
    say(worker, "", "tok", "default's")
    for path in ("/agents/research/sessions/tok", "/sessions/tok"):
        refused = worker.get(path, token=token)
        assert (refused.status, refused.body["error"]["code"]) == (403, "forbidden"), path
    # The default agent's token, unchanged: its session, not an agent's of the same name.
    default = worker.post("/sessions/tok/token").body["token"]
    assert worker.get("/sessions/tok", token=default).status == 200
    assert worker.get("/agents/refunds/sessions/tok", token=default).status == 403


def test_a_scheduled_turn_runs_the_sessions_agent_from_its_alarm(worker: DevWorker) -> None:
    # The alarm carries no command: the object remembers which agent it serves.
    say(worker, "/agents/research", "later", "first")
    made = worker.post(
        "/agents/research/sessions/later/schedules", {"message": "again", "delay_seconds": 1}
    )
    assert made.status == 201, made.text
    deadline = time.monotonic() + 30
    while len(contents(worker, "/agents/research", "later")) < 4:
        assert time.monotonic() < deadline, contents(worker, "/agents/research", "later")
        time.sleep(0.3)
    assert contents(worker, "/agents/research", "later")[2:] == [
        "again", "researcher heard: again (turn 2)",
    ]  # fmt: skip
