"""`durable_agents.mcp.mcp_stub`: an MCP server made of the kit's own tools, for an agent
module's `DEV_STUBS`, so an agent whose tools come from `MCPTools` runs offline.

Against the real peers: the official MCP SDK's client and the kit's own `MCPTools` (in a
`run()`), over real HTTP to the stub behind the Worker's own `/__dev/` route code
(`serve_dev_stub`, its answer written as `src/entry.py` writes it), on 127.0.0.1; and
`check_agent` on an agent whose only tools are `MCPTools`, with no server at all.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from pydantic import BaseModel, Field, field_validator

from durable_agents import (
    Agent,
    ConfigurationError,
    LLMResponse,
    ModelRetry,
    ToolCall,
    ToolFailure,
    run,
    tool,
)
from durable_agents.cloudflare.agent_module import AgentModule, DevStub
from durable_agents.cloudflare.dev_stubs import serve_dev_stub
from durable_agents.mcp import MCPStub, MCPTools, mcp_stub
from durable_agents.testing import ScriptedLLM, check_agent

# -- a catalogue: the kit's own tools -----------------------------------------------------


class BookQuery(BaseModel):
    title: str = Field(min_length=1, max_length=80)


class Hold(BaseModel):
    book_id: int = Field(ge=1)
    reader: str = Field(min_length=1, max_length=40)


HOLDS: list[dict[str, Any]] = []


@tool(safe_to_retry=True)
def find_book(args: BookQuery) -> dict[str, Any]:
    """Find a book by title."""
    return {"book_id": 7, "title": args.title.title(), "on_shelf": True}


@tool
async def place_hold(args: Hold, ctx: Any = None) -> str:
    """Place a hold on a book for a reader."""
    assert ctx is None  # a stub's tools get no ToolContext
    HOLDS.append(args.model_dump())
    return f"hold {len(HOLDS)} placed"


@tool
def broken(args: BookQuery) -> dict[str, Any]:
    """A tool whose backend is down."""
    raise RuntimeError("the catalogue database is down")


@tool
def picky(args: BookQuery) -> dict[str, Any]:
    """Sends the model back, or fails on purpose."""
    if args.title == "retry":
        raise ModelRetry("say the title in full")
    raise ToolFailure("no such shelf")


def catalog() -> MCPStub:
    return mcp_stub(
        find_book,
        place_hold,
        broken,
        picky,
        annotations={"place_hold": {"destructiveHint": False}},
        name="catalog",
    )


async def post(stub: MCPStub, message: Any) -> tuple[int, Any]:
    body = message if isinstance(message, bytes) else json.dumps(message).encode()
    return await stub("POST", "/", body, {"content-type": "application/json"})


def request(method: str, params: Any = None, key: Any = 1) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": key, "method": method}
    if params is not None:
        message["params"] = params
    return message


# -- the stub, called as the Worker calls a dev stub ---------------------------------------


async def test_initialize_negotiates_the_version_and_names_the_server() -> None:
    stub = catalog()
    for asked, answered in [("2025-06-18", "2025-06-18"), ("2025-11-25", "2025-11-25"),
                            ("2099-01-01", "2025-11-25"), (None, "2025-11-25")]:  # fmt: skip
        params = {"capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
        if asked is not None:
            params["protocolVersion"] = asked
        status, body = await post(stub, request("initialize", params))
        assert status == 200
        assert body["id"] == 1
        assert body["result"] == {
            "protocolVersion": answered,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": "catalog", "version": "0"},
        }


async def test_tools_are_listed_with_their_schemas_and_annotations() -> None:
    status, body = await post(catalog(), request("tools/list", key="list-1"))
    assert (status, body["id"]) == (200, "list-1")
    tools = {t["name"]: t for t in body["result"]["tools"]}
    assert list(tools) == ["find_book", "place_hold", "broken", "picky"]
    assert tools["find_book"]["description"] == "Find a book by title."
    assert tools["find_book"]["inputSchema"] == find_book.input_schema
    assert tools["find_book"]["annotations"] == {"readOnlyHint": True}  # safe_to_retry
    assert tools["place_hold"]["annotations"] == {"readOnlyHint": False, "destructiveHint": False}
    assert tools["broken"]["annotations"] == {"readOnlyHint": False}
    # What the kit's MCPTools decides from them, as it would for a real server.
    overridden = mcp_stub(find_book, annotations={"find_book": {"readOnlyHint": False}})
    _, listed = await post(overridden, request("tools/list"))
    assert listed["result"]["tools"][0]["annotations"] == {"readOnlyHint": False}


async def test_a_call_runs_the_handler_and_answers_text_and_structured_content() -> None:
    stub = catalog()
    params = {"name": "find_book", "arguments": {"title": "dune"}}
    status, body = await post(stub, request("tools/call", params))
    assert status == 200
    assert body["result"] == {
        "content": [{"type": "text", "text": '{"book_id":7,"title":"Dune","on_shelf":true}'}],
        "isError": False,
        "structuredContent": {"book_id": 7, "title": "Dune", "on_shelf": True},
    }
    HOLDS.clear()
    params = {"name": "place_hold", "arguments": {"book_id": 7, "reader": "Ada"}}
    _, held = await post(stub, request("tools/call", params))
    assert held["result"] == {"content": [{"type": "text", "text": "hold 1 placed"}],
                              "isError": False}  # fmt: skip
    assert HOLDS == [{"book_id": 7, "reader": "Ada"}]


async def test_failures_are_is_error_results(caplog: pytest.LogCaptureFixture) -> None:
    stub = catalog()

    async def called(name: str, arguments: Any) -> dict[str, Any]:
        params = {"name": name, "arguments": arguments}
        status, body = await post(stub, request("tools/call", params))
        assert status == 200
        result: dict[str, Any] = body["result"]
        assert result["isError"] is True
        assert "structuredContent" not in result
        return result

    invalid = await called("place_hold", {"book_id": 0})
    text = invalid["content"][0]["text"]
    assert text.startswith("the arguments of 'place_hold' are invalid: ")
    assert "book_id" in text
    assert "reader" in text
    assert (await called("find_book", ["dune"]))["content"][0]["text"].endswith(
        "arguments must be a JSON object, got array"
    )
    with caplog.at_level("ERROR", logger="durable_agents"):
        down = await called("broken", {"title": "dune"})
    assert down["content"] == [
        {"type": "text", "text": "RuntimeError: the catalogue database is down"}
    ]
    (logged,) = caplog.records
    assert logged.getMessage() == "mcp_stub 'catalog': tool 'broken' raised; answered isError"
    assert logged.exc_info is not None
    assert (await called("picky", {"title": "retry"}))["content"][0]["text"] == (
        "say the title in full"
    )
    assert (await called("picky", {"title": "x"}))["content"][0]["text"] == "no such shelf"


class Odd(BaseModel):
    n: int

    @field_validator("n")
    @classmethod
    def not_thirteen(cls, n: int) -> int:
        if n == 13:
            raise TypeError("a validator's bug")  # pydantic does not wrap a TypeError
        return n


@tool
def odd(args: Odd) -> Any:
    """Return something for n."""
    if args.n == 1:
        return Odd(n=1)  # a model: structured, as its JSON
    if args.n == 2:
        return {1, 2}  # a set: not JSON
    return "plain text"


async def test_what_a_handler_returns_or_breaks_never_escapes_the_stub(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stub = mcp_stub(odd)

    async def result(n: int) -> dict[str, Any]:
        status, body = await post(
            stub, request("tools/call", {"name": "odd", "arguments": {"n": n}})
        )
        assert status == 200
        answer: dict[str, Any] = body["result"]
        return answer

    assert (await result(1))["structuredContent"] == {"n": 1}
    assert await result(3) == {
        "content": [{"type": "text", "text": "plain text"}],
        "isError": False,
    }
    unsent = await result(2)
    assert unsent["isError"] is True
    assert unsent["content"][0]["text"].startswith("'odd' ran, but its result cannot be sent: ")
    with caplog.at_level("ERROR", logger="durable_agents"):
        bug = await result(13)
    assert bug["content"][0]["text"] == "TypeError: a validator's bug"
    assert len(caplog.records) == 1


@pytest.mark.parametrize(
    ("message", "status", "code"),
    [
        (b"{not json", 400, -32700),
        (b"\xff\xfe\x00", 400, -32700),
        (b"[" * 200 + b"]" * 200, 400, -32700),  # too deep: refused before it is parsed
        ([request("ping"), request("ping", key=2)], 400, -32600),  # a batch
        ("ping", 400, -32600),
        ({"id": 1, "method": "ping"}, 400, -32600),  # no jsonrpc
        ({"jsonrpc": "2.0", "id": 1}, 400, -32600),  # no method
        (request("ping", key=True), 400, -32600),
        (request("ping", key=None), 400, -32600),
        (request("ping", key=[1]), 400, -32600),
        ({"jsonrpc": "2.0", "id": 1, "method": 5}, 400, -32600),
        (request("tools/list", params=[1]), 200, -32602),
        (request("tools/call", {"name": "nope", "arguments": {}}), 200, -32602),
        (request("tools/call", {"name": ["find_book"]}), 200, -32602),
        (request("tools/call", {}), 200, -32602),
        (request("resources/list"), 200, -32601),
        (request("server/discover"), 200, -32601),
    ],
)
async def test_what_is_not_a_request_it_serves_is_a_json_rpc_error(
    message: Any, status: int, code: int
) -> None:
    answered, body = await post(catalog(), message)
    assert answered == status
    assert body["jsonrpc"] == "2.0"
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    if status == 200:
        assert body["id"] == message["id"]


async def test_notifications_responses_and_other_methods() -> None:
    stub = catalog()
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert await post(stub, note) == (202, None)
    assert await post(stub, {"jsonrpc": "2.0", "id": 3, "result": {}}) == (202, None)
    assert (await post(stub, request("ping")))[1]["result"] == {}
    for method in ("GET", "DELETE", "PUT"):
        status, body = await stub(method, "/", b"", {})
        assert status == 405
        assert "POST only" in body["error"]


def test_bad_stubs_are_refused_when_made() -> None:
    with pytest.raises(ConfigurationError, match=r"made with durable_agents\.tool, got function"):
        mcp_stub(lambda a, c: None)  # type: ignore[arg-type]
    declared = tool(name="declared", description="No handler yet.", input={})
    with pytest.raises(ConfigurationError, match="tool 'declared' has no handler"):
        mcp_stub(declared)
    with pytest.raises(ConfigurationError, match="two tools are named 'find_book'"):
        mcp_stub(find_book, find_book)
    with pytest.raises(ConfigurationError, match=r"annotations name \['fnd_book'\]"):
        mcp_stub(find_book, annotations={"fnd_book": {"readOnlyHint": True}})
    with pytest.raises(ConfigurationError, match="must be a dict of MCP hints"):
        mcp_stub(find_book, annotations={"find_book": True})  # type: ignore[dict-item]
    with pytest.raises(ConfigurationError, match="annotations map tool names to MCP hints"):
        mcp_stub(find_book, annotations=[("find_book", {})])  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="name must be a non-empty string"):
        mcp_stub(find_book, name="")
    assert repr(catalog()) == "mcp_stub(find_book, place_hold, broken, picky, name='catalog')"


def test_an_agent_module_takes_it_as_a_dev_stub() -> None:
    module = catalog_module()
    served = AgentModule.load(module)
    assert served.dev_stubs["CATALOG_MCP_URL"] is module.DEV_STUBS["CATALOG_MCP_URL"]
    assert served.settings == ("CATALOG_MCP_URL",)


# -- over real HTTP, behind the Worker's /__dev/ route --------------------------------------


class StubServer:
    """`stubs` behind `serve_dev_stub` (the Worker's `/__dev/<NAME>` route) on 127.0.0.1,
    each `Reply` written as `src/entry.py` writes it."""

    def __init__(self, stubs: Mapping[str, DevStub]) -> None:
        self.stubs = stubs
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/__dev/{name}"

    def __enter__(self) -> StubServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stubs = self.stubs

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                size = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(size) if size else b""
                url = urlsplit(self.path)
                headers = {k.lower(): v for k, v in self.headers.items()}
                reply = asyncio.run(
                    serve_dev_stub(self.command, url.path, headers, body, stubs, query=url.query)
                )
                if reply.text is not None:
                    data, sent = reply.text.encode(), dict(reply.headers)
                else:
                    data, sent = reply.json_text().encode(), reply.all_headers()
                self.send_response(reply.status)
                for name, value in sent.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


@pytest.fixture(scope="module")
def served() -> Iterator[StubServer]:
    with StubServer({"CATALOG_MCP_URL": catalog()}) as server:
        yield server


async def test_the_route_sends_json_and_a_bodyless_202(served: StubServer) -> None:
    url = served.url("CATALOG_MCP_URL")
    async with httpx.AsyncClient() as http:
        listed = await http.post(url, json=request("tools/list"))
        assert listed.status_code == 200
        assert listed.headers["content-type"] == "application/json"
        assert len(listed.json()["result"]["tools"]) == 4
        note = await http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert (note.status_code, note.content) == (202, b"")
        assert "content-type" not in note.headers
        refused = await http.get(url, headers={"accept": "text/event-stream"})
        assert refused.status_code == 405


async def test_the_official_sdk_client_lists_and_calls_the_tools(served: StubServer) -> None:
    from mcp import Client

    HOLDS.clear()
    async with Client(served.url("CATALOG_MCP_URL")) as client:  # probes, then initialize
        assert client.protocol_version == "2025-11-25"
        listed = {t.name: t for t in (await client.list_tools()).tools}
        assert set(listed) == {"find_book", "place_hold", "broken", "picky"}
        assert listed["find_book"].annotations is not None
        assert listed["find_book"].annotations.read_only_hint is True
        assert listed["place_hold"].annotations is not None
        assert listed["place_hold"].annotations.destructive_hint is False
        assert listed["place_hold"].input_schema["required"] == ["book_id", "reader"]
        found = await client.call_tool("find_book", {"title": "emma"})
        assert found.is_error is False
        assert found.structured_content == {"book_id": 7, "title": "Emma", "on_shelf": True}
        held = await client.call_tool("place_hold", {"book_id": 7, "reader": "Ada"})
        assert (held.is_error, held.content[0].text) == (False, "hold 1 placed")  # type: ignore[union-attr]
        down = await client.call_tool("broken", {"title": "emma"})
        assert down.is_error is True
        assert "the catalogue database is down" in down.content[0].text  # type: ignore[union-attr]
    assert HOLDS == [{"book_id": 7, "reader": "Ada"}]


async def test_mcptools_in_a_run_calls_a_stubbed_tool(served: StubServer) -> None:
    agent = Agent("desk", "Find books.", toolsets=[MCPTools(url_setting="CATALOG_MCP_URL")])
    llm = ScriptedLLM(
        [
            LLMResponse(
                tool_calls=[
                    ToolCall("c1", "find_book", {"title": "emma"}),
                    ToolCall("c2", "broken", {"title": "emma"}),
                ]
            ),
            LLMResponse("Emma is on the shelf."),
        ]
    )
    settings = {"CATALOG_MCP_URL": served.url("CATALOG_MCP_URL")}
    result = await run(agent, llm=llm, message="Is Emma in?", settings=settings)  # no http=
    assert (result.status, result.response) == ("complete", "Emma is on the shelf.")
    calls = next(m for m in result.messages if m.tool_calls).tool_calls
    policies = {c.name: c.policy for c in calls}
    assert policies["find_book"] is not None
    assert policies["find_book"]["safe_to_retry"] is True
    assert policies["find_book"]["annotations"] == {"readOnlyHint": True}
    assert policies["broken"] is not None
    assert policies["broken"]["safe_to_retry"] is False
    found, down = [m for m in result.messages if m.role == "tool"]
    assert json.loads(found.content) == {"book_id": 7, "title": "Emma", "on_shelf": True}
    assert json.loads(down.content) == {
        "error": "Tool 'broken' failed: RuntimeError: the catalogue database is down",
        "kind": "tool-failed",
    }


# -- check_agent: no server at all ----------------------------------------------------------


def catalog_module() -> ModuleType:
    """An agent module whose only tools are an MCP server's, with a stub for it."""
    module = ModuleType("catalog_agent")
    module.AGENT = Agent(  # type: ignore[attr-defined]
        "catalog", "Find books and place holds.",
        toolsets=[MCPTools(url_setting="CATALOG_MCP_URL", name="catalog")],
    )  # fmt: skip
    module.make_deps = lambda env, http: None  # type: ignore[attr-defined]
    module.DEV_STUBS = {"CATALOG_MCP_URL": mcp_stub(find_book, place_hold)}  # type: ignore[attr-defined]
    return module


def test_check_agent_runs_an_mcp_agent_on_its_dev_stub() -> None:
    HOLDS.clear()
    report = check_agent(catalog_module(), config=None, turns=1)  # no env, no server
    assert report.toolset_tools == ("find_book", "place_hold")
    assert (report.safe_tools, report.unsafe_tools) == (("find_book",), ("place_hold",))
    assert report.crash_points > 0
    assert report.mcp_calls > 0  # the stub's tools/calls, checked as a server's
    assert HOLDS  # the side effect ran, on the stub
    # respond= answers the handlers' own requests; the toolset's stub still serves it.
    refuse = lambda request: httpx.Response(500)  # noqa: E731
    again = check_agent(catalog_module(), config=None, turns=1, respond=refuse)
    assert again.mcp_calls == report.mcp_calls
