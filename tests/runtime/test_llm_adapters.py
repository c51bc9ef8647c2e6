"""The LLM adapters inside Pyodide: the default HTTP client goes through `fetch`, and
WorkersAILLM talks to a JS `AI` binding wrapped the way the workers SDK wraps env bindings.
Streams (stream()) arrive in pieces through `FetchTransport` and through the binding.

The fake JS providers are built from Python (`_JsFakes`): workerd refuses code generation
from strings (`eval`, `new Function`)."""

import ast
import asyncio
import json
import sys

import js
from pyodide.ffi import JsProxy, create_once_callable, create_proxy, to_js
from workers.rpc import _BindingWrapper

from durable_agents import LLMResponse, Message, ToolCall, ToolSpec, Usage
from durable_agents.cloudflare import FetchTransport
from durable_agents.llm import (
    AnthropicLLM,
    LLMConnectionError,
    LLMResponseError,
    OpenAILLM,
    RetryPolicy,
    TextDelta,
    ToolCallDelta,
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


def _js(value):
    """`value` (JSON-like) as JS data: objects, arrays, strings, numbers."""
    return to_js(value, dict_converter=js.Object.fromEntries)


def _js_record(**fields):
    """JSON.stringify of a JS object holding `fields` as they are, unconverted: a JS value
    as itself, a Python dict or list as a proxy (which would not stringify as data)."""
    record = js.Object.new()
    for name, value in fields.items():
        setattr(record, name, value)
    return str(js.JSON.stringify(record))


class _JsFakes:
    """JS functions made from Python functions, keeping their proxies alive until
    `destroy()`."""

    def __init__(self):
        self._proxies = []
        self._tasks = set()

    def function(self, fn):
        """A JS function calling `fn` with its JS arguments (JS objects arrive as JsProxy)
        and returning its result to JS: `Function.prototype.call.bind(proxy, undefined)`,
        a real JS function, not the proxy itself (binding the proxy directly aborts
        Pyodide)."""
        proxy = create_proxy(fn)
        self._proxies.append(proxy)
        call, bind = js.Function.prototype.call, js.Function.prototype.bind
        return js.Reflect.apply(bind, call, _js([proxy, None]))

    def async_function(self, fn):
        """A JS function returning a JS Promise of what the coroutine `fn(...)` returns (an
        exception in it rejects the Promise)."""
        return self.function(lambda *args: self._promise(fn(*args)))

    def _promise(self, coroutine):
        def executor(resolve, reject):
            async def settle():
                try:
                    resolve(await coroutine)
                except Exception as exc:
                    reject(js.Error.new(f"{type(exc).__name__}: {exc}"))

            task = asyncio.ensure_future(settle())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        return js.Promise.new(create_once_callable(executor))

    def destroy(self):
        for proxy in self._proxies:
            proxy.destroy()
        self._proxies.clear()


class _FakeAI:
    """A JS object like the `AI` binding: `async run(model, inputs)` records what arrived
    (JSON.stringify of it) and answers with JS objects."""

    def __init__(self):
        self._fakes = _JsFakes()
        self.seen = []
        self.inputs_were_js = []  # each call's inputs arrived as JS data (JsProxy)?
        self.binding = js.Object.new()
        self.binding.run = self._fakes.async_function(self._run)

    async def _run(self, model, inputs):
        self.inputs_were_js.append(isinstance(inputs, JsProxy))
        self.seen.append(_js_record(model=model, inputs=inputs))
        if any(m.role == "tool" for m in inputs.messages):
            answer = {
                "response": "Paris is 21 C.",
                "usage": {"prompt_tokens": 40, "completion_tokens": 5},
            }
        else:
            answer = {
                "response": None,
                "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}],
                "usage": {"prompt_tokens": 30, "completion_tokens": 4},
            }
        return js.JSON.parse(json.dumps(answer))  # `response: null` as JS has it

    def destroy(self):
        self._fakes.destroy()


async def test_workers_ai_through_a_wrapped_js_binding():
    fake = _FakeAI()
    llm = WorkersAILLM(_BindingWrapper(fake.binding), "@cf/meta/llama-3.3-70b-instruct-fp8-fast")

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
    fake.destroy()
    assert (second.text, second.tool_calls, second.usage) == ("Paris is 21 C.", [], Usage(40, 5))

    # what arrived on the JS side is plain JS data: objects, arrays, strings
    assert fake.inputs_were_js == [True, True]
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


# ---------------------------------------------------------------- streams


# A JS provider: `fetch` (or `ai.run`) answers with a ReadableStream that sends each
# event 30 ms after the previous one is read, logging what it sent, so a test can see
# that a piece reached Python while the rest was still unsent.
class _StreamingProvider:
    def __init__(self, events):
        self._events = list(events)
        self._fakes = _JsFakes()
        self.log = []
        self.requests = []  # JSON.stringify of what each call received
        self.fetch = self._fakes.async_function(self._fetch)
        self.ai = js.Object.new()
        self.ai.run = self._fakes.async_function(self._run)

    def _stream(self):
        encoder = js.TextEncoder.new()
        sent = 0

        async def pull(controller):
            nonlocal sent
            if sent > 0:
                await asyncio.sleep(0.03)
            if sent >= len(self._events):
                self.log.append("end")
                controller.close()
                return
            self.log.append(f"sent {sent}")
            controller.enqueue(encoder.encode(self._events[sent]))
            sent += 1

        source = js.Object.new()
        source.pull = self._fakes.async_function(pull)
        return js.ReadableStream.new(source, _js({"highWaterMark": 0}))

    async def _fetch(self, url, init):
        body = js.TextDecoder.new().decode(init.body)
        self.requests.append(_js_record(url=url, headers=init.headers, body=body))
        return js.Response.new(
            self._stream(),
            _js({"status": 200, "headers": {"content-type": "text/event-stream; charset=utf-8"}}),
        )

    async def _run(self, model, inputs):
        self.requests.append(_js_record(model=model, inputs=inputs))
        return self._stream()

    def destroy(self):
        self._fakes.destroy()


def _sse(data, event=None):
    text = data if isinstance(data, str) else json.dumps(data)
    return (f"event: {event}\n" if event else "") + f"data: {text}\n\n"


async def _read(stream, provider):
    """Every part, each with what the provider had logged when it arrived."""
    seen = []
    async for part in stream:
        seen.append((part, list(provider.log)))
    return seen


def _chunk(delta, finish=None, usage=None):
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": choices, "usage": usage}  # fmt: skip


async def test_an_openai_stream_arrives_in_pieces_through_fetch():
    call = {"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": '}}  # fmt: skip
    events = [
        _sse(_chunk({"role": "assistant", "content": "Sunny "})),
        _sse(_chunk({"content": "in "})),
        _sse(_chunk({"content": "Parí"})),
        _sse(_chunk({"content": "s."})),
        _sse(_chunk({"tool_calls": [call]})),
        _sse(_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]})),
        _sse(_chunk({}, "tool_calls")),
        _sse(_chunk(None, usage={"prompt_tokens": 9, "completion_tokens": 4})),
        "data: [DONE]\n\n",
    ]
    provider = _StreamingProvider(events)
    llm = OpenAILLM(
        "m", "sk-secret", base_url="https://llm.example/v1",
        transport=FetchTransport(provider.fetch), retry=RetryPolicy.none(),
    )  # fmt: skip
    seen = await _read(llm.stream([Message.user("Paris?")], [WEATHER]), provider)
    await llm.aclose()
    provider.destroy()
    texts = [(part.text, log) for part, log in seen if isinstance(part, TextDelta)]
    assert [text for text, _ in texts] == ["Sunny ", "in ", "Parí", "s."]
    first_log = texts[0][1]
    assert "end" not in first_log
    assert "sent 3" not in first_log
    calls = [part for part, _ in seen if isinstance(part, ToolCallDelta)]
    assert [(c.id, c.name, c.arguments) for c in calls] == [
        ("call_1", "get_weather", '{"city": '), (None, None, '"Paris"}'),
    ]  # fmt: skip
    final = seen[-1][0]
    assert final == LLMResponse(
        "Sunny in París.", [ToolCall("call_1", "get_weather", {"city": "Paris"})], Usage(9, 4)
    )
    sent = json.loads(provider.requests[0])
    assert sent["url"] == "https://llm.example/v1/chat/completions"
    assert json.loads(sent["body"])["stream"] is True
    assert ["accept", "text/event-stream"] in [[k.lower(), v] for k, v in sent["headers"]]


