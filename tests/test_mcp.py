"""`durable_agents.mcp.MCPTools` against a real MCP server (the official SDK's, in
tests/support/mcp_server.py, as a subprocess) and against a fake upstream that answers
what no real server should (tests/test_mcp.py's `Upstream`).

The server counts every call a tool receives (a JSON line each in a file), so
the tests assert how many times the server saw a call, not only what came back.
Run as a script (`python tests/test_mcp.py child ...`) this module is the agent
process the crash tests SIGKILL mid-call.
"""

from __future__ import annotations

import asyncio
import datetime
import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.support.mcp_process import TOKEN, Server

from durable_agents import (
    Agent,
    ConfigurationError,
    LLMResponse,
    Message,
    ToolCall,
    ToolContext,
    ToolDurabilityError,
    ToolErrorKind,
    ToolFailure,
    ToolsetError,
    approve,
    idempotency_key,
    run,
    tool,
)
from durable_agents.llm import default_client
from durable_agents.mcp import MAX_PAGES, MCPTools, model_name, tool_policy
from durable_agents.stores import sqlite_store
from durable_agents.testing import ScriptedLLM, SimulatedCrash, crash_on_write
from durable_agents.tools import RunContext, Tool

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"

# -- the real server ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    where = tmp_path_factory.mktemp("mcp")
    started = Server(where / "calls.jsonl", where / "release")
    started.release()
    started.start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with default_client(10.0) as client:
        yield client


def context(
    http: httpx.AsyncClient | None, settings: dict[str, str] | None = None
) -> RunContext[Any]:
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    return RunContext("s1", None, now, settings=settings or {}, http=http)


def tool_context(call_id: str = "call_1") -> ToolContext[Any]:
    return ToolContext("s1", call_id, "t", f"key-{call_id}")


async def listed(tools: MCPTools, http: httpx.AsyncClient, **settings: str) -> dict[str, Tool]:
    return {t.name: t for t in await tools.list_tools(context(http, settings))}


async def call(tool: Tool, arguments: dict[str, Any], call_id: str = "call_1") -> Any:
    assert tool.handler is not None
    return await tool.handler(tool.parse_arguments(arguments), tool_context(call_id))


ENDPOINTS = ["json", "sse", "stateless-json", "stateless-sse"]


# -- listing ------------------------------------------------------------------------------


async def test_lists_the_servers_tools_with_what_their_annotations_decide(
    server: Server, http: httpx.AsyncClient
) -> None:
    tools = await listed(MCPTools(server.url()), http)
    assert {"list_notes", "add_note", "delete_note", "notes_search", "rename_note"} <= set(tools)
    read, add, delete = tools["list_notes"], tools["add_note"], tools["delete_note"]
    assert (read.safe_to_retry, read.requires_approval) == (True, False)
    assert (add.safe_to_retry, add.requires_approval) == (False, False)
    assert (delete.safe_to_retry, delete.requires_approval) == (False, False)
    assert not tools["rename_note"].safe_to_retry  # idempotentHint is not enough
    assert delete.description == "Delete a note for good."
    assert delete.input_schema["properties"]["note_id"]["type"] == "integer"
    assert delete.timeout == 30.0
    assert delete.policy == {
        "source": "mcp:127.0.0.1",
        "safe_to_retry": False,
        "requires_approval": False,
        "annotations": {"readOnlyHint": False, "destructiveHint": True},
        "input_schema": delete.input_schema,
    }
    assert read.policy is not None
    assert read.policy["annotations"] == {"readOnlyHint": True}


async def test_approve_destructive_gates_what_may_destroy(
    server: Server, http: httpx.AsyncClient
) -> None:
    tools = await listed(MCPTools(server.url(), approve_destructive=True, name="notes"), http)
    gated = {name for name, t in tools.items() if t.requires_approval}
    # destructiveHint true, or no annotations at all (the spec's default is destructive)
    assert gated == {"delete_note", "slow_delete", "touch_note"}
    assert tools["delete_note"].source == "mcp:notes"
    assert tools["touch_note"].annotations is None
    assert tools["touch_note"].policy is not None
    assert tools["touch_note"].policy["annotations"] == {}


def test_the_policy_of_annotations() -> None:
    assert tool_policy({"readOnlyHint": True}, True) == (True, False)
    assert tool_policy({"readOnlyHint": "true"}, False) == (False, False)  # only a real true
    assert tool_policy({}, True) == (False, True)
    assert tool_policy({"destructiveHint": False}, True) == (False, False)
    assert tool_policy({"idempotentHint": True, "destructiveHint": False}, True) == (False, False)
    assert tool_policy({"destructiveHint": True}, False) == (False, False)


