"""`check_agent` on agents with toolsets: an MCP server's tools (`MCPTools` against the real
SDK server of tests/support/mcp_server.py, which records every call it receives with the
idempotency key in its `_meta`) and a toolset made in a test.

The check forwards a toolset's requests to its server for real, so what it counts can be
compared with what the server says it received. The mutation tests break one thing each
(a toolset of the agent's, the kit's `MCPTools`, the run loop) and assert the check
notices and blames the right party.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
from tests.support.mcp_process import Server

from durable_agents import Agent, ConfigurationError, ToolContext
from durable_agents.llm.offline import arguments_for
from durable_agents.mcp import MCPTools
from durable_agents.testing import AgentCheckReport, check_agent
from durable_agents.tools import RunContext, Tool

NOTES_TOOLS = ["list_notes", "add_note", "delete_note"]  # read-only, additive, destructive


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    where = tmp_path_factory.mktemp("mcp-check")
    started = Server(where / "calls.jsonl", where / "release")
    started.release()
    started.start()
    try:
        yield started
    finally:
        started.stop()


def notes_module(*toolsets: Any) -> ModuleType:
    """An agent module whose only tools come from `toolsets` (default: the notes server's
    three tools, the destructive one approved first)."""
    module = ModuleType("notes_agent")
    module.AGENT = Agent(  # type: ignore[attr-defined]
        "notes", "Keep the user's notes.", toolsets=list(toolsets) or [notes_tools()]
    )
    module.make_deps = lambda env, http: None  # type: ignore[attr-defined]
    return module


def notes_tools() -> MCPTools:
    return MCPTools(
        url_setting="MCP_URL", name="notes", allow=NOTES_TOOLS, approve_destructive=True
    )


# What TestLLM asks delete_note for ({"note_id": <int>}: the server's schema), and the edit
# decide="edit" makes of it (the next value).
MODELS_DELETE = arguments_for({"type": "object", "properties": {"note_id": {"type": "integer"}},
                               "required": ["note_id"]})  # fmt: skip
EDITED_DELETE = {"note_id": MODELS_DELETE["note_id"] + 1}


def check_notes(
    server: Server, module: ModuleType, endpoint: str = "sse", **options: Any
) -> AgentCheckReport:
    # /sse by default: the SDK's /json answers take ~45 ms each on loopback, /sse ~5 ms.
    return check_agent(module, config=None, env={"MCP_URL": server.url(endpoint)}, **options)


def calls_since(server: Server, start: int, tool: str) -> list[dict[str, Any]]:
    return [c for c in server.calls()[start:] if c["tool"] == tool]


# -- a sound MCP agent passes, and the server agrees -------------------------------------


def test_an_mcp_agent_passes_against_a_real_server(server: Server) -> None:
    start = len(server.calls())
    report = check_notes(server, notes_module(), turns=1)
    assert report.toolset_tools == ("add_note", "delete_note", "list_notes")
    assert (report.safe_tools, report.unsafe_tools) == (
        ("list_notes",),
        ("add_note", "delete_note"),
    )
    assert report.approval_tools == ("delete_note",)
    # One turn. Approving: all at once 6 appends (write #1, the two free results, the
    # decision, the claim, the delete's result, the reply); one tool a step 9 (2 + 2 + 4,
    # the reply). Denying: 5 and 8. Editing: as approving. x2 sides.
    assert report.crash_points == ((6 + 9) + (5 + 8) + (6 + 9)) * 2
    assert report.approved > report.edited > 0
    assert report.denied > 0
    assert report.durability_errors > 0  # unsafe orphans: add_note, delete_note
    assert report.safe_reinvocations > 0  # list_notes, sent again
    text = str(report)
    assert f"{report.mcp_calls} MCP calls reached the servers" in text
    assert "none of a side effect twice" in text
    assert "with edited arguments" in text

    # What the server received, by the idempotency key in each call's _meta.
    received = server.calls()[start:]
    assert len(received) == report.mcp_calls
    assert all(c["key"] and c["key"].startswith("da-") for c in received)
    keys = Counter((c["tool"], c["key"]) for c in received)
    for (tool, _key), times in keys.items():
        if tool != "list_notes":
            assert times == 1, f"{tool} reached the server {times} times for one call"
    assert max(times for (tool, _), times in keys.items() if tool == "list_notes") > 1
    # The approvers' edits reached the server, and the model's arguments when not edited.
    deleted = {c["arguments"]["note_id"] for c in calls_since(server, start, "delete_note")}
    assert deleted == {MODELS_DELETE["note_id"], EDITED_DELETE["note_id"]}


def test_an_edited_mcp_call_sends_the_server_the_edit_only(server: Server) -> None:
    start = len(server.calls())
    report = check_notes(server, notes_module(), turns=1, decide="edit")
    assert report.crash_points == (6 + 9) * 2
    assert report.edited == report.approved > 0
    deletes = calls_since(server, start, "delete_note")
    assert deletes
    assert [c["arguments"] for c in deletes] == [EDITED_DELETE] * len(deletes)  # never the model's


# -- the env, settings and http a toolset gets ------------------------------------------


TICKET_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 3},
        "labels": {"type": "array", "items": {"$ref": "#/$defs/label"}, "minItems": 1},
        "assignee": {
            "type": "object",
            "properties": {
                "email": {"type": "string", "format": "email"},
                "team": {"enum": ["core", "web"]},
            },
            "required": ["email", "team"],
            "additionalProperties": False,
        },
        "priority": {"type": "integer", "minimum": 1, "maximum": 4},
    },
    "required": ["title", "labels", "assignee"],
    "$defs": {
        "label": {
            "type": "object",
            "properties": {"name": {"type": "string", "pattern": "^[a-z]+$"}},
            "required": ["name"],
        }
    },
}


class TicketTools:
    """A toolset of the test's own (no server): a read and a keyed side effect with a nested
    JSON schema, sending through the run's `http` it got when listed."""

    settings = ("TRACKER_TOKEN", "TRACKER_LIMIT")

    def __init__(self) -> None:
        self.contexts: list[RunContext[Any]] = []

    async def list_tools(self, ctx: RunContext[Any]) -> Sequence[Tool]:
        self.contexts.append(ctx)
        http = ctx.http
        assert http is not None
        base = "https://tracker.test"  # (a URL a setting held would go to that server)

        async def search(args: dict[str, Any], call: ToolContext[Any]) -> Any:
            return (await http.get(f"{base}/tickets")).status_code

        async def open_ticket(args: dict[str, Any], call: ToolContext[Any]) -> Any:
            assert fits_the_ticket_schema(args)  # TestLLM's arguments, nested as asked
            response = await http.post(
                f"{base}/tickets", json=args, headers={"Idempotency-Key": call.idempotency_key}
            )
            return response.status_code

        source = "tracker"
        return [
            Tool("search", "Find tickets.", {"type": "object"}, safe_to_retry=True,
                 handler=search, source=source, annotations={"readOnlyHint": True}),
            Tool("open_ticket", "Open a ticket.", TICKET_SCHEMA, handler=open_ticket,
                 source=source, annotations={}),
        ]  # fmt: skip


