"""The turn features of issue 23 in the runtime: `scripts/dev` (real workerd, Pyodide,
miniflare's D1) serving tests/agents/turn_features.py, over the Worker's HTTP API. One
dev server for the module.

- Instructions made per turn: the agent's function reads `ctx.now`, `ctx.session_name`
  and a deps value; the text is stored on the turn's user message (D1's `instructions`
  column, and `GET /sessions/{name}`), and a turn that waited for approval is sent the
  same text when it goes on, later; the next turn gets a text of its own.
- Typed output: an invalid `final_result` is answered `invalid-arguments` (stored), the
  valid one ends the turn, and the HTTP answer carries it as `"output"`.
- `ModelRetry`: `tool-retry`, then the model's corrected call runs; past
  `max_tool_retries` (1), `tool-failed`.
- An edited approval: an edit that breaks the tool's schema is 422 `invalid-arguments`
  and the call still waits; an edit that fits runs the call once, with the edit (the
  notes stub got one post, with the call's Idempotency-Key), its result says so, and
  both versions are stored (the model's call, the approval's arguments and digest).

And, on CPython, `AgentModule.load` adds the settings an agent's toolsets read to the
module's `SETTINGS`.

Needs `scripts/setup-runtime` (node_modules/ and python_modules/).
"""

from __future__ import annotations

import datetime
import json
import re
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_agents import Agent, approval_digest
from durable_agents.cloudflare.agent_module import AgentModule
from durable_agents.mcp import MCPTools
from durable_agents.run import idempotency_key
from durable_agents.testing.worker import DevWorker, WorkerResponse, find_project

AGENT_FILE = Path(__file__).parents[1] / "agents" / "turn_features.py"
INSTRUCTIONS = re.compile(
    r"You work the night desk for session (\S+); this turn started at (\S+)\."
)


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevWorker]:
    state = tmp_path_factory.mktemp("turn-features-dev-worker")
    with DevWorker(
        find_project(Path(__file__).parent), state, settings={"TF_DESK": "night desk"},
        agent=AGENT_FILE,
    ) as dev:  # fmt: skip
        yield dev


def send(worker: DevWorker, name: str, message: str) -> WorkerResponse:
    return worker.post(f"/sessions/{name}/messages", {"message": message})


def history(worker: DevWorker, name: str) -> list[dict[str, Any]]:
    reply = worker.get(f"/sessions/{name}")
    assert reply.status == 200, reply.text
    assert reply.body["next"] is None  # every message on one page
    messages: list[dict[str, Any]] = reply.body["messages"]
    return messages


def results(messages: list[dict[str, Any]], tool_name: str) -> list[Any]:
    return [json.loads(m["content"]) for m in messages
            if m["role"] == "tool" and m["tool_name"] == tool_name]  # fmt: skip


def started_at(text: str, name: str) -> datetime.datetime:
    match = INSTRUCTIONS.fullmatch(text)
    assert match is not None, text
    assert match.group(1) == name
    return datetime.datetime.fromisoformat(match.group(2))


@pytest.mark.slow
def test_instructions_are_made_once_per_turn_and_a_resumed_turn_is_sent_them_again(
    worker: DevWorker,
) -> None:
    before = datetime.datetime.now(datetime.UTC)
    asked = send(worker, "instr", "instructions please")
    assert (asked.status, asked.body["status"]) == (200, "awaiting_approval"), asked.text
    (pending,) = asked.body["pending"]
    session_id = asked.body["session_id"]
    user, call = history(worker, "instr")
    text = user["instructions"]
    # Made from ctx.session_name, the deps (TF_DESK) and ctx.now: this request's time.
    now = started_at(text, "instr")
    assert before - datetime.timedelta(seconds=5) < now < before + datetime.timedelta(seconds=60)
    assert call["content"] == f"saw: {text}"  # what the turn's first LLM call was sent
    assert worker.rows(
        f"SELECT role, instructions FROM agent_messages WHERE session_id = '{session_id}' "
        "ORDER BY seq"
    ) == [{"role": "user", "instructions": text}, {"role": "assistant", "instructions": None}]

    time.sleep(0.05)  # the clock moves on: a text made now would say so
    decided = worker.post(
        f"/sessions/instr/approvals/{pending['tool_call_id']}",
        {"approved": True, "digest": pending["digest"]},
    )
    assert (decided.status, decided.body["status"]) == (200, "complete"), decided.text
    assert decided.body["output"]["saw"] == text  # the resumed turn's LLM call was sent it

    again = send(worker, "instr", "again")
    assert (again.status, again.body["status"]) == (200, "complete"), again.text
    stored = history(worker, "instr")
    users = [m for m in stored if m["role"] == "user"]
    assert [m.get("instructions") for m in users] == [text, again.body["output"]["saw"]]
    assert started_at(users[1]["instructions"], "instr") > now  # a new turn: a new text
    assert all("instructions" not in m for m in stored if m["role"] != "user")