async def test_allow_and_prefix(server: Server, http: httpx.AsyncClient) -> None:
    tools = MCPTools(server.url(), allow=["notes.search", "list_notes"], prefix="n_")
    offered = await listed(tools, http)
    assert sorted(offered) == ["n_list_notes", "n_notes_search"]
    before = len(server.calls("notes.search"))
    assert await call(offered["n_notes_search"], {"query": "milk"}) == "buy milk"
    assert len(server.calls("notes.search")) == before + 1  # called by the server's own name


async def test_allow_naming_a_tool_the_server_does_not_list(
    server: Server, http: httpx.AsyncClient
) -> None:
    with pytest.raises(ToolsetError) as caught:
        await listed(MCPTools(server.url(), allow=["list_notes", "serach"], name="notes"), http)
    assert caught.value.source == "mcp:notes"
    assert "'serach'" in str(caught.value)
    assert "list_notes" in str(caught.value)


def test_model_names() -> None:
    assert model_name("", "list_notes") == "list_notes"
    assert model_name("n_", "notes.search") == "n_notes_search"
    assert model_name("", "café/menu") == "caf__menu"
    long = model_name("x_", "a" * 100)
    assert len(long) == 64
    assert long.startswith("x_" + "a" * 53 + "-")
    assert long == model_name("x_", "a" * 100)  # the same every turn
    assert long != model_name("x_", "a" * 101)


def test_bad_arguments_are_refused_when_made() -> None:
    with pytest.raises(ConfigurationError, match="exactly one"):
        MCPTools()
    with pytest.raises(ConfigurationError, match="exactly one"):
        MCPTools("http://x/mcp", url_setting="NOTES_URL")
    with pytest.raises(ConfigurationError, match="http:// or https://"):
        MCPTools("notes.example.com/mcp")
    with pytest.raises(ConfigurationError, match="list of tool names"):
        MCPTools("http://x/mcp", allow="list_notes")
    with pytest.raises(ConfigurationError, match="at least one"):
        MCPTools("http://x/mcp", allow=[])
    with pytest.raises(ConfigurationError, match="prefix"):
        MCPTools("http://x/mcp", prefix="notes.")
    with pytest.raises(ConfigurationError, match="timeout"):
        MCPTools("http://x/mcp", timeout=0)
    made = MCPTools(url_setting="NOTES_URL", token_setting="NOTES_TOKEN")
    assert made.settings == ("NOTES_URL", "NOTES_TOKEN")
    assert MCPTools("http://x/mcp").settings == ()
    assert "NOTES_URL" in repr(made)


async def test_the_url_and_token_come_from_settings(
    server: Server, http: httpx.AsyncClient
) -> None:
    tools = MCPTools(url_setting="NOTES_URL", token_setting="NOTES_TOKEN")
    offered = await listed(tools, http, NOTES_URL=server.url("auth"), NOTES_TOKEN=TOKEN)
    assert set(await call(offered["note_stats"], {})) == {"count", "longest"}
    with pytest.raises(ConfigurationError, match="NOTES_URL"):
        await listed(tools, http, NOTES_TOKEN=TOKEN)
    with pytest.raises(ConfigurationError, match="NOTES_TOKEN"):
        await listed(tools, http, NOTES_URL=server.url("auth"), NOTES_TOKEN="")
    with pytest.raises(ConfigurationError, match=r"NOTES_URL.*http"):
        await listed(tools, http, NOTES_URL="localhost:9", NOTES_TOKEN=TOKEN)


async def test_a_server_that_wants_a_token(server: Server, http: httpx.AsyncClient) -> None:
    with pytest.raises(ToolsetError, match=r"HTTP 401.*token_setting="):
        await listed(MCPTools(server.url("auth")), http)
    wrong = MCPTools(server.url("auth"), token_setting="NOTES_TOKEN")
    with pytest.raises(ToolsetError, match=r"HTTP 401.*check the token in NOTES_TOKEN") as caught:
        await listed(wrong, http, NOTES_TOKEN="not-it")
    assert "not-it" not in str(caught.value)


async def test_the_session_is_kept_and_the_tools_listed_every_turn(
    server: Server, http: httpx.AsyncClient
) -> None:
    sent: list[str] = []

    async def record(request: httpx.Request) -> None:
        sent.append(json.loads(request.content).get("method", "(answer)"))

    http.event_hooks["request"].append(record)
    tools = MCPTools(server.url())
    await listed(tools, http)
    await listed(tools, http)
    assert sent == [
        "initialize",
        "notifications/initialized",
        "tools/list",
        "tools/list",
    ]


async def test_every_request_after_initialize_carries_the_session(
    server: Server, http: httpx.AsyncClient
) -> None:
    seen: list[httpx.Headers] = []

    async def record(request: httpx.Request) -> None:
        seen.append(request.headers)

    http.event_hooks["request"].append(record)
    offered = await listed(MCPTools(server.url("sse")), http)
    await call(offered["list_notes"], {})
    assert "mcp-session-id" not in seen[0]
    assert "mcp-protocol-version" not in seen[0]
    session = seen[1]["mcp-session-id"]
    assert all(h["mcp-session-id"] == session for h in seen[1:])
    assert all(h["mcp-protocol-version"] == "2025-11-25" for h in seen[1:])
    assert all(h["accept"] == "application/json, text/event-stream" for h in seen)
    assert server.calls("list_notes")[-1]["session"] == session


