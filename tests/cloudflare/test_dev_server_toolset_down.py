"""Toolsets that cannot be listed, on `scripts/dev` (real workerd, the session's Durable
Object and its alarm): `tests/agents/failing_toolsets.py`, whose toolsets are one that
lists a tool named like the agent's own (for sessions named "clash...") and
`MCPTools(url_setting="MCP_URL")`, with MCP_URL pointing at a port nothing listens on.

Issue 30, item 5: what a remote server lists (or fails to) at run time is not a
programming mistake. The message is kept and the turn ends as a resumable
`toolset-error` (502); the object's alarm then resumes it like a turn that crashed,
with its back-off (SELF_RESUME_SECONDS=1: after 1, 2, 4 s), and after 3 failed
self-resumes stops it with a note (`origin: "stopped"`, listing state "stopped"),
as the docs promise for any turn whose resumes keep failing.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.support.worker_fakes import durable_object_id

from durable_agents.testing.worker import DevWorker, find_project

pytestmark = pytest.mark.slow

AGENT_FILE = Path(__file__).resolve().parents[1] / "agents" / "failing_toolsets.py"


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevWorker]:
    settings = {
        "MCP_URL": f"http://127.0.0.1:{closed_port()}/mcp",
        "SELF_RESUME_SECONDS": "1",
    }
    state = tmp_path_factory.mktemp("toolset-down")
    with DevWorker(find_project(Path(__file__).parent), state, settings, agent=AGENT_FILE) as dev:
        yield dev


def stored(worker: DevWorker, name: str) -> list[dict[str, Any]]:
    return worker.rows(
        "SELECT role, content, origin FROM agent_messages "
        f"WHERE session_id = '{durable_object_id(name)}' ORDER BY seq"
    )


def test_a_toolset_that_cannot_be_listed_keeps_the_message_and_the_alarm_stops_the_turn(
    worker: DevWorker,
) -> None:
    reply = worker.post("/sessions/down/messages", {"message": "notes please"})
    assert reply.status == 502, reply.text
    assert reply.body["status"] == "error"
    assert reply.body["error"]["code"] == "toolset-error"
    assert "MCP" in reply.body["error"]["message"]
    first = stored(worker, "down")
    assert [(m["role"], m["content"]) for m in first] == [("user", "notes please")]

    # The alarm resumes it after 1, 2 and 4 s, each failing the same way, then stops it.
    # Bound by the outcome: each self-resume that fails leaves a mark the alarm finds.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        history = stored(worker, "down")
        if history and history[-1]["origin"] == "stopped":
            break
        time.sleep(0.5)
    history = stored(worker, "down")
    assert history[-1]["origin"] == "stopped", history
    assert history[0] == first[0]  # the user's message, kept as it was
    assert [m["role"] for m in history] == ["user", "assistant"]
    listed = worker.get("/sessions")
    assert listed.status == 200, listed.text
    (session,) = [s for s in listed.body["sessions"] if s["name"] == "down"]
    assert session["state"] == "stopped"
    # And the session takes its next message (the toolset still down: the same answer).
    again = worker.post("/sessions/down/messages", {"message": "notes again"})
    assert (again.status, again.body["error"]["code"]) == (502, "toolset-error"), again.text


def test_a_toolset_listing_a_name_the_agent_has_keeps_the_message(worker: DevWorker) -> None:
    # A server that starts listing a tool named like one of the agent's own: no 500 that
    # drops the message, but the resumable toolset-error naming the clash and the fix.
    reply = worker.post("/sessions/clash-1/messages", {"message": "look it up"})
    assert reply.status == 502, reply.text
    assert reply.body["error"]["code"] == "toolset-error"
    assert "'lookup'" in reply.body["error"]["message"]
    assert "prefix=" in reply.body["error"]["message"]
    assert [(m["role"], m["content"]) for m in stored(worker, "clash-1")] == [
        ("user", "look it up")
    ]
