"""JSON nested too deep, at every place the kit parses JSON it did not write itself.

On Pyodide, `json.loads` of text nested ~10,000 levels deep overflows the JS
stack and kills the runtime (every session of the Worker); on CPython it is
a `RecursionError`, which is not a `ValueError`. So each way in is refused
before parsing, with that place's ordinary error: 400 for a client, an
`invalid-arguments` result for a model's call, `tool-failed` for an upstream,
`invalid-output` for a handler's value, `StoreError` for a stored row, an LLM
response error (run status "error") for a provider's body.
tests/runtime/test_json_depth.py runs the crashing cases inside Pyodide.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from durable_agents import (
    Agent,
    LLMResponse,
    Message,
    StoreError,
    Tool,
    ToolCall,
    ToolContext,
    run,
    tool,
)
from durable_agents._http.json_guard import DepthCheckedStream, refuse_deep_json
from durable_agents._json import (
    MAX_DEPTH,
    STORED_MAX_DEPTH,
    DepthScanner,
    JSONTooDeepError,
    check_depth,
    check_text_depth,
    loads,
)
from durable_agents.cloudflare.app import Command, Reply, handle_request, tools_client
from durable_agents.llm import AnthropicLLM, OpenAILLM, RetryPolicy, default_client
from durable_agents.llm.errors import provider_message
from durable_agents.llm.tool_calls import make_tool_call
from durable_agents.messages import MalformedToolCall, decode_tool_calls, tool_error
from durable_agents.stores import sqlite_store
from durable_agents.testing import ScriptedLLM

DEEP = 20_000


def nested(depth: int, inner: str = "") -> str:
    return "[" * depth + inner + "]" * depth


def nested_objects(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def nested_value(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


# --- the loader ---


def test_the_limit_is_exact_for_arrays_and_objects() -> None:
    assert MAX_DEPTH == 128
    assert loads(nested(128)) == nested_value(128)
    assert loads(nested_objects(128))["a"]["a"]["a"]
    for text in (nested(129), nested_objects(129)):
        with pytest.raises(JSONTooDeepError, match="JSON nested deeper than 128 levels"):
            loads(text)
    assert loads(nested(10), max_depth=10)
    with pytest.raises(JSONTooDeepError, match="deeper than 10 levels"):
        loads(nested(11), max_depth=10)


def test_the_error_is_a_json_decode_error_with_the_position() -> None:
    text = '{"message": "x", "a": ' + nested(10_000) + "}"
    with pytest.raises(json.JSONDecodeError) as caught:
        loads(text)
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, JSONTooDeepError)
    # The 129th level opens at char 21 + 128: the object is level 1.
    assert caught.value.pos == text.index("[") + 127
    assert caught.value.max_depth == MAX_DEPTH


def test_brackets_inside_strings_do_not_count() -> None:
    value = ["[" * 1000, "{" * 1000, {"k[[[[": "]]]]" * 300}]
    assert loads(json.dumps(value)) == value
    escaped = ['a \\" [[[' * 200, '\\"' + "{" * 500, "\\\\"]
    assert loads(json.dumps(escaped)) == escaped


def test_escaped_quotes_and_backslashes_do_not_end_or_hide_a_string() -> None:
    # A string ending in an escaped backslash is closed; the brackets after it count.
    with pytest.raises(JSONTooDeepError):
        loads('["\\\\", ' + nested(200) + "]")
    # An escaped quote does not close the string; the brackets after it are text.
    text = json.dumps(['\\"' + nested(200) + '\\"'])
    assert loads(text) == ['\\"' + nested(200) + '\\"']


def test_closing_brackets_cannot_hide_a_deep_part_after_them() -> None:
    with pytest.raises(JSONTooDeepError):
        check_text_depth("]" * 1000 + "[" * 200)


def test_bytes_in_any_json_encoding() -> None:
    assert loads(b'{"a": [1, 2]}') == {"a": [1, 2]}
    assert loads(bytearray(b"[[]]")) == [[]]
    assert loads('{"a": 1}'.encode("utf-16")) == {"a": 1}
    assert loads(b"\xef\xbb\xbf[1]") == [1]
    with pytest.raises(JSONTooDeepError):
        loads(nested(DEEP).encode())
    with pytest.raises(JSONTooDeepError):
        loads(nested(DEEP).encode("utf-16-le"))


def test_bad_json_is_still_a_value_error() -> None:
    with pytest.raises(ValueError, match="Expecting"):
        loads("[1,")
    with pytest.raises(ValueError, match="Expecting"):
        loads(nested(100)[:-1])


def feed_in_pieces(scanner: DepthScanner, text: bytes, size: int) -> DepthScanner:
    for start in range(0, len(text), size):
        scanner.feed(text[start : start + size])
    return scanner


def test_the_scanner_takes_pieces_split_anywhere() -> None:
    text = json.dumps({"s": 'a\\"b[[[\\\\', "deep": nested_value(40), "t": "}}}"}).encode()
    for size in (1, 2, 3, 7):
        ok = feed_in_pieces(DepthScanner(40 + 1), text, size)
        assert (ok.depth, ok.in_string, ok.escaped) == (0, False, False)
        with pytest.raises(JSONTooDeepError):
            feed_in_pieces(DepthScanner(40), text, size)


def test_check_depth_of_python_values() -> None:
    check_depth(nested_value(128))
    check_depth({"a": [({"b": 1},)]}, max_depth=4)
    for value in (nested_value(129), nested_value(DEEP)):
        with pytest.raises(ValueError, match="nested deeper than 128 levels"):
            check_depth(value)
    with pytest.raises(ValueError, match="deeper than 3"):
        check_depth({"a": [({"b": 1},)]}, max_depth=3)
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(ValueError, match="nested deeper"):
        check_depth(cycle)


def test_the_parsers_of_stored_and_provider_text_treat_deep_json_as_not_json() -> None:
    deep_error = '{"error": ' + nested(DEEP) + "}"
    assert tool_error(deep_error) is None
    assert tool_error('{"error": "boom", "kind": "tool-failed"}') == {
        "error": "boom",
        "kind": "tool-failed",
    }
    assert provider_message(deep_error) == deep_error
    with pytest.raises(ValueError, match="nested deeper"):
        Command.from_json('{"action": "resume", "x": ' + nested(DEEP) + "}")


# --- a client's body ---


class Recorder:
    def __init__(self) -> None:
        self.commands: list[Command] = []

    async def __call__(self, name: str, command: Command) -> Reply:
        self.commands.append(command)
        return Reply(200, {"ok": True})


@pytest.mark.parametrize("endpoint", ["messages", "resume"])
async def test_a_deep_request_body_is_a_400_and_reaches_no_session(endpoint: str) -> None:
    body = ('{"message": "x", "a": ' + nested(10_000) + "}").encode()
    assert len(body) < 64 * 1024
    recorder = Recorder()
    reply = await handle_request(
        "POST",
        f"/sessions/s1/{endpoint}",
        {"authorization": "Bearer t"},
        body,
        env={"API_TOKEN": "t"},
        dispatch=recorder,
    )
    assert reply.status == 400
    assert reply.body["error"]["code"] == "invalid-json"
    assert "deeper than 128 levels" in reply.body["error"]["message"]
    assert recorder.commands == []


# --- a model's tool call ---


class Flag(BaseModel):
    x: Any = None


def recording_tool(calls: list[Any]) -> Any:
    @tool
    async def act(args: Flag) -> str:
        """Record a call."""
        calls.append(args)
        return "done"

    return act


def last_results(messages: list[Message]) -> list[dict[str, Any]]:
    return [json.loads(m.content) for m in messages if m.role == "tool"]


async def test_deep_arguments_from_a_scripted_model_are_invalid_arguments(tmp_path: Path) -> None:
    handled: list[Any] = []
    agent = Agent("a", "", [recording_tool(handled)])
    llm = ScriptedLLM(
        [
            LLMResponse(tool_calls=[ToolCall("c1", "act", {"x": nested_value(DEEP)})]),
            LLMResponse(tool_calls=[make_tool_call("c2", "act", '{"x": ' + nested(DEEP) + "}")]),
            LLMResponse(text="ok"),
        ]
    )
    store = sqlite_store(tmp_path / "a.db")
    result = await run(agent, llm=llm, message="go", session_id="s", store=store)
    assert result.status == "complete", result.error
    assert handled == []
    results = last_results(result.messages)
    assert [r["kind"] for r in results] == ["invalid-arguments", "invalid-arguments"]
    assert all("deeper than 128 levels" in r["error"] for r in results)
    # The refused calls are stored as malformed, and read back as such.
    stored = await store.load_messages("s")
    calls = [c for m in stored for c in m.tool_calls]
    assert [type(c) for c in calls] == [MalformedToolCall, MalformedToolCall]
    await store.close()


def test_deep_arguments_as_an_object_are_refused_without_a_copy() -> None:
    call = make_tool_call("c1", "act", {"x": nested_value(DEEP)})
    assert isinstance(call, MalformedToolCall)
    assert call.raw_arguments == ""
    assert "deeper than 128 levels" in call.arguments_error
    fine = make_tool_call("c1", "act", {"x": nested_value(100)})
    assert not isinstance(fine, MalformedToolCall)


def openai_reply(message: dict[str, Any]) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": message}], "usage": {}}


async def test_deep_arguments_through_the_openai_adapter_are_invalid_arguments() -> None:
    replies = [
        openai_reply(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "act", "arguments": '{"x": ' + nested(DEEP) + "}"},
                    }
                ],
            }
        ),
        openai_reply({"role": "assistant", "content": "told"}),
    ]
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=replies.pop(0)))
    handled: list[Any] = []
    async with OpenAILLM(
        "m", "k", base_url="http://llm.test/v1", transport=transport, retry=RetryPolicy.none()
    ) as llm:
        result = await run(Agent("a", "", [recording_tool(handled)]), llm=llm, message="go")
    assert result.status == "complete", result.error
    assert handled == []
    [refused] = last_results(result.messages)
    assert refused["kind"] == "invalid-arguments"
    assert "deeper than 128 levels" in refused["error"]


# --- a provider's body ---


def deep_openai_body() -> bytes:
    return b'{"choices": [{"message": {"content": ' + nested(DEEP).encode() + b"}}]}"


def deep_anthropic_body() -> bytes:
    block = b'{"type": "tool_use", "id": "t1", "name": "act", "input": {"x": '
    return b'{"content": [' + block + nested(DEEP).encode() + b"}}]}"


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_deep_provider_body_ends_the_run_with_status_error(provider: str) -> None:
    body = deep_openai_body() if provider == "openai" else deep_anthropic_body()
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))
    options: dict[str, Any] = {"transport": transport, "retry": RetryPolicy.none()}
    llm = (
        OpenAILLM("m", "k", base_url="http://llm.test/v1", **options)
        if provider == "openai"
        else AnthropicLLM("m", "k", base_url="http://llm.test", **options)
    )
    handled: list[Any] = []
    async with llm:
        result = await run(Agent("a", "", [recording_tool(handled)]), llm=llm, message="go")
    assert result.status == "error"
    assert result.error is not None
    assert "LLMResponseError" in result.error
    assert "deeper than 128 levels" in result.error
    assert handled == []


# --- an upstream's body, through the client the kit builds ---


class _DeepAPI(BaseHTTPRequestHandler):
    """/issues/deep: a 20,000-deep JSON body, streamed in small chunks;
    /issues/deep16: the same in UTF-16; /issues/{id}: an ordinary issue;
    /text: brackets in a body that is not JSON."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        if self.path.endswith("/deep"):
            body = b'{"id": "1", "title": ' + nested(DEEP).encode() + b"}"
        elif self.path.endswith("/deep16"):
            body = ('{"id": "1", "title": ' + nested(DEEP) + "}").encode("utf-16")
        elif self.path == "/text":
            body = b"Text: " + b"[[[[" * DEEP
        else:
            body = json.dumps({"id": "7", "title": "Login [fails]", "status": "open"}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for start in range(0, len(body), 997):
            chunk = body[start : start + 997]
            self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        self.wfile.write(b"0\r\n\r\n")


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that refused a body hangs up mid-answer


@pytest.fixture
def deep_api() -> Iterator[str]:
    server = _QuietServer(("127.0.0.1", 0), _DeepAPI)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def test_the_kit_client_refuses_deep_json_and_passes_the_rest(deep_api: str) -> None:
    async with default_client(5) as client:
        for path in ("/issues/deep", "/issues/deep16"):
            with pytest.raises(httpx.DecodingError, match="nested deeper than 128 levels"):
                await client.get(deep_api + path)
        async with client.stream("GET", deep_api + "/issues/deep") as response:
            with pytest.raises(httpx.DecodingError):
                await response.aread()
        ordinary = await client.get(deep_api + "/issues/7")
        assert ordinary.json()["title"] == "Login [fails]"
        text = await client.get(deep_api + "/text")
        assert len(text.content) == 6 + 4 * DEEP


class IssueRef(BaseModel):
    id: str


def get_issue_from(api: str) -> Tool:
    @tool(safe_to_retry=True)
    async def get_issue(args: IssueRef, ctx: ToolContext[httpx.AsyncClient]) -> dict[str, Any]:
        """Fetch an issue."""
        response = await ctx.deps.get(f"{api}/issues/{args.id}")
        data: dict[str, Any] = response.json()
        return data

    return get_issue


async def test_a_deep_upstream_body_is_a_tool_failed_result(deep_api: str) -> None:
    llm = ScriptedLLM(
        [
            LLMResponse(tool_calls=[ToolCall("c1", "get_issue", {"id": "deep"})]),
            LLMResponse(tool_calls=[ToolCall("c2", "get_issue", {"id": "7"})]),
            LLMResponse(text="done"),
        ]
    )
    agent = Agent("issues", "Fetch issues.", [get_issue_from(deep_api)])
    async with tools_client(5) as client:  # what a Worker hands make_deps
        result = await run(agent, llm=llm, message="issue 1", deps=client)
    assert result.status == "complete", result.error
    failed, fetched = [m.content for m in result.messages if m.role == "tool"]
    error = json.loads(failed)
    assert error["kind"] == "tool-failed"
    assert "DecodingError" in error["error"]
    assert "nested deeper than 128 levels" in error["error"]
    assert json.loads(fetched)["title"] == "Login [fails]"


async def test_the_hook_checks_a_body_that_was_read_already() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=b"  \n" + nested(DEEP).encode())

    hooks = {"response": [refuse_deep_json]}
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer), event_hooks=hooks) as c:
        with pytest.raises(httpx.DecodingError, match="nested deeper than 128"):
            await c.get("http://api.test/x")