# -- calls --------------------------------------------------------------------------------


@pytest.mark.parametrize("endpoint", ENDPOINTS)
async def test_call_results(server: Server, http: httpx.AsyncClient, endpoint: str) -> None:
    tools = await listed(MCPTools(server.url(endpoint)), http)
    before = len(server.calls())
    added = await call(tools["add_note"], {"text": "water plants"}, "call_add")
    assert added.startswith("added note ")
    assert "water plants" in await call(tools["list_notes"], {})
    stats = await call(tools["note_stats"], {})
    assert set(stats) == {"count", "longest"}
    chart = await call(tools["note_chart"], {})
    assert [block["type"] for block in chart] == ["text", "image", "resource_link"]
    assert chart[1] == {
        "type": "image",
        "mimeType": "image/png",
        "data": "(9,000 bytes of image data, not kept)",
    }
    assert len(server.calls()) == before + 4  # each call seen once
    add = server.calls("add_note")[-1]
    assert add["arguments"] == {"text": "water plants"}
    assert add["key"] == "key-call_add"  # the idempotency key, in _meta
    assert add["endpoint"] == f"/{endpoint}"


@pytest.mark.parametrize("endpoint", ["json", "sse"])
async def test_call_failures(server: Server, http: httpx.AsyncClient, endpoint: str) -> None:
    tools = await listed(MCPTools(server.url(endpoint)), http)
    with pytest.raises(ToolFailure) as failed:
        await call(tools["broken_notes"], {})
    assert failed.value.kind == ToolErrorKind.TOOL_FAILED
    assert not failed.value.outcome_unknown
    assert "the notes database is offline" in failed.value.message
    with pytest.raises(ToolFailure) as refused:  # JSON-RPC error -32602
        await call(tools["rename_note"], {"note_id": 999, "text": "x"})
    assert refused.value.kind == ToolErrorKind.INVALID_ARGUMENTS
    assert "there is no note 999" in refused.value.message
    # A tool the server dropped after the listing (this server answers isError for it)
    gone = tools["list_notes"]
    gone.handler.server_name = "dropped_tool"  # type: ignore[union-attr]
    with pytest.raises(ToolFailure, match="Unknown tool") as unknown:
        await call(gone, {})
    assert not unknown.value.outcome_unknown


async def test_notifications_on_the_stream_are_passed_over(
    server: Server, http: httpx.AsyncClient
) -> None:
    tools = await listed(MCPTools(server.url("sse")), http)
    assert await call(tools["chatty_notes"], {}) == "done talking"


async def test_a_request_from_the_server_is_declined(
    server: Server, http: httpx.AsyncClient
) -> None:
    tools = await listed(MCPTools(server.url("sse")), http)
    answer = await call(tools["ask_client"], {})
    assert answer.startswith("the client did not answer")
    assert "does not serve 'elicitation/create'" in answer


async def test_a_stream_closed_before_the_answer_is_picked_up_again(
    server: Server, http: httpx.AsyncClient
) -> None:
    gets: list[str | None] = []

    async def record(request: httpx.Request) -> None:
        if request.method == "GET":
            gets.append(request.headers.get("last-event-id"))

    http.event_hooks["request"].append(record)
    tools = await listed(MCPTools(server.url("resumable")), http)
    before = len(server.calls("polled_note"))
    assert await call(tools["polled_note"], {"text": "later"}) == (
        f"added note {_note_number(await call(tools['list_notes'], {}), 'later')} "
        "while you were away"
    )
    assert gets
    assert all(gets)  # each with the Last-Event-ID it had
    assert len(server.calls("polled_note")) == before + 1


def _note_number(listing: str, text: str) -> int:
    return next(int(line.split(":")[0]) for line in listing.splitlines() if line.endswith(text))


# -- sessions, restarts, a server that is down ---------------------------------------------


async def test_a_server_that_restarts(tmp_path: Path, http: httpx.AsyncClient) -> None:
    opened: list[str] = []

    async def record(request: httpx.Request) -> None:
        if b'"initialize"' in request.content:
            opened.append(request.url.path)

    http.event_hooks["request"].append(record)
    own = Server(tmp_path / "calls.jsonl", tmp_path / "release")
    own.start()
    try:
        tools = MCPTools(own.url("sse"), name="notes")
        offered = await listed(tools, http)
        own.stop()
        with pytest.raises(ToolsetError, match="cannot reach the MCP server") as down:
            await listed(tools, http)
        assert down.value.source == "mcp:notes"
        # A call meanwhile is a transport error, which the run loop answers as it does for
        # any tool: the outcome is unknown.
        with pytest.raises(httpx.TransportError):
            await call(offered["delete_note"], {"note_id": 1})
        own.start(own.port)  # a new process: it knows no session
        # The call's first POST gets 404; a new session is opened and it is sent again.
        assert (await call(offered["add_note"], {"text": "after restart"})).startswith("added")
        calls = own.calls("add_note")
        assert len(calls) == 1
        assert calls[0]["session"] is not None
        assert opened == ["/sse", "/sse"]
        await listed(tools, http)  # and the next turn lists in the new session
        assert len(opened) == 2
    finally:
        own.stop()


