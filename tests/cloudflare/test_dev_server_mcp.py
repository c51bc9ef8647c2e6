"""An MCP server's tools on real workerd: `scripts/dev --agent tests/agents/mcp_only.py`,
an agent whose only tools are `MCPTools(url_setting="MCP_URL")`, talking through the
Worker's `fetch` to the official SDK's server (tests/support/mcp_server.py, its `/sse` endpoint:
sessions, answers as event streams) on 127.0.0.1. MCP_URL reaches the Worker from the
dev server's environment, named by the toolset alone. Two dev server starts: before and
after the kill.

- The server's tools are offered to the model inside the Worker, a read-only one runs,
  and its stored call carries the policy decided then (`safe_to_retry`, `mcp:...`).
- kill -9 of the dev server (wrangler and workerd) while the server holds a
  `destructiveHint` call; restart on the same state; `POST .../resume`: the call was
  sent once (with its idempotency key in `_meta`), the model got a
  `tool-durability-error` for it, and the call keeps the policy stored before the crash.

Needs `scripts/setup-runtime` (node_modules/ and python_modules/) and the dev
dependency `mcp`.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.support.history_checks import assert_durability_errors_only_for, assert_well_formed
from tests.support.worker_fakes import read_history

from durable_agents import Message, idempotency_key
from durable_agents.mcp import MCPTools
from durable_agents.testing.worker import DevWorker, find_project
from durable_agents.tools import RunContext

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parents[1]
AGENT_FILE = TESTS / "agents" / "mcp_only.py"
SESSION = "notes"
SOURCE = "mcp:127.0.0.1"  # MCPTools' name by default: the URL's host


@dataclass
class NotesServer:
    """tests/support/mcp_server.py, running: its `/sse` endpoint, and the calls its tools got."""

    folder: Path
    process: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/sse"

    def calls(self, tool: str) -> list[dict[str, Any]]:
        file = self.folder / "calls.jsonl"
        lines = file.read_text().splitlines() if file.exists() else []
        return [call for line in lines if (call := json.loads(line))["tool"] == tool]

    def release(self) -> None:
        """The slow_* tools stop waiting (they wait until this file exists)."""
        (self.folder / "release").touch()


@pytest.fixture(scope="module")
def mcp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NotesServer]:
    folder = tmp_path_factory.mktemp("mcp-server")
    env = {
        **os.environ,
        "MCP_TEST_CALLS": str(folder / "calls.jsonl"),
        "MCP_TEST_RELEASE": str(folder / "release"),
    }
    with open(folder / "server.log", "ab") as log:  # stderr to a file: never a full pipe
        process = subprocess.Popen(
            [sys.executable, str(TESTS / "support" / "mcp_server.py")],
            stdout=subprocess.PIPE, stderr=log, env=env,
        )  # fmt: skip
    try:
        assert process.stdout is not None
        # Its line, or its exit (end of file), ends the wait; the cap is for a loaded machine.
        ready, _, _ = select.select([process.stdout], [], [], 120)
        line = process.stdout.readline().decode() if ready else ""
        assert line.startswith("listening "), f"the MCP server did not start: {line!r}"
        yield NotesServer(folder, process, int(line.split()[1]))
    finally:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


@pytest.fixture(scope="module")
def policies(mcp: NotesServer) -> dict[str, Any]:
    """Each tool's policy as `MCPTools` lists the server on CPython, by the model's name."""

    async def listed() -> dict[str, Any]:
        tools = MCPTools(url_setting="MCP_URL")
        now = datetime.datetime.now(datetime.UTC)
        try:
            found = await tools.list_tools(
                RunContext("s", None, now, settings={"MCP_URL": mcp.url})
            )
        finally:
            await tools.aclose()
        return {tool.name: tool.policy for tool in found}

    return asyncio.run(listed())


@pytest.fixture(scope="module")
def worker(mcp: NotesServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevWorker]:
    state = tmp_path_factory.mktemp("mcp-dev-worker")
    with DevWorker(
        find_project(TESTS), state, agent=AGENT_FILE, env={"MCP_URL": mcp.url}
    ) as dev:  # close(): every process of every start gone, even after a failure
        print(f"dev server started in {dev.start_s:.1f} s")
        yield dev


def history(worker: DevWorker) -> list[Any]:
    """The session's stored messages, as JSON, through every page of `GET /sessions/...`."""

    def get(path: str) -> Any:
        reply = worker.get(path)
        assert reply.status == 200, reply.text
        return reply.body

    return read_history(get, SESSION)


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.05)
    return found


