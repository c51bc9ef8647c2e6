"""JSON nested 20,000 deep, inside Pyodide: refused, never parsed.

Here `json.loads` of such text does not raise RecursionError: it overflows the
JS stack (`RangeError: Maximum call stack size exceeded`) and Pyodide is dead
for good, so a test that reaches the parser takes the runtime (and every
later test) down with it. Each test below also checks that the runtime still
works afterwards. The CPython side of these checks is tests/test_json_depth.py.

Deep *Python values* are another matter: here even freeing a list nested
~5,000 deep overflows the stack, so no code can hold one, and the tests
below build Python values only 1,000 deep (JSON text is what comes from
outside, and that is refused before any value is built).
"""

import json

import httpx
from pydantic import BaseModel

from durable_agents import Agent, LLMResponse, Message, StoreError, ToolCall, run, tool
from durable_agents._http.json_guard import refuse_deep_json
from durable_agents._json import JSONTooDeepError, loads
from durable_agents.cloudflare import FetchTransport, d1_store
from durable_agents.cloudflare.app import handle_request
from durable_agents.llm import OpenAILLM, RetryPolicy, default_client
from durable_agents.llm.tool_calls import make_tool_call
from durable_agents.messages import tool_error
from durable_agents.testing import ScriptedLLM

DEEP = 20_000
DEEP_VALUE = 1_000  # deep enough to be refused, shallow enough to be freed


def nested(depth):
    return "[" * depth + "]" * depth


def nested_value(depth):
    value = []
    for _ in range(depth - 1):
        value = [value]
    return value


def still_alive():
    assert json.loads(nested(100)) == nested_value(100)


class Flag(BaseModel):
    x: object = None


handled = []


@tool
async def act(args: Flag) -> str:
    """Record a call."""
    handled.append(args)
    return "done"


@tool
async def deep_result(args: Flag):  # no output type: encoded with json.dumps
    """Return a list nested 1,000 deep."""
    return nested_value(DEEP_VALUE)


AGENT = Agent("deep", "", [act, deep_result])


def results(messages):
    return [json.loads(m.content) for m in messages if m.role == "tool"]


def test_the_loader_refuses_a_20000_deep_body():
    body = '{"message": "x", "a": ' + nested(DEEP) + "}"
    for text in (body, body.encode(), body.encode("utf-16")):
        refused = False
        try:
            loads(text)
        except JSONTooDeepError as exc:
            refused = "deeper than 128 levels" in str(exc)
        assert refused
    assert tool_error('{"error": ' + nested(DEEP) + "}") is None
    still_alive()


async def test_a_deep_request_body_is_a_400():
    async def dispatch(name, command):
        raise AssertionError("a refused body reached the session")

    body = ('{"message": "x", "a": ' + nested(10_000) + "}").encode()
    reply = await handle_request(
        "POST", "/sessions/s/messages", {"authorization": "Bearer t"}, body,
        env={"API_TOKEN": "t"}, dispatch=dispatch,
    )  # fmt: skip
    assert reply.status == 400
    assert reply.body["error"]["code"] == "invalid-json"
    still_alive()


async def test_a_run_whose_model_arguments_are_20000_deep(env):
    handled.clear()
    store = d1_store(env.DB)
    await store.create_tables()
    deep_text = '{"x": ' + nested(DEEP) + "}"
    llm = ScriptedLLM(
        [
            LLMResponse(tool_calls=[make_tool_call("c1", "act", deep_text)]),
            LLMResponse(tool_calls=[ToolCall("c2", "act", {"x": nested_value(DEEP_VALUE)})]),
            LLMResponse(text="told"),
        ]
    )
    result = await run(AGENT, llm=llm, message="go", session_id="s1", store=store)
    assert result.status == "complete", result.error
    assert handled == []
    assert [r["kind"] for r in results(result.messages)] == ["invalid-arguments"] * 2
    stored = await store.load_messages("s1")  # the refused calls read back from D1
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant", "tool",
                                        "assistant"]  # fmt: skip
    still_alive()


async def test_deep_arguments_from_an_openai_body():
    handled.clear()
    call = {"id": "c1", "type": "function",
            "function": {"name": "act", "arguments": '{"x": ' + nested(DEEP) + "}"}}  # fmt: skip
    replies = [
        {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [call]}}]},
        {"choices": [{"message": {"role": "assistant", "content": "told"}}]},
    ]
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=replies.pop(0)))
    llm = OpenAILLM("m", "k", base_url="http://llm.test/v1", transport=transport,
                    retry=RetryPolicy.none())  # fmt: skip
    result = await run(AGENT, llm=llm, message="go")
    await llm.aclose()
    assert result.status == "complete", result.error
    assert handled == []
    assert results(result.messages)[0]["kind"] == "invalid-arguments"
    still_alive()


async def test_a_deep_provider_body_is_an_llm_error():
    body = b'{"choices": [{"message": {"content": ' + nested(DEEP).encode() + b"}}]}"
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))
    llm = OpenAILLM("m", "k", base_url="http://llm.test/v1", transport=transport,
                    retry=RetryPolicy.none())  # fmt: skip
    result = await run(AGENT, llm=llm, message="go")
    await llm.aclose()
    assert result.status == "error"
    assert "LLMResponseError" in result.error
    assert "deeper than 128 levels" in result.error
    still_alive()


async def test_a_deep_upstream_body_through_fetch_is_refused():
    import js
    from pyodide.ffi import to_js

    bodies = ['{"id": "1", "title": ' + nested(DEEP) + "}", '{"id": "2", "title": "fine [ok]"}']

    async def fake_fetch(url, init):  # the runtime's fetch, answering with a JS Response
        init = to_js({"headers": {"content-type": "application/json"}},
                     dict_converter=js.Object.fromEntries)  # fmt: skip
        return js.Response.new(bodies.pop(0), init)

    kit = default_client(5)
    hooks = kit.event_hooks
    await kit.aclose()
    assert refuse_deep_json in hooks["response"]
    async with httpx.AsyncClient(transport=FetchTransport(fake_fetch), event_hooks=hooks) as client:
        refused = ""
        try:
            await client.get("https://issues.test/issues/1")
        except httpx.DecodingError as exc:
            refused = str(exc)
        assert "nested deeper than 128 levels" in refused
        assert (await client.get("https://issues.test/issues/2")).json()["title"] == "fine [ok]"
    still_alive()


async def test_a_tool_returning_a_too_deep_value_is_an_error_result():
    llm = ScriptedLLM([LLMResponse(tool_calls=[ToolCall("c1", "deep_result", {})]),
                       LLMResponse(text="ok")])  # fmt: skip
    result = await run(AGENT, llm=llm, message="go")
    assert result.status == "complete"
    [error] = results(result.messages)
    assert error["kind"] == "invalid-output"
    still_alive()


async def test_a_deep_stored_row_is_a_store_error(env):
    store = d1_store(env.DB)
    await store.create_tables()
    await store.append_messages_atomic("s2", 0, [Message.user("go")])
    deep = '[{"id": "c1", "name": "act", "arguments": {"x": ' + nested(DEEP) + "}}]"
    await (
        env.DB.prepare(
            "INSERT INTO agent_messages (session_id, seq, role, content, tool_calls, created_at) "
            "VALUES ('s2', 1, 'assistant', '', ?, 0)"
        )
        .bind(deep)
        .run()
    )
    failed = ""
    try:
        await store.load_messages("s2")
    except StoreError as exc:
        failed = str(exc)
    assert "nested deeper than" in failed
    still_alive()