async def test_no_mcp_endpoint_there(server: Server, http: httpx.AsyncClient) -> None:
    with pytest.raises(ToolsetError, match=r"no MCP endpoint at .*HTTP 404"):
        await listed(MCPTools(server.url("nope")), http)


async def test_without_a_client_it_makes_its_own(server: Server) -> None:
    tools = MCPTools(server.url())
    try:
        offered = {t.name: t for t in await tools.list_tools(context(None))}
        assert "list_notes" in offered
        assert "buy milk" in await call(offered["list_notes"], {})
    finally:
        await tools.aclose()


MODULE_LEVEL_NOTES = MCPTools(url_setting="NOTES_MCP_URL", name="notes")  # as in agent.py


def test_a_module_level_mcptools_keeps_no_client_across_event_loops(server: Server) -> None:
    # Issue 32: each test's event loop ran a turn through MCPTools' own client, kept on
    # the module-level object: "ResourceWarning: unclosed transport", an error under -W
    # error. run() without http= now makes the turn's client and closes it.
    agent = Agent("notes", "Keep the user's notes.", toolsets=[MODULE_LEVEL_NOTES])
    settings = {"NOTES_MCP_URL": server.url("json")}  # kept alive: a client holds its socket

    async def one_turn() -> str:
        llm = ScriptedLLM([LLMResponse(tool_calls=[ToolCall("c1", "list_notes", {})]),
                           LLMResponse("Read them.")])  # fmt: skip
        result = await run(agent, llm=llm, message="my notes?", settings=settings)
        assert result.status == "complete", result.error
        return tool_messages(llm)[0].content

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            assert "buy milk" in asyncio.run(one_turn())  # a new event loop each time
        gc.collect()  # what the old loop's client left open is reported when collected
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
    assert MODULE_LEVEL_NOTES._client is None  # it never made one of its own


# -- a fake upstream: what no real server should answer ----------------------------------

Answer = tuple[int, dict[str, str], bytes]


def json_answer(message: Any, status: int = 200) -> Answer:
    return status, {"content-type": "application/json"}, json.dumps(message).encode()


def result(request: dict[str, Any], value: dict[str, Any]) -> Answer:
    return json_answer({"jsonrpc": "2.0", "id": request["id"], "result": value})


def events(*messages: Any) -> Answer:
    body = "".join(f"event: message\ndata: {json.dumps(m)}\n\n" for m in messages).encode()
    return 200, {"content-type": "text/event-stream"}, body