async def test_an_anthropic_stream_arrives_in_pieces_through_fetch():
    start = {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 20, "output_tokens": 1}}}  # fmt: skip

    def text(piece):
        return {"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": piece}}  # fmt: skip

    events = [
        _sse(start, "message_start"),
        _sse(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
            "content_block_start",
        ),
        _sse(text("Twenty-"), "content_block_delta"),
        ": keep-alive\n\n",
        _sse(text("one "), "content_block_delta"),
        _sse(text("degrees."), "content_block_delta"),
        _sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
        _sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 6},
            },
            "message_delta",
        ),
        _sse({"type": "message_stop"}, "message_stop"),
    ]
    provider = _StreamingProvider(events)
    llm = AnthropicLLM(
        "claude-sonnet-4-5", "sk-ant-secret", base_url="https://anthropic.example",
        transport=FetchTransport(provider.fetch), retry=RetryPolicy.none(),
    )  # fmt: skip
    seen = await _read(llm.stream([Message.user("Paris?")], []), provider)
    await llm.aclose()
    provider.destroy()
    texts = [(part.text, log) for part, log in seen if isinstance(part, TextDelta)]
    assert [t for t, _ in texts] == ["Twenty-", "one ", "degrees."]
    assert "end" not in texts[0][1]
    assert "sent 5" not in texts[0][1]
    assert seen[-1][0] == LLMResponse("Twenty-one degrees.", [], Usage(20, 6))
    sent = json.loads(provider.requests[0])
    assert sent["url"] == "https://anthropic.example/v1/messages"
    assert json.loads(sent["body"])["stream"] is True