async def test_the_checked_stream_yields_every_byte_unchanged() -> None:
    body = b"\xef\xbb\xbf " + json.dumps({"a": ["[" * 300, nested_value(100)]}).encode()

    class Pieces(httpx.AsyncByteStream):
        async def __aiter__(self) -> Any:
            for start in range(0, len(body), 3):
                yield body[start : start + 3]

    request = httpx.Request("GET", "http://api.test/")
    out = b"".join([chunk async for chunk in DepthCheckedStream(Pieces(), request)])
    assert out == body
    short = DepthCheckedStream(Pieces(), request, max_depth=99)
    with pytest.raises(httpx.DecodingError, match="deeper than 99 levels"):
        _ = [chunk async for chunk in short]


# --- a handler's value ---


async def test_a_deep_tool_result_is_an_error_result_and_the_run_goes_on() -> None:
    @tool
    async def deep_list(args: Flag) -> Any:
        """A list nested 20,000 deep."""
        return nested_value(DEEP)

    @tool
    async def deep_text(args: Flag) -> str:
        """The same as JSON text."""
        return nested(DEEP)

    @tool
    async def fine(args: Flag) -> Any:
        """A list nested 128 deep."""
        return nested_value(128)

    llm = ScriptedLLM(
        [
            LLMResponse(
                tool_calls=[
                    ToolCall("c1", "deep_list", {}),
                    ToolCall("c2", "deep_text", {}),
                    ToolCall("c3", "fine", {}),
                ]
            ),
            LLMResponse(text="done"),
        ]
    )
    result = await run(Agent("a", "", [deep_list, deep_text, fine]), llm=llm, message="go")
    assert result.status == "complete"
    contents = [m.content for m in result.messages if m.role == "tool"]
    for content in contents[:2]:
        error = json.loads(content)
        assert error["kind"] == "invalid-output"
        assert "deeper than 128 levels and was not stored" in error["error"]
    assert json.loads(contents[2]) == nested_value(128)