INITIALIZED = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {}}
A_TOOL = {"name": "act", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": False}}


@dataclass
class Upstream:
    """A tiny HTTP server on 127.0.0.1: `answers[method](request)` answers each JSON-RPC
    method (initialize and the initialized notification by default)."""

    answers: dict[str, Callable[[dict[str, Any]], Answer]] = field(default_factory=dict)
    seen: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def answer(self, request: dict[str, Any]) -> Answer:
        self.seen.append(request)
        method = request.get("method", "")
        if method in self.answers:
            return self.answers[method](request)
        if method == "initialize":
            return result(request, INITIALIZED)
        if method == "notifications/initialized":
            return 202, {}, b""
        if method == "tools/list":
            return result(request, {"tools": [A_TOOL]})
        return json_answer({"jsonrpc": "2.0", "id": request.get("id"), "error": {"code": -32601}})


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    fake = Upstream()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        wbufsize = 1 << 16  # the head and the body in one write: no delayed-ACK stalls

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            status, headers, content = fake.answer(json.loads(body))
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            if "content-length" not in headers:
                self.send_header("content-length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)
            if int(headers.get("content-length", len(content))) != len(content):
                self.close_connection = True  # a body cut short, and nothing more coming

        def log_message(self, format: str, *args: Any) -> None:
            pass

    class Quiet(ThreadingHTTPServer):
        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # a client that hung up on a big answer, as some tests do

    httpd = Quiet(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    fake.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


async def test_an_answer_that_is_not_mcp_is_a_toolset_error(
    upstream: Upstream, http: httpx.AsyncClient
) -> None:
    upstream.answers["initialize"] = lambda r: (200, {"content-type": "text/html"}, b"<html>")
    with pytest.raises(ToolsetError, match=r"does not answer as an MCP server.*text/html"):
        await listed(MCPTools(upstream.url), http)
    upstream.answers["initialize"] = lambda r: json_answer({"hello": "world"})
    with pytest.raises(ToolsetError, match="not the JSON-RPC response"):
        await listed(MCPTools(upstream.url), http)
    upstream.answers["initialize"] = lambda r: (200, {"content-type": "application/json"}, b"{")
    with pytest.raises(ToolsetError, match="is not JSON"):
        await listed(MCPTools(upstream.url), http)
    upstream.answers["initialize"] = lambda r: result(r, {**INITIALIZED, "protocolVersion": "1"})
    with pytest.raises(ToolsetError, match="speaks MCP '1'"):
        await listed(MCPTools(upstream.url), http)


@pytest.mark.parametrize("client", ["kit", "plain"])
async def test_json_nested_too_deep_is_refused_before_parsing(
    upstream: Upstream, client: str
) -> None:
    deep = b'{"jsonrpc": "2.0", "id": 3, "result": {"tools": ' + b"[" * 100_000 + b"]" * 100_000
    upstream.answers["tools/list"] = lambda r: (200, {"content-type": "application/json"}, deep)
    made = default_client(5.0) if client == "kit" else httpx.AsyncClient(timeout=5.0)
    async with made as http:
        with pytest.raises(ToolsetError, match="deeper than 128 levels"):
            await listed(MCPTools(upstream.url), http)


async def test_a_listing_that_is_broken(upstream: Upstream, http: httpx.AsyncClient) -> None:
    def listing(*tools: Any) -> Callable[[dict[str, Any]], Answer]:
        return lambda r: result(r, {"tools": list(tools)})

    upstream.answers["tools/list"] = lambda r: result(r, {"tools": "act"})
    with pytest.raises(ToolsetError, match="no list of tools"):
        await listed(MCPTools(upstream.url), http)
    upstream.answers["tools/list"] = listing({"description": "no name"})
    with pytest.raises(ToolsetError, match="a tool without a name"):
        await listed(MCPTools(upstream.url), http)
    upstream.answers["tools/list"] = listing(A_TOOL, {"name": "odd", "inputSchema": "object"})
    with pytest.raises(ToolsetError, match="'odd' has no inputSchema"):
        await listed(MCPTools(upstream.url), http)
    assert list(await listed(MCPTools(upstream.url, allow=["act"]), http)) == ["act"]
    huge = {"name": "huge", "inputSchema": {"type": "object", "description": "x" * 200_000}}
    upstream.answers["tools/list"] = listing(A_TOOL, huge)
    with pytest.raises(ToolsetError, match="'huge' has an inputSchema of 200,"):
        await listed(MCPTools(upstream.url), http)
    upstream.answers["tools/list"] = listing(
        A_TOOL, {**A_TOOL, "name": "a.b"}, {**A_TOOL, "name": "a_b"}
    )
    with pytest.raises(ToolsetError, match=r"'a\.b' and 'a_b' both become 'a_b'"):
        await listed(MCPTools(upstream.url), http)
    assert sorted(await listed(MCPTools(upstream.url, allow=["act", "a.b"]), http)) == [
        "a_b",
        "act",
    ]
    upstream.answers["tools/list"] = lambda r: json_answer(
        {"jsonrpc": "2.0", "id": r["id"], "error": {"code": -32601, "message": "no tools here"}}
    )
    with pytest.raises(ToolsetError, match="could not list its tools: error -32601: no tools"):
        await listed(MCPTools(upstream.url), http)


async def test_listing_follows_pages_but_not_forever(
    upstream: Upstream, http: httpx.AsyncClient
) -> None:
    def page(r: dict[str, Any]) -> Answer:
        number = int(r["params"].get("cursor", "0"))
        tool = {**A_TOOL, "name": f"t{number}"}
        return result(r, {"tools": [tool], "nextCursor": str(number + 1) if number < 2 else None})

    upstream.answers["tools/list"] = page
    assert sorted(await listed(MCPTools(upstream.url), http)) == ["t0", "t1", "t2"]
    upstream.answers["tools/list"] = lambda r: result(r, {"tools": [], "nextCursor": "again"})
    with pytest.raises(ToolsetError, match=f"more than {MAX_PAGES} pages"):
        await listed(MCPTools(upstream.url), http)


JSON = {"content-type": "application/json"}
PARSE_ERROR = {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "parse error"}}
CALL_ANSWERS: dict[str, tuple[Callable[[dict[str, Any]], Answer], bool, str]] = {
    # name: (the answer to tools/call, whether the call may have run, words of the error)
    "HTTP 500": (lambda r: json_answer({"error": "boom"}, 500), True, "HTTP 500"),
    "HTTP 400": (lambda r: json_answer({"error": "no"}, 400), False, "HTTP 400"),
    "HTTP 403": (lambda r: json_answer({"error": "no"}, 403), False, "HTTP 403"),
    "a redirect": (lambda r: (307, {"location": "/elsewhere"}, b""), False, "HTTP 307"),
    "JSON cut": (lambda r: (200, JSON, b'{"jsonrpc": "2.0", "id"'), True, "not JSON"),
    "another id": (lambda r: result({"id": r["id"] + 1}, {}), True, "not the JSON-RPC response"),
    "content not a list": (lambda r: result(r, {"content": "x"}), True, "content is not a list"),
    "stream without the answer": (
        lambda r: events({"jsonrpc": "2.0", "method": "notifications/progress"}),
        True,
        "its event stream ended before the answer",
    ),
    "an event nested too deep": (
        lambda r: (200, {"content-type": "text/event-stream"}, b"data: " + b"[" * 200 + b"\n\n"),
        True,
        "deeper than 128 levels",
    ),
    "over 8 MB": (lambda r: (200, JSON, b" " * 9_000_000), True, "over 8,000,000 bytes"),
    "HTTP 202": (lambda r: (202, {}, b""), True, "HTTP 202 with no content type"),
    "an error without an id": (lambda r: json_answer(PARSE_ERROR), False, "error -32700"),
}


@pytest.mark.parametrize("case", sorted(CALL_ANSWERS))
async def test_call_answers_that_leave_the_outcome_unknown_or_not(
    upstream: Upstream, http: httpx.AsyncClient, case: str
) -> None:
    answer, unknown, words = CALL_ANSWERS[case]
    tools = await listed(MCPTools(upstream.url), http)
    upstream.answers["tools/call"] = answer
    with pytest.raises(ToolFailure, match=words) as failed:
        await call(tools["act"], {})
    assert failed.value.outcome_unknown is unknown
    assert failed.value.kind == ToolErrorKind.TOOL_FAILED


async def test_requests_of_the_server_are_answered_in_the_session(
    upstream: Upstream, http: httpx.AsyncClient
) -> None:
    tools = await listed(MCPTools(upstream.url), http)
    upstream.answers["tools/call"] = lambda r: events(
        {"jsonrpc": "2.0", "id": "p1", "method": "ping"},
        {"jsonrpc": "2.0", "id": 7, "method": "sampling/createMessage", "params": {}},
        {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "hi"}},
        {"jsonrpc": "2.0", "id": r["id"], "result": {"content": [{"type": "text", "text": "ok"}]}},
    )
    assert await call(tools["act"], {}) == "ok"
    answers = [r for r in upstream.seen if "method" not in r]
    assert answers[0] == {"jsonrpc": "2.0", "id": "p1", "result": {}}
    assert answers[1]["id"] == 7
    assert answers[1]["error"]["code"] == -32601
    assert "sampling/createMessage" in answers[1]["error"]["message"]


async def test_a_body_cut_short_is_a_transport_error(
    upstream: Upstream, http: httpx.AsyncClient
) -> None:
    tools = await listed(MCPTools(upstream.url), http)
    cut = (200, {"content-type": "application/json", "content-length": "100"}, b'{"jsonrpc"')
    upstream.answers["tools/call"] = lambda r: cut
    with pytest.raises(httpx.TransportError):  # the run loop: outcome unknown
        await call(tools["act"], {})


async def test_a_server_that_never_answers(upstream: Upstream, http: httpx.AsyncClient) -> None:
    def hang(request: dict[str, Any]) -> Answer:
        time.sleep(1.0)
        return result(request, {"tools": []})

    upstream.answers["tools/list"] = hang
    with pytest.raises(ToolsetError, match=r"did not answer within 0.2 s"):
        await listed(MCPTools(upstream.url, timeout=0.2), http)


# -- through run(): the model, the store, approvals ---------------------------------------


def notes_agent(url: str, **options: Any) -> Agent:
    return Agent("notes", "Keep the user's notes.", toolsets=[MCPTools(url, **options)])


def tool_messages(llm: ScriptedLLM, index: int = -1) -> list[Message]:
    return [m for m in llm.calls[index].messages if m.role == "tool"]


async def test_run_offers_the_servers_tools_and_stores_each_calls_policy(
    server: Server, tmp_path: Path, http: httpx.AsyncClient
) -> None:
    llm = ScriptedLLM(
        [
            LLMResponse(tool_calls=[ToolCall("call_add", "add_note", {"text": "feed the cat"})]),
            LLMResponse(text="Noted."),
        ]
    )
    async with sqlite_store(tmp_path / "agents.db") as store:
        result = await run(
            notes_agent(server.url("sse")),
            llm=llm,
            message="Remember to feed the cat",
            session_id="s-run",
            store=store,
            http=http,
        )
        history = await store.load_messages("s-run")
    assert result.status == "complete"
    offered = {spec.name for spec in llm.calls[0].tools}
    assert {"list_notes", "add_note", "delete_note", "notes_search"} <= offered
    (stored_call,) = next(m for m in history if m.tool_calls).tool_calls
    assert stored_call.policy is not None
    assert {k: v for k, v in stored_call.policy.items() if k != "input_schema"} == {
        "source": "mcp:127.0.0.1",
        "safe_to_retry": False,
        "requires_approval": False,
        "annotations": {"readOnlyHint": False, "destructiveHint": False},
    }
    assert stored_call.policy["input_schema"]["required"] == ["text"]
    (answer,) = tool_messages(llm)
    assert answer.content.startswith("added note ")
    (seen,) = [c for c in server.calls("add_note") if c["arguments"]["text"] == "feed the cat"]
    assert seen["key"] == idempotency_key("s-run", "call_add")


async def test_a_destructive_call_waits_for_approval(
    server: Server, tmp_path: Path, http: httpx.AsyncClient
) -> None:
    agent = notes_agent(server.url(), approve_destructive=True)
    llm = ScriptedLLM(
        [
            LLMResponse(tool_calls=[ToolCall("call_del", "delete_note", {"note_id": 77})]),
            LLMResponse(text="Deleted."),
        ]
    )
    before = len(server.calls("delete_note"))
    async with sqlite_store(tmp_path / "agents.db") as store:
        waiting = await run(
            agent, llm=llm, message="Delete note 77", session_id="s-ok", store=store, http=http
        )
        assert waiting.status == "awaiting_approval"
        (pending,) = waiting.pending
        assert pending.tool_name == "delete_note"
        assert len(server.calls("delete_note")) == before  # not sent yet
        await approve(store, "s-ok", pending.tool_call_id, digest=pending.digest, approved=True)
        done = await run(agent, llm=llm, session_id="s-ok", store=store, http=http)
    assert done.status == "complete"
    assert len(server.calls("delete_note")) == before + 1
    assert tool_messages(llm)[0].content == "deleted note 77"


async def test_a_clash_with_the_agents_own_tool(
    server: Server, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    # What a server lists is no programming mistake (it may start listing a clashing name
    # any day): the turn ends as a resumable toolset-error, its message kept.
    own = tool(name="list_notes", description="Ours.", input={}, handler=lambda a, c: "ours")
    agent = Agent("notes", "", [own], toolsets=[MCPTools(server.url())])
    async with sqlite_store(tmp_path / "agents.db") as store:
        failed = await run(agent, llm=ScriptedLLM([]), message="hi", session_id="s",
                           store=store, http=http)  # fmt: skip
        assert (failed.status, failed.error_code) == ("error", "toolset-error")
        assert failed.error is not None
        assert "list_notes" in failed.error
        assert "prefix=" in failed.error
        assert [m.content for m in await store.load_messages("s")] == ["hi"]
    prefixed = Agent("notes", "", [own], toolsets=[MCPTools(server.url(), prefix="srv_")])
    llm = ScriptedLLM([LLMResponse(text="ok")])
    assert (await run(prefixed, llm=llm, message="hi", http=http)).status == "complete"
    assert {"list_notes", "srv_list_notes"} <= {spec.name for spec in llm.calls[0].tools}


async def test_a_missing_setting_at_run_time_keeps_the_message_and_ends_resumably(
    server: Server, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    tools = MCPTools(url_setting="NOTES_URL", token_setting="NOTES_TOKEN", name="notes")
    agent = Agent("notes", "", [], toolsets=[tools])
    llm = ScriptedLLM([LLMResponse(text="Hello.")])
    async with sqlite_store(tmp_path / "agents.db") as store:
        failed = await run(agent, llm=llm, message="hi", session_id="s", store=store,
                           http=http, settings={"NOTES_URL": server.url("auth")})  # fmt: skip
        assert (failed.status, failed.error_code) == ("error", "configuration")
        assert failed.error is not None
        assert "Set NOTES_TOKEN where the agent's settings come from" in failed.error
        assert [m.content for m in await store.load_messages("s")] == ["hi"]
        settings = {"NOTES_URL": server.url("auth"), "NOTES_TOKEN": TOKEN}
        resumed = await run(agent, llm=llm, session_id="s", store=store, http=http,
                            settings=settings)  # fmt: skip
    assert resumed.status == "complete"


async def test_a_server_that_cannot_be_listed_ends_the_turn_resumably(
    upstream: Upstream, tmp_path: Path, http: httpx.AsyncClient
) -> None:
    upstream.answers["tools/list"] = lambda r: json_answer({"error": "down for a deploy"}, 503)
    agent = notes_agent(upstream.url, name="notes")
    llm = ScriptedLLM([LLMResponse(text="Hello.")])
    async with sqlite_store(tmp_path / "agents.db") as store:
        failed = await run(
            agent, llm=llm, message="hi", session_id="s-down", store=store, http=http
        )
        assert (failed.status, failed.error_code) == ("error", "toolset-error")
        assert failed.error is not None
        assert "mcp:notes" in failed.error
        assert "HTTP 503" in failed.error
        assert llm.calls == []
        del upstream.answers["tools/list"]
        resumed = await run(agent, llm=llm, session_id="s-down", store=store, http=http)
    assert resumed.status == "complete"
    assert [m.content for m in llm.calls[0].messages if m.role == "user"] == ["hi"]


@pytest.mark.parametrize(("read_only_then", "read_only_now"), [(True, False), (False, True)])
async def test_a_resume_goes_by_the_stored_policy(
    upstream: Upstream,
    tmp_path: Path,
    http: httpx.AsyncClient,
    read_only_then: bool,
    read_only_now: bool,
) -> None:
    """The result of a call is lost (a crash before write #2); the server's annotations
    change before the resume; the resume decides by what was stored with the call."""
    read_only = [read_only_then]

    def listing(request: dict[str, Any]) -> Answer:
        hinted = {**A_TOOL, "annotations": {"readOnlyHint": read_only[0]}}
        return result(request, {"tools": [hinted]})

    upstream.answers["tools/list"] = listing
    upstream.answers["tools/call"] = lambda r: result(
        r, {"content": [{"type": "text", "text": "acted"}]}
    )
    agent = notes_agent(upstream.url)
    llm = ScriptedLLM(
        [LLMResponse(tool_calls=[ToolCall("call_act", "act", {})]), LLMResponse(text="ok")]
    )
    async with sqlite_store(tmp_path / "agents.db") as store:
        with pytest.raises(SimulatedCrash):
            await run(
                agent,
                llm=llm,
                message="act",
                session_id="s-policy",
                store=crash_on_write(store, before="result of act"),
                http=http,
            )
        read_only[0] = read_only_now
        resumed = await run(agent, llm=llm, session_id="s-policy", store=store, http=http)
    assert resumed.status == "complete"
    calls = [r for r in upstream.seen if r.get("method") == "tools/call"]
    (answer,) = tool_messages(llm)
    if read_only_then:  # stored safe: sent again
        assert len(calls) == 2
        assert answer.content == "acted"
    else:  # stored as a side effect: never sent again, whatever the server says now
        assert len(calls) == 1
        assert ToolDurabilityError.from_message(answer) is not None


# -- a process killed mid-call --------------------------------------------------------------

SCRIPT = Path(__file__).resolve()


def spawn_child(db: Path, url: str, session: str, name: str, arguments: dict[str, Any]) -> Any:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(SRC), str(HERE.parent), env.get("PYTHONPATH")])
    )
    command = [sys.executable, str(SCRIPT), "child", str(db), url, session, name]
    return subprocess.Popen(
        [*command, json.dumps(arguments)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )


async def child_main(db: str, url: str, session: str, name: str, arguments: str) -> None:
    """The agent process the tests kill: one turn whose model calls `name`."""
    llm = ScriptedLLM(
        [LLMResponse(tool_calls=[ToolCall("call_lost", name, json.loads(arguments))])]
    )
    async with sqlite_store(db) as store:
        await run(
            notes_agent(url), llm=llm, message=f"call {name}", session_id=session, store=store
        )
    sys.exit("the child was not killed mid-call")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "arguments", "sent_again"),
    [("slow_delete", {"note_id": 2}, False), ("slow_read", {}, True)],
)
async def test_a_call_lost_with_its_process(
    server: Server,
    tmp_path: Path,
    http: httpx.AsyncClient,
    name: str,
    arguments: dict[str, Any],
    sent_again: bool,
) -> None:
    """SIGKILL the agent's process while the server holds its call; resume in this one."""
    db, session = tmp_path / "agents.db", f"s-{name}"
    server.hold()
    before = len(server.calls(name))
    child = spawn_child(db, server.url("sse"), session, name, arguments)
    try:
        deadline = time.monotonic() + 30
        while len(server.calls(name)) == before:  # the server has the call, and holds it
            assert child.poll() is None, child.communicate()[1].decode()[-2000:]
            assert time.monotonic() < deadline, "the call never reached the server"
            await asyncio.sleep(0.02)
        child.send_signal(signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
        child.communicate()
    server.release()  # the server finishes the call it held, for nobody
    llm = ScriptedLLM([LLMResponse(text="Checked.")])
    async with sqlite_store(db) as store:
        resumed = await run(
            notes_agent(server.url("sse")), llm=llm, session_id=session, store=store, http=http
        )
    assert resumed.status == "complete"
    (answer,) = tool_messages(llm)
    if sent_again:  # read-only: re-invoked on resume
        assert len(server.calls(name)) == before + 2
        assert answer.content.endswith(" notes")
    else:  # a side effect: the server saw it exactly once, and the model is told
        assert len(server.calls(name)) == before + 1
        lost = ToolDurabilityError.from_message(answer)
        assert lost is not None
        assert lost.tool_name == name
    keys = {c["key"] for c in server.calls(name)[before:]}
    assert keys == {idempotency_key(session, "call_lost")}  # one call, one key


if __name__ == "__main__":  # the child of test_a_call_lost_with_its_process
    assert sys.argv[1] == "child"
    asyncio.run(child_main(*sys.argv[2:7]))