@pytest.mark.slow
def test_an_mcp_toolset_runs_on_its_dev_stub_inside_the_worker(worker: DevWorker) -> None:
    # Issue 32: TF_CATALOG_MCP_URL left empty, the dev server points it at the agent's
    # mcp_stub; MCPTools lists and calls it over fetch, the Worker answering itself.
    reply = send(worker, "shelf", "shelf of Dune")
    assert (reply.status, reply.body["status"]) == (200, "complete"), reply.text
    assert json.loads(reply.body["output"]["summary"]) == {"title": "Dune", "shelf": "B-3"}
    (call,) = [c for m in history(worker, "shelf") for c in m.get("tool_calls", [])
               if c["name"] == "shelf_of"]  # fmt: skip
    assert {k: v for k, v in call["policy"].items() if k != "input_schema"} == {
        "source": "mcp:catalog",
        "safe_to_retry": True,  # readOnlyHint, from the tool's safe_to_retry
        "requires_approval": False,
        "annotations": {"readOnlyHint": True},
    }


@pytest.mark.slow
def test_a_typed_answer_is_checked_and_answered_as_output(worker: DevWorker) -> None:
    reply = send(worker, "typed", "typed answer")
    assert (reply.status, reply.body["status"]) == (200, "complete"), reply.text
    output = reply.body["output"]
    assert {k: output[k] for k in ("summary", "count")} == {"summary": "typed", "count": 3}
    started_at(output["saw"], "typed")  # the text this turn was sent
    stored = history(worker, "typed")
    rejected, accepted = [m["content"] for m in stored if m["role"] == "tool"]
    assert json.loads(rejected)["kind"] == "invalid-arguments"
    assert "count" in json.loads(rejected)["error"]
    assert accepted == "Final answer accepted."
    assert [c["arguments"]["count"] for m in stored for c in m.get("tool_calls", [])] == [-1, 3]
    assert json.loads(stored[-1]["content"]) == output  # the final message stores the JSON
    assert reply.body["response"] == stored[-1]["content"]


@pytest.mark.slow
def test_model_retry_sends_the_model_back_at_most_max_tool_retries_times(
    worker: DevWorker,
) -> None:
    retried = send(worker, "retry", "retry the code")
    assert (retried.status, retried.body["status"]) == (200, "complete"), retried.text
    first, second = results(history(worker, "retry"), "check_code")
    assert first == {"error": "code 'abc' must be upper case", "kind": "tool-retry"}
    assert second == {"code": "ABC", "valid": True}
    assert retried.body["output"]["summary"] == "code ABC valid: True"

    stubborn = send(worker, "stubborn", "stubborn code")
    assert (stubborn.status, stubborn.body["status"]) == (200, "complete"), stubborn.text
    first, second = results(history(worker, "stubborn"), "check_code")
    assert first["kind"] == "tool-retry"
    assert second["kind"] == "tool-failed"
    assert "max_tool_retries" in second["error"]
    assert stubborn.body["output"]["count"] == 2


@pytest.mark.slow
def test_a_tools_schedule_counts_against_the_sessions_100(worker: DevWorker) -> None:
    # Issue 30: with 100 schedules waiting (the API's limit), a tool's ctx.schedule is
    # refused too, as the call's result; turn after turn the session still holds 100.
    made = send(worker, "full", "remind me")
    assert (made.status, made.body["status"]) == (200, "complete"), made.text
    assert made.body["output"]["summary"].startswith('{"schedule_id": "sch_')
    for n in range(99):
        added = worker.post("/sessions/full/schedules", {"message": f"p{n}", "delay_seconds": 60})
        assert added.status == 201, added.text
    refused = worker.post("/sessions/full/schedules", {"message": "one more", "delay_seconds": 1})
    assert refused.status == 422, refused.text
    for n in range(3):
        again = send(worker, "full", f"remind again {n}")
        assert (again.status, again.body["status"]) == (200, "complete"), again.text
        result = json.loads(again.body["output"]["summary"])
        assert result["kind"] == "tool-failed"
        assert "has 100 schedules waiting already" in result["error"]
    listed = worker.get("/sessions/full/schedules")
    assert listed.status == 200, listed.text
    assert len(listed.body["schedules"]) == 100