# --- a stored row ---


async def test_the_deepest_accepted_call_reads_back_from_the_store(tmp_path: Path) -> None:
    arguments = {"x": nested_value(MAX_DEPTH - 1)}  # 128 levels with the object itself
    check_depth(arguments)
    handled: list[Any] = []
    llm = ScriptedLLM(
        [
            LLMResponse(tool_calls=[make_tool_call("c1", "act", json.dumps(arguments))]),
            LLMResponse(text="ok"),
        ]
    )
    async with sqlite_store(tmp_path / "a.db") as store:
        agent = Agent("a", "", [recording_tool(handled)])
        result = await run(agent, llm=llm, message="go", session_id="s", store=store)
        assert result.status == "complete"
        assert len(handled) == 1
        stored = await store.load_messages("s")
    assert stored[1].tool_calls[0].arguments == arguments
    assert decode_tool_calls(json.dumps([stored[1].tool_calls[0].to_dict()]))


async def test_a_stored_row_nested_too_deep_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    async with sqlite_store(path) as store:
        call = ToolCall("c1", "act", {"x": 1})
        await store.append_messages_atomic("s", 0, [Message.user("go")])
        await store.append_messages_atomic("s", 1, [Message.assistant("", [call])])
    deep = '[{"id": "c1", "name": "act", "arguments": {"x": ' + nested(DEEP) + "}}]"
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE agent_messages SET tool_calls = ? WHERE seq = 1", (deep,))
    conn.close()
    async with sqlite_store(path) as store:
        with pytest.raises(StoreError, match=f"nested deeper than {STORED_MAX_DEPTH} levels"):
            await store.load_messages("s")
        llm = ScriptedLLM([LLMResponse(text="never")])
        with pytest.raises(StoreError):
            await run(Agent("a", "", []), llm=llm, session_id="s", store=store)
        assert llm.calls == []