async def test_a_workers_ai_stream_arrives_in_pieces_through_a_wrapped_binding():
    events = [
        _sse({"response": "Cold ", "p": "ab"}),
        _sse({"response": "in ", "p": "abc"}),
        _sse({"response": "Oslo.", "p": "a"}),
        _sse({"response": "", "usage": {"prompt_tokens": 7, "completion_tokens": 3}}),
        "data: [DONE]\n\n",
    ]
    provider = _StreamingProvider(events)
    llm = WorkersAILLM(_BindingWrapper(provider.ai), "@cf/meta/llama-3.3-70b-instruct-fp8-fast")
    seen = await _read(llm.stream([Message.user("Oslo?")], [WEATHER]), provider)
    provider.destroy()
    texts = [(part.text, log) for part, log in seen if isinstance(part, TextDelta)]
    assert [t for t, _ in texts] == ["Cold ", "in ", "Oslo."]
    assert "end" not in texts[0][1]
    assert "sent 2" not in texts[0][1]
    assert seen[-1][0] == LLMResponse("Cold in Oslo.", [], Usage(7, 3))
    sent = json.loads(provider.requests[0])
    assert sent["inputs"]["stream"] is True
    assert sent["inputs"]["messages"] == [{"role": "user", "content": "Oslo?"}]


async def test_stream_goes_over_fetch_by_default(local_http_server):
    # The echo server answers with JSON, not a stream: the adapter reads it as a whole
    # answer, which is no chat completion, and the echo shows what went over fetch.
    llm = OpenAILLM("m", "sk-secret", base_url=local_http_server + "/v1", retry=RetryPolicy.none())
    error = None
    try:
        async for _ in llm.stream([Message.user("héllo")], [WEATHER]):
            pass
    except LLMResponseError as exc:
        error = exc
    assert isinstance(llm._http.client._transport, FetchTransport)
    await llm.aclose()
    assert error is not None
    echoed = ast.literal_eval(error.body)
    assert echoed["path"] == "/v1/chat/completions"
    assert echoed["headers"]["accept"] == "text/event-stream"
    assert echoed["headers"]["authorization"] == "Bearer [redacted]"
    sent = json.loads(echoed["body"])
    assert (sent["stream"], sent["stream_options"]) == (True, {"include_usage": True})