@pytest.mark.slow
def test_an_edited_approval_runs_the_call_once_with_the_edit(worker: DevWorker) -> None:
    asked = send(worker, "note", "note for the team")
    assert (asked.status, asked.body["status"]) == (200, "awaiting_approval"), asked.text
    (pending,) = asked.body["pending"]
    call_id, session_id = pending["tool_call_id"], asked.body["session_id"]
    assert pending["arguments"] == {"text": "draft", "channel": "general"}
    decide = f"/sessions/note/approvals/{call_id}"

    bad = worker.post(decide, {"approved": True, "digest": pending["digest"],
                               "arguments": {"text": "final", "channel": "sales"}})  # fmt: skip
    assert (bad.status, bad.body["error"]["code"]) == (422, "invalid-arguments"), bad.text
    assert "channel" in bad.body["error"]["problems"]
    assert worker.get("/sessions/note/approvals").body["pending"] == [pending]  # still waits

    edit = {"text": "final text", "channel": "ops"}
    ran = worker.post(decide, {"approved": True, "digest": pending["digest"], "arguments": edit})
    assert (ran.status, ran.body["status"]) == (200, "complete"), ran.text
    key = idempotency_key(session_id, call_id)
    notes = worker.get("/__dev/NOTES_API_URL/notes", token="").body["notes"]
    assert [n for n in notes if n["key"] == key] == [{**edit, "key": key}]  # once, edited

    stored = history(worker, "note")
    (asked_call,) = [c for m in stored for c in m.get("tool_calls", []) if c["id"] == call_id]
    assert asked_call["arguments"] == {"text": "draft", "channel": "general"}  # the model's
    (result,) = results(stored, "send_note")
    assert result["result"]["text"] == "final text"
    assert ran.body["output"]["summary"] == f"note {result['result']['id']}; edited: True"
    assert result["edited_arguments"] == edit
    assert "edited arguments" in result["note"]
    (approval,) = worker.rows(
        "SELECT arguments, arguments_digest, digest FROM agent_approvals "
        f"WHERE session_id = '{session_id}' AND event = 'approved'"
    )
    assert json.loads(approval["arguments"]) == edit
    assert approval["digest"] == pending["digest"]
    assert approval["arguments_digest"] == approval_digest(session_id, call_id, "send_note", edit)
    view = worker.get("/sessions/note/view")  # the timeline: the call shows both
    assert view.status == 200, view.text
    assert f'data-call-id="{call_id}" data-tool="send_note" data-edited="true"' in view.text
    for version in ("draft", "final text"):  # the model's arguments, then the edit
        assert version in view.text


async def _no_tools(ctx: Any) -> list[Any]:
    return []


def test_the_settings_an_agents_toolsets_read_are_added_to_the_modules() -> None:
    module = types.ModuleType("agent")
    module.__file__ = "src/agent.py"
    module.AGENT = Agent(  # type: ignore[attr-defined]
        "a", toolsets=[MCPTools(url_setting="MCP_URL", token_setting="MCP_TOKEN"),
                       MCPTools(url_setting="NOTES_URL")],
    )  # fmt: skip
    module.make_deps = lambda env, http: None  # type: ignore[attr-defined]
    module.SETTINGS = ("NOTES_URL", "MY_API_URL")  # type: ignore[attr-defined]
    loaded = AgentModule.load(module)
    # Its own first, then the toolsets' it does not name, once each, in order.
    assert loaded.settings == ("NOTES_URL", "MY_API_URL", "MCP_URL", "MCP_TOKEN")
    del module.SETTINGS
    assert AgentModule.load(module).describe()["settings"] == ["MCP_URL", "MCP_TOKEN", "NOTES_URL"]


def test_a_toolset_without_mcp_adds_its_settings_too() -> None:
    toolset = types.SimpleNamespace(settings=("CRM_URL",), list_tools=_no_tools)
    module = types.ModuleType("agent")
    module.AGENT = Agent("a", toolsets=[toolset])  # type: ignore[attr-defined]
    module.make_deps = lambda env, http: None  # type: ignore[attr-defined]
    assert AgentModule.load(module).settings == ("CRM_URL",)