def test_the_servers_tools_reach_the_model_and_a_read_runs_with_its_policy_stored(
    worker: DevWorker, mcp: NotesServer, policies: dict[str, Any]
) -> None:
    assert "dev: MCP_URL is set (environment)" in worker.lines  # named by the toolset alone
    reply = worker.post(f"/sessions/{SESSION}/messages", {"message": "notes"})
    assert reply.status == 200, reply.text
    assert reply.body["status"] == "complete"
    answer = json.loads(reply.body["response"])
    assert sorted(answer["tools"]) == sorted(policies)  # all the server's tools, no other
    assert {"list_notes", "add_note", "delete_note", "slow_delete", "notes_search"} < set(policies)
    assert answer["list_notes"] == "1: buy milk\n2: call Ada"

    messages = history(worker)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    (call,) = messages[1]["tool_calls"]
    assert call["name"] == "list_notes"
    assert call["policy"] == policies["list_notes"]  # as decided on CPython
    assert call["policy"] == {
        "source": SOURCE,
        "safe_to_retry": True,
        "requires_approval": False,
        "annotations": {"readOnlyHint": True},
        "input_schema": call["policy"]["input_schema"],
    }
    (sent,) = mcp.calls("list_notes")
    assert sent["key"] == idempotency_key(reply.body["session_id"], call["id"])
    assert sent["endpoint"] == "/sse"
    assert sent["session"]  # in an MCP session the Worker opened


def test_kill_9_while_the_server_holds_a_destructive_call_then_resume_sends_it_once(
    worker: DevWorker, mcp: NotesServer, policies: dict[str, Any]
) -> None:
    pending = worker.start_post(f"/sessions/{SESSION}/messages", {"message": "delete 2"})
    (held,) = wait_for(lambda: mcp.calls("slow_delete"), "the server got slow_delete")
    killed = time.perf_counter()
    worker.kill()  # wrangler and workerd, SIGKILLed mid-call: none of them runs after
    assert pending.exception(30) is not None  # the client lost its answer
    mcp.release()  # the server finishes the call: the note is deleted, the answer lost

    # What the crash left in D1: the call, stored with its policy before it was sent
    # (write #1), and no result.
    (stored,) = worker.rows(
        "SELECT session_id, tool_calls FROM agent_messages WHERE tool_calls LIKE '%slow_delete%'"
    )
    (before,) = json.loads(stored["tool_calls"])
    assert worker.count("SELECT 1 FROM agent_messages WHERE tool_name = 'slow_delete'") == 0
    assert before["policy"] == policies["slow_delete"]
    assert before["policy"] == {
        "source": SOURCE,
        "safe_to_retry": False,
        "requires_approval": False,
        "annotations": {"readOnlyHint": False, "destructiveHint": True},
        "input_schema": before["policy"]["input_schema"],
    }
    assert held["arguments"] == {"note_id": 2}
    assert held["key"] == idempotency_key(stored["session_id"], before["id"])

    worker.restart()  # the same state directory: the same D1 and Durable Object storage
    resumed = worker.post(f"/sessions/{SESSION}/resume")
    print(f"kill to resumed: {time.perf_counter() - killed:.1f} s (restart {worker.start_s:.1f} s)")
    assert resumed.status == 200, resumed.text
    assert resumed.body["status"] == "complete"
    answer = json.loads(resumed.body["response"])
    assert answer["kind"] == "tool-durability-error"  # what the model was sent
    assert mcp.calls("slow_delete") == [held]  # sent once: the resume did not send it again

    messages = [Message.from_dict(m) for m in history(worker)]  # each one as stored
    turns = assert_well_formed(messages)
    assert turns[-1].user.content == "delete 2"
    (step,) = turns[-1].steps
    (call,) = step.calls
    assert call.to_dict() == before  # the policy decided before the crash, unchanged
    assert list(assert_durability_errors_only_for(messages, {"slow_delete"})) == [call.id]
    (result,) = step.results
    assert json.loads(result.content)["kind"] == "tool-durability-error"
    assert json.loads(answer["content"]) == json.loads(result.content)