def fits_the_ticket_schema(args: dict[str, Any]) -> bool:
    assignee = args["assignee"]
    return (
        len(args["title"]) >= 3
        and len(args["labels"]) >= 1
        and all(re.fullmatch("[a-z]+", label["name"]) for label in args["labels"])
        and set(assignee) == {"email", "team"}
        and "@" in assignee["email"]
        and assignee["team"] in ("core", "web")
        and 1 <= args.get("priority", 1) <= 4
    )


def test_arguments_for_a_nested_dict_schema() -> None:
    made = arguments_for(TICKET_SCHEMA, tool_name="open_ticket")
    assert fits_the_ticket_schema(made)
    assert made["assignee"] == {"email": "user@example.com", "team": "core"}
    assert made["labels"] == [{"name": "a"}]


def test_a_toolset_gets_the_settings_the_worker_passes_and_the_recording_client(
    tmp_path: Path,
) -> None:
    config = tmp_path / "wrangler.toml"
    config.write_text('[vars]\nTRACKER_LIMIT = 3\nOTHER = "x"\n')
    seen: list[httpx.Request] = []

    def respond(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(201, json={})

    tickets = TicketTools()
    report = check_agent(
        notes_module(tickets),
        config=config,
        env={"TRACKER_TOKEN": "t0ken"},
        respond=respond,
        turns=1,
    )
    assert report.toolset_tools == ("open_ticket", "search")
    assert report.safe_reinvocations > 0
    assert report.durability_errors > 0
    assert report.mcp_calls == 0  # nothing went to an MCP server
    # As the Worker does: only the settings the toolsets name, as strings.
    wanted = {"TRACKER_TOKEN": "t0ken", "TRACKER_LIMIT": "3"}
    assert all(dict(ctx.settings) == wanted for ctx in tickets.contexts)
    assert {r.url.path for r in seen} == {"/tickets"}  # through the check's client
    assert {r.method for r in seen} == {"GET", "POST"}


def test_a_toolset_that_cannot_list_its_tools_stops_the_check_at_once(
    unused_tcp_port: int,
) -> None:
    with pytest.raises(ConfigurationError) as empty:
        check_agent(notes_module(notes_tools()), config=None, turns=1)  # MCP_URL unset
    text = str(empty.value)
    assert "the toolset MCPTools(url_setting='MCP_URL', name='notes') of agent 'notes'" in text
    assert "could not list its tools (ConfigurationError: MCPTools: the setting MCP_URL" in text
    assert "(MCP_URL not set)" in text
    assert "env={'MCP_URL': 'http://127.0.0.1:8000/mcp'})" in text
    with pytest.raises(
        ConfigurationError, match=r"MCP_URL \(the MCP server's URL\) is missing.*\(MCP_URL=''\)"
    ):
        check_agent(notes_module(notes_tools()), config=None, env={"MCP_URL": ""})
    with pytest.raises(ConfigurationError, match=r"cannot reach the MCP server.*is it running"):
        check_agent(
            notes_module(notes_tools()),
            config=None,
            env={"MCP_URL": f"http://127.0.0.1:{unused_tcp_port}/sse"},
        )


# -- mutations: a toolset, the kit's MCPTools, the run loop -----------------------------


class Wrapped:
    """A toolset of the agent's own around MCPTools, changing what it lists."""

    def __init__(self, inner: MCPTools) -> None:
        self.inner = inner

    @property
    def settings(self) -> tuple[str, ...]:
        return self.inner.settings

    async def list_tools(self, ctx: RunContext[Any]) -> Sequence[Tool]:
        return [self.change(t) for t in await self.inner.list_tools(ctx)]

    def change(self, tool: Tool) -> Tool:
        return tool


class CallsAddNoteSafe(Wrapped):
    """Lies about add_note: says the server called it read-only, so it is safe to retry."""

    def change(self, tool: Tool) -> Tool:
        if tool.name != "add_note":
            return tool
        hints = {**(tool.annotations or {}), "readOnlyHint": True}
        return dataclasses.replace(tool, safe_to_retry=True, annotations=hints)


class SendsAddNoteTwice(Wrapped):
    """A handler wrapper that sends add_note's call again (a retry of a side effect)."""

    def change(self, tool: Tool) -> Tool:
        if tool.name != "add_note" or tool.handler is None:
            return tool
        handler = tool.handler

        async def twice(args: Any, ctx: ToolContext[Any]) -> Any:
            await handler(args, ctx)
            return await handler(args, ctx)

        return tool.with_handler(twice)


def test_a_toolset_that_marks_a_side_effect_safe_is_caught(server: Server) -> None:
    start = len(server.calls())
    with pytest.raises(AssertionError) as failure:
        # (/json: the server's listing, read for its annotations, is a JSON answer here)
        check_notes(server, notes_module(CallsAddNoteSafe(notes_tools())), "json", turns=1)
    text = str(failure.value)
    assert re.search(
        r"your agent broke a rule: the MCP server at http://127\.0\.0\.1:\d+/json got call "
        r"add_note#\S+ \('add_note' on the server\) 2 times: the kit sent it again after a "
        r"crash because the toolset stored 'add_note' as safe_to_retry",
        text,
    )
    assert re.search(
        r"as safe_to_retry \(with annotations \{[^}]*'readOnlyHint': True[^}]*\}\), but the "
        r"server lists it with annotations \{[^}]*'readOnlyHint': False[^}]*\}, not "
        "readOnlyHint: true",
        text,
    )
    assert "(toolset CallsAddNoteSafe, the agent's own)" in text
    assert "the kit broke a rule" not in text
    assert "a crash before append #2" in text  # write #2 lost: the add was sent again
    # The server saw it too: one add_note key twice.
    keys = Counter(c["key"] for c in calls_since(server, start, "add_note"))
    assert max(keys.values()) == 2


def test_a_toolset_handler_that_sends_a_call_twice_is_caught(server: Server) -> None:
    with pytest.raises(AssertionError) as failure:
        check_notes(server, notes_module(SendsAddNoteTwice(notes_tools())), turns=1)
    text = str(failure.value)
    assert re.search(
        r"your agent broke a rule: the MCP server at \S+ got call add_note#\S+ \('add_note' on "
        r"the server\) 2 times from 1 run\(s\) of its handler: the toolset's handler sent one "
        "call more than once",
        text,
    )
    assert "without a crash" in text  # found by the baseline already
    assert "(forwarded)" in text  # the requests list shows both tools/call requests


def test_mcptools_deciding_a_side_effect_is_safe_is_the_kits_fault(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    mcp = importlib.import_module("durable_agents.mcp")
    monkeypatch.setattr(mcp, "tool_policy", lambda annotations, approve: (True, False))
    with pytest.raises(AssertionError) as failure:
        check_notes(server, notes_module(), turns=1, decide="approve")
    text = str(failure.value)
    assert re.search(
        r"the kit broke a rule: the MCP server at \S+ got call (add|delete)_note#\S+ .* 2 "
        r"times: the kit sent it again after a crash because the toolset stored .* as "
        r"safe_to_retry .*\(toolset MCPTools\(url_setting='MCP_URL', name='notes'\)\) — please "
        "report this",
        text,
    )


def test_the_kit_sending_an_unsafe_mcp_orphan_again_is_caught(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_module = importlib.import_module("durable_agents._turn.tool_execution")
    dispatch = run_module.ToolExecutor.dispatch

    async def forgetful(self: Any, calls: Any, *, resuming: bool = False, **kw: Any) -> Any:
        return await dispatch(self, calls, resuming=False, **kw)  # as if every orphan were safe

    monkeypatch.setattr(run_module.ToolExecutor, "dispatch", forgetful)
    with pytest.raises(AssertionError) as failure:
        check_notes(server, notes_module(), turns=1, decide="approve")
    assert re.search(
        r"the kit broke a rule: unsafe call add_note#\S+ lost its result in a crash",
        str(failure.value),
    )
