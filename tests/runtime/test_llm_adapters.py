"""The LLM adapters inside Pyodide: the default HTTP client goes through `fetch`, and
WorkersAILLM talks to a JS `AI` binding wrapped the way the workers SDK wraps env bindings."""

import ast
import json
import sys

import js
from workers.rpc import _BindingWrapper

from durable_agents import Message, ToolCall, ToolSpec, Usage
from durable_agents.cloudflare import FetchTransport
from durable_agents.llm import (
    LLMConnectionError,
    LLMResponseError,
    OpenAILLM,
    RetryPolicy,
    WorkersAILLM,
)

WEATHER = ToolSpec(
    "get_weather",
    "Current weather for a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


async def test_http_adapter_uses_fetch_by_default(local_http_server):
    # The echo server answers with the request it got, which is no chat completion:
    # the adapter reports that, and the echo shows what went over fetch.
    assert sys.platform == "emscripten"
    llm = OpenAILLM("m", "sk-secret", base_url=local_http_server + "/v1", retry=RetryPolicy.none())
    error = None
    try:
        await llm.chat([Message.system("s"), Message.user("héllo")], [WEATHER])
    except LLMResponseError as exc:
        error = exc
    assert isinstance(llm._http.client._transport, FetchTransport)
    await llm.aclose()
    assert error is not None
    echoed = ast.literal_eval(error.body)  # the echo as the adapter saw it (a repr)
    assert echoed["path"] == "/v1/chat/completions"
    assert echoed["headers"]["authorization"] == "Bearer [redacted]"
    sent = json.loads(echoed["body"])
    assert sent["messages"][1] == {"role": "user", "content": "héllo"}
    assert sent["tools"][0]["function"]["name"] == "get_weather"


async def test_unreachable_provider_is_a_connection_error():
    llm = OpenAILLM("m", base_url="http://127.0.0.1:9/v1", retry=RetryPolicy.none())
    error = None
    try:
        await llm.chat([Message.user("hi")], [])
    except LLMConnectionError as exc:
        error = exc
    await llm.aclose()
    assert error is not None
    assert "LLM_BASE_URL" in str(error)


_FAKE_AI = """({
  seen: [],
  async run(model, inputs) {
    this.seen.push(JSON.stringify({ model, inputs }));
    if (inputs.messages.some((m) => m.role === "tool")) {
      return { response: "Paris is 21 C.", usage: { prompt_tokens: 40, completion_tokens: 5 } };
    }
    return {
      response: null,
      tool_calls: [{ name: "get_weather", arguments: { city: "Paris" } }],
      usage: { prompt_tokens: 30, completion_tokens: 4 },
    };
  },
})"""


async def test_workers_ai_through_a_wrapped_js_binding():
    fake = js.eval(_FAKE_AI)
    llm = WorkersAILLM(_BindingWrapper(fake), "@cf/meta/llama-3.3-70b-instruct-fp8-fast")

    first = await llm.chat([Message.system("s"), Message.user("Paris?")], [WEATHER])
    assert first.text == ""
    assert first.tool_calls == [ToolCall("", "get_weather", {"city": "Paris"})]
    assert first.usage == Usage(30, 4)

    call = ToolCall("call_1", "get_weather", {"city": "Paris"})
    history = [
        Message.system("s"),
        Message.user("Paris?"),
        Message.assistant("", [call]),
        Message.tool_result(call, '{"temp_c": 21}'),
    ]
    second = await llm.chat(history, [WEATHER])
    assert (second.text, second.tool_calls, second.usage) == ("Paris is 21 C.", [], Usage(40, 5))

    # what arrived on the JS side is plain JS data: objects, arrays, strings
    sent = json.loads(fake.seen[1])
    assert sent["model"] == "@cf/meta/llama-3.3-70b-instruct-fp8-fast"
    assert [m["role"] for m in sent["inputs"]["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
    ]
    assert sent["inputs"]["messages"][2]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
    }
    assert sent["inputs"]["messages"][3]["tool_call_id"] == "call_1"
    assert sent["inputs"]["tools"][0]["function"]["parameters"]["required"] == ["city"]
