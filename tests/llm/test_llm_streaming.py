"""Streaming model calls: each adapter's stream() against a real local server speaking the
provider's server-sent events, its retries, and the offline models' streams."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from anthropic.types import RawMessageStreamEvent
from openai.types.chat import ChatCompletionChunk
from pydantic import TypeAdapter
from tests.support.llm_support import (
    TOOLS,
    RecordingSleep,
    Reply,
    ScriptedServer,
    conversations,
    fast_retry,
    sse,
    validate_request,
)

from durable_agents import LLMResponse, Message, ToolCall, Usage
from durable_agents._http.sse import SSEEvent, sse_events, sse_lines
from durable_agents.llm import (
    AnthropicLLM,
    FunctionLLM,
    LLMAuthenticationError,
    LLMConnectionError,
    LLMContextLengthError,
    LLMRateLimitError,
    LLMResponseError,
    MalformedToolCall,
    OpenAILLM,
    StreamingLLM,
    StreamPart,
    TestLLM,
    TextDelta,
    ToolCallDelta,
    WorkersAILLM,
)
from durable_agents.testing import ScriptedLLM

KEY = "sk-test-stream-secret-0123456789"
ASK = [Message.system("You are a weather assistant."), Message.user("Weather in Paris?")]
CALL_ARGS = ['{"ci', 'ty": "Pa', 'ris"}']  # a call's arguments as the model writes them
DEEP = "[" * 300 + "]" * 300

_anthropic_event: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)


# ---------------------------------------------------------------- what the providers send


def anthropic_events(
    pieces: list[str],
    call: tuple[str, str, list[str]] | None = None,
    *,
    stop: str | None = None,
    usage: tuple[int, int] = (12, 7),
) -> list[bytes]:
    """A Messages API stream: the text in `pieces`, then a tool_use block, as Anthropic sends
    them (every event checked against the SDK's stream event type)."""
    start = {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": usage[0], "output_tokens": 1},
        },
    }
    events: list[dict[str, Any]] = [start]
    index = 0
    if pieces:
        events.append(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            }
        )
        events += [
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}}
            for p in pieces
        ]
        events.append({"type": "content_block_stop", "index": 0})
        index = 1
    if call is not None:
        call_id, name, arguments = call
        block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
        events.append({"type": "content_block_start", "index": index, "content_block": block})
        events += [
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": piece},
            }
            for piece in arguments
        ]
        events.append({"type": "content_block_stop", "index": index})
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop or ("tool_use" if call else "end_turn")},
            "usage": {"output_tokens": usage[1]},
        }
    )
    events.append({"type": "message_stop"})
    out = []
    for number, event in enumerate(events):
        _anthropic_event.validate_python(event)
        out.append(sse(event, event["type"]))
        if number == 1:
            out.append(b'event: ping\ndata: {"type": "ping"}\n\n')
    return out


def anthropic_whole(
    text: str, call: tuple[str, str, dict[str, Any]] | None = None, stop: str | None = None
) -> dict[str, Any]:
    """The same answer as one Messages API body (what chat() gets)."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    if call is not None:
        content.append({"type": "tool_use", "id": call[0], "name": call[1], "input": call[2]})
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": content,
        "stop_reason": stop or ("tool_use" if call else "end_turn"),
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 7},
    }


def openai_chunk(delta: dict[str, Any], finish: str | None = None, usage: Any = None) -> Any:
    chunk = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4.1-mini",
        "choices": [] if delta is None else [
            {"index": 0, "delta": delta, "finish_reason": finish}
        ],
        "usage": usage,
    }  # fmt: skip
    ChatCompletionChunk.model_validate(chunk)
    return chunk


def openai_events(
    pieces: list[str], call: tuple[str, str, list[str]] | None = None, *, done: bool = True
) -> list[bytes]:
    """A Chat Completions stream with `stream_options.include_usage`, as OpenAI sends it."""
    events = [openai_chunk({"role": "assistant", "content": ""})]
    events += [openai_chunk({"content": piece}) for piece in pieces]
    if call is not None:
        call_id, name, arguments = call
        first = {"index": 0, "id": call_id, "type": "function",
                 "function": {"name": name, "arguments": ""}}  # fmt: skip
        events.append(openai_chunk({"tool_calls": [first]}))
        events += [
            openai_chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            for piece in arguments
        ]
    events.append(openai_chunk({}, finish="tool_calls" if call else "stop"))
    usage = {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}
    events.append(openai_chunk(None, usage=usage))  # type: ignore[arg-type]
    out = [sse(event) for event in events]
    return [*out, b"data: [DONE]\n\n"] if done else out


def openai_whole(text: str, call: tuple[str, str, str] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if call is not None:
        message["tool_calls"] = [
            {"id": call[0], "type": "function", "function": {"name": call[1], "arguments": call[2]}}
        ]
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4.1-mini",
        "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
    }


def make_anthropic(server: ScriptedServer, **options: Any) -> AnthropicLLM:
    options.setdefault("retry", fast_retry())
    return AnthropicLLM("claude-sonnet-4-5", KEY, base_url=server.url, **options)


def make_openai(server: ScriptedServer, **options: Any) -> OpenAILLM:
    options.setdefault("retry", fast_retry())
    return OpenAILLM("gpt-4.1-mini", KEY, base_url=server.url + "/v1", **options)


class Provider:
    """One HTTP adapter under test: how to build it and what its server sends."""

    def __init__(self, name: str) -> None:
        self.name = name

    def llm(self, server: ScriptedServer, **options: Any) -> Any:
        return (make_anthropic if self.name == "anthropic" else make_openai)(server, **options)

    def events(
        self, pieces: list[str], call: tuple[str, str, list[str]] | None = None, **kw: Any
    ) -> list[bytes]:
        return (anthropic_events if self.name == "anthropic" else openai_events)(pieces, call, **kw)

    def whole(self, text: str, call: tuple[str, str, dict[str, Any]] | None = None) -> Any:
        if self.name == "anthropic":
            return anthropic_whole(text, call)
        return openai_whole(text, None if call is None else (call[0], call[1], json.dumps(call[2])))

    def first_text_event(self) -> int:
        """How many events come before the first text delta."""
        return 3 if self.name == "anthropic" else 1  # message_start, block start, ping | role

    def error_event(self, kind: str, message: str) -> bytes:
        if self.name == "anthropic":
            return sse({"type": "error", "error": {"type": kind, "message": message}}, "error")
        return sse({"error": {"message": message, "type": kind, "code": None}})


@pytest.fixture(params=["anthropic", "openai"])
def provider(request: pytest.FixtureRequest) -> Provider:
    return Provider(request.param)


async def collect(parts: AsyncIterator[StreamPart]) -> tuple[list[StreamPart], LLMResponse]:
    seen = [part async for part in parts]
    final = seen[-1]
    assert isinstance(final, LLMResponse)
    assert not any(isinstance(part, LLMResponse) for part in seen[:-1])
    return seen[:-1], final


def text_of(deltas: list[StreamPart]) -> list[str]:
    return [d.text for d in deltas if isinstance(d, TextDelta)]


# ---------------------------------------------------------------- the happy path


async def test_deltas_come_in_order_and_the_reply_equals_chats(provider: Provider) -> None:
    pieces = ["It is ", "sunny ", "in Paris."]
    call = ("call_1", "get_weather", CALL_ARGS)
    whole = provider.whole("It is sunny in Paris.", ("call_1", "get_weather", {"city": "Paris"}))
    replies = [Reply(events=provider.events(pieces, call)), Reply(whole)]
    with ScriptedServer(replies) as server:
        llm = provider.llm(server)
        deltas, streamed = await collect(llm.stream(*conversations()["tool call and result"]))
        chatted = await llm.chat(*conversations()["tool call and result"])
        await llm.aclose()
    assert streamed == chatted
    assert streamed == LLMResponse(
        "It is sunny in Paris.", [ToolCall("call_1", "get_weather", {"city": "Paris"})],
        Usage(12, 7),
    )  # fmt: skip
    assert text_of(deltas) == pieces
    calls = [d for d in deltas if isinstance(d, ToolCallDelta)]
    assert (calls[0].index, calls[0].id, calls[0].name) == (0, "call_1", "get_weather")
    assert all(d.id is None and d.name is None and d.index == 0 for d in calls[1:])
    assert "".join(d.arguments for d in calls) == "".join(CALL_ARGS)
    # every text delta comes before the call's deltas, as the provider sent them
    kinds = [type(d).__name__ for d in deltas]
    assert kinds == sorted(kinds, key=lambda k: k != "TextDelta")
    streamed_request = server.requests[0]
    assert streamed_request.headers["accept"] == "text/event-stream"
    assert streamed_request.body["stream"] is True
    validate_request(provider.name, streamed_request.body)
    extra = ("stream", "stream_options")
    chat_body = {k: v for k, v in streamed_request.body.items() if k not in extra}
    assert chat_body == server.requests[1].body


@pytest.mark.parametrize("name", list(conversations()))
async def test_every_stream_request_fits_the_sdk_streaming_type(
    provider: Provider, name: str
) -> None:
    with ScriptedServer([Reply(events=provider.events(["ok"]))]) as server:
        llm = provider.llm(server)
        await collect(llm.stream(*conversations()[name]))
        await llm.aclose()
    body = server.requests[0].body
    validate_request(provider.name, body)
    if provider.name == "openai":
        assert body["stream_options"] == {"include_usage": True}


async def test_the_first_delta_arrives_before_the_server_finishes(provider: Provider) -> None:
    events = provider.events(["first ", "second ", "third"])
    reply = Reply(events=events, hold_after=provider.first_text_event() + 1)
    with ScriptedServer([reply]) as server:
        llm = provider.llm(server)
        parts = llm.stream(ASK, [])
        first = await anext(parts)
        assert first == TextDelta("first ")
        assert not server.stream_ended.is_set()  # the rest is held until we read this one
        server.release.set()
        rest, final = await collect(parts)
        await llm.aclose()
    assert text_of(rest) == ["second ", "third"]
    assert final.text == "first second third"


async def test_a_tool_only_reply_streams_the_call(provider: Provider) -> None:
    call = ("call_9", "get_weather", ['{"city":', ' "Rome"}'])
    with ScriptedServer([Reply(events=provider.events([], call))]) as server:
        llm = provider.llm(server)
        deltas, final = await collect(llm.stream(ASK, TOOLS))
        await llm.aclose()
    assert final.text == ""
    assert final.tool_calls == [ToolCall("call_9", "get_weather", {"city": "Rome"})]
    assert text_of(deltas) == []
    assert [d.arguments for d in deltas if isinstance(d, ToolCallDelta)] == ["", *call[2]]


async def test_comments_crlf_and_multiline_data_are_read(provider: Provider) -> None:
    # The same events with CRLF line ends, a keep-alive comment, and one data line
    # split over two `data:` lines (joined with a newline, which JSON allows).
    events = []
    for number, event in enumerate(provider.events(["a", "b"])):
        text = event.decode()
        if number == 1:
            text = text.replace('data: {"', 'data: {\ndata: "', 1)
        events.append((": keep-alive\n" + text).replace("\n", "\r\n").encode())
    with ScriptedServer([Reply(events=events)]) as server:
        llm = provider.llm(server)
        deltas, final = await collect(llm.stream(ASK, []))
        await llm.aclose()
    assert text_of(deltas) == ["a", "b"]
    assert final.text == "ab"


async def test_a_json_answer_to_a_stream_request_is_one_delta(provider: Provider) -> None:
    # A compatible server that ignores `stream` and answers the whole reply.
    with ScriptedServer([Reply(provider.whole("all at once"))]) as server:
        llm = provider.llm(server)
        deltas, final = await collect(llm.stream(ASK, []))
        await llm.aclose()
    assert deltas == [TextDelta("all at once")]
    assert final == LLMResponse("all at once", [], Usage(12, 7))


@pytest.mark.parametrize(
    ("arguments", "error"),
    [(['{"city": "Par'], "not valid JSON"), (["[1, 2]"], "not an object"), ([DEEP], "refused")],
)
async def test_bad_or_too_deep_arguments_are_a_malformed_call(
    provider: Provider, arguments: list[str], error: str
) -> None:
    call = ("call_x", "get_weather", arguments)
    with ScriptedServer([Reply(events=provider.events([], call))]) as server:
        llm = provider.llm(server)
        _, final = await collect(llm.stream(ASK, TOOLS))
        await llm.aclose()
    (malformed,) = final.tool_calls
    assert isinstance(malformed, MalformedToolCall)
    assert (malformed.id, malformed.name, malformed.arguments) == ("call_x", "get_weather", {})
    assert error in malformed.arguments_error
    assert "was not run" in malformed.arguments_error


async def test_an_anthropic_call_cut_off_at_max_tokens_is_never_run() -> None:
    events = anthropic_events(
        [], ("call_m", "post_slack", ['{"channel": "#ops"']), stop="max_tokens"
    )
    whole = anthropic_whole("", ("call_m", "post_slack", {"channel": "#ops"}), stop="max_tokens")
    with ScriptedServer([Reply(events=events), Reply(whole)]) as server:
        llm = make_anthropic(server)
        _, streamed = await collect(llm.stream(ASK, TOOLS))
        chatted = await llm.chat(ASK, TOOLS)
        await llm.aclose()
    for reply in (streamed, chatted):
        (call,) = reply.tool_calls
        assert isinstance(call, MalformedToolCall)
        assert "max_tokens" in call.arguments_error


# ---------------------------------------------------------------- retries


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "connection-close"])
async def test_a_stream_broken_midway_is_retried_without_repeating(
    provider: Provider, chunked: bool
) -> None:
    events = provider.events(["Hel", "lo ", "wor", "ld"])
    cut = provider.first_text_event() + 2  # after "Hel" and "lo "
    replies = [Reply(events=events, chunked=chunked, cut_after=cut), Reply(events=events)]
    sleep = RecordingSleep()
    with ScriptedServer(replies) as server:
        llm = provider.llm(server, retry=fast_retry(sleep=sleep))
        deltas, final = await collect(llm.stream(ASK, []))
        await llm.aclose()
    assert len(server.requests) == 2
    assert text_of(deltas) == ["Hel", "lo ", "wor", "ld"]
    assert final == LLMResponse("Hello world", [], Usage(12, 7))
    assert len(sleep.waits) == 1


async def test_a_retry_that_goes_further_yields_only_what_is_new(provider: Provider) -> None:
    # The retry splits its text differently: only the part past what was shown comes.
    first = provider.events(["The weather ", "in Par"])
    second = provider.events(["The weather in", " Paris is sunny."])
    replies = [Reply(events=first, cut_after=provider.first_text_event() + 2), Reply(events=second)]
    with ScriptedServer(replies) as server:
        llm = provider.llm(server)
        deltas, final = await collect(llm.stream(ASK, []))
        await llm.aclose()
    assert text_of(deltas) == ["The weather ", "in Par", "is is sunny."]
    assert "".join(text_of(deltas)) == final.text == "The weather in Paris is sunny."


async def test_a_retry_whose_text_diverges_yields_no_more_text(provider: Provider) -> None:
    first = provider.events(["Hello, ", "I think"])
    second = provider.events(["Hi! ", "Paris is sunny."])
    replies = [Reply(events=first, cut_after=provider.first_text_event() + 2), Reply(events=second)]
    with ScriptedServer(replies) as server:
        llm = provider.llm(server)
        deltas, final = await collect(llm.stream(ASK, []))
        await llm.aclose()
    assert text_of(deltas) == ["Hello, ", "I think"]
    assert final.text == "Hi! Paris is sunny."  # the stored truth; the deltas were a preview


async def test_no_tool_call_delta_is_repeated_after_a_break(provider: Provider) -> None:
    call = ("call_1", "get_weather", CALL_ARGS)
    events = provider.events(["Checking."], call)
    cut = next(n for n, e in enumerate(events) if b'"ty": \\"Pa' in e or b'ty\\": \\"Pa' in e)
    replies = [Reply(events=events, cut_after=cut), Reply(events=events)]
    with ScriptedServer(replies) as server:
        llm = provider.llm(server)
        deltas, final = await collect(llm.stream(ASK, TOOLS))
        await llm.aclose()
    calls = [d for d in deltas if isinstance(d, ToolCallDelta)]
    assert [d.id for d in calls].count("call_1") == 1
    assert text_of(deltas) == ["Checking."]
    assert final.tool_calls == [ToolCall("call_1", "get_weather", {"city": "Paris"})]


async def test_a_stream_that_keeps_breaking_fails_as_a_connection_error(
    provider: Provider,
) -> None:
    events = provider.events(["a", "b"])
    replies = [Reply(events=events, cut_after=provider.first_text_event() + 1) for _ in range(3)]
    with ScriptedServer(replies) as server:
        llm = provider.llm(server, retry=fast_retry(max_attempts=3))
        seen: list[StreamPart] = []

        async def read_all() -> None:
            async for part in llm.stream(ASK, []):
                seen.append(part)

        with pytest.raises(LLMConnectionError) as caught:
            await read_all()
        await llm.aclose()
    assert caught.value.attempts == 3
    assert seen == [TextDelta("a")]
    assert KEY not in str(caught.value)


async def test_an_openai_stream_without_done_after_its_finish_is_accepted() -> None:
    with ScriptedServer([Reply(events=openai_events(["fine"], done=False))]) as server:
        llm = make_openai(server)
        _, final = await collect(llm.stream(ASK, []))
        await llm.aclose()
    assert final == LLMResponse("fine", [], Usage(12, 7))


# ---------------------------------------------------------------- errors


async def test_an_overloaded_error_event_is_retried(provider: Provider) -> None:
    broken = provider.events(["Hel"])[: provider.first_text_event() + 1]
    broken.append(provider.error_event("overloaded_error", "Overloaded"))
    replies = [Reply(events=broken), Reply(events=provider.events(["Hel", "lo"]))]
    with ScriptedServer(replies) as server:
        llm = provider.llm(server)
        deltas, final = await collect(llm.stream(ASK, []))
        await llm.aclose()
    assert len(server.requests) == 2
    assert text_of(deltas) == ["Hel", "lo"]
    assert final.text == "Hello"


async def test_an_invalid_request_error_event_fails_at_once(provider: Provider) -> None:
    events = [provider.error_event("invalid_request_error", "messages: bad role")]
    with ScriptedServer([Reply(events=events), Reply(events=provider.events(["x"]))]) as server:
        llm = provider.llm(server)
        with pytest.raises(LLMResponseError, match="bad role") as caught:
            await collect(llm.stream(ASK, []))
        await llm.aclose()
    assert len(server.requests) == 1
    assert caught.value.attempts == 1


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (401, {"error": {"type": "authentication_error", "message": "invalid x-api-key"}},
         LLMAuthenticationError),
        (400, {"error": {"type": "invalid_request_error", "message": "prompt is too long"}},
         LLMContextLengthError),
    ],
)  # fmt: skip
async def test_an_error_status_before_the_stream_is_chats_error(
    provider: Provider, status: int, body: Any, error: type[Exception]
) -> None:
    with ScriptedServer([Reply(body, status=status), Reply(body, status=status)]) as server:
        llm = provider.llm(server)
        with pytest.raises(error) as streamed:
            await collect(llm.stream(ASK, []))
        with pytest.raises(error) as chatted:
            await llm.chat(ASK, [])
        await llm.aclose()
    assert len(server.requests) == 2  # neither retried
    assert type(streamed.value) is type(chatted.value)
    assert str(streamed.value) == str(chatted.value)


async def test_429_before_the_stream_waits_out_retry_after(provider: Provider) -> None:
    sleep = RecordingSleep()
    replies = [
        Reply({"error": {"message": "slow down"}}, status=429, headers={"retry-after": "2"}),
        Reply(events=provider.events(["ok"])),
    ]
    with ScriptedServer(replies) as server:
        llm = provider.llm(server, retry=fast_retry(sleep=sleep))
        _, final = await collect(llm.stream(ASK, []))
        await llm.aclose()
    assert sleep.waits == [2.0]
    assert final.text == "ok"


async def test_429_that_never_ends_raises_rate_limit(provider: Provider) -> None:
    replies = [Reply({}, status=429, headers={"retry-after": "0"}) for _ in range(2)]
    with ScriptedServer(replies) as server:
        llm = provider.llm(server, retry=fast_retry(max_attempts=2))
        with pytest.raises(LLMRateLimitError) as caught:
            await collect(llm.stream(ASK, []))
        await llm.aclose()
    assert caught.value.attempts == 2


async def test_deep_json_in_a_data_line_is_refused_before_parsing(provider: Provider) -> None:
    events = provider.events(["a"])[: provider.first_text_event()]
    events.append(sse('{"type": "content_block_delta", "x": ' + DEEP + "}"))
    with ScriptedServer([Reply(events=events), Reply(events=provider.events(["a"]))]) as server:
        llm = provider.llm(server)
        with pytest.raises(LLMResponseError, match="refused before parsing"):
            await collect(llm.stream(ASK, []))
        await llm.aclose()
    assert len(server.requests) == 1


async def test_data_that_is_not_json_is_a_response_error(provider: Provider) -> None:
    events = [*provider.events(["a"])[:1], b"data: <html>proxy</html>\n\n"]
    with ScriptedServer([Reply(events=events)]) as server:
        llm = provider.llm(server)
        with pytest.raises(LLMResponseError, match="not JSON"):
            await collect(llm.stream(ASK, []))
        await llm.aclose()


async def test_nothing_listening_is_a_connection_error() -> None:
    llm = OpenAILLM("m", base_url="http://127.0.0.1:9/v1", retry=fast_retry(max_attempts=2))
    with pytest.raises(LLMConnectionError, match="LLM_BASE_URL") as caught:
        await collect(llm.stream(ASK, []))
    await llm.aclose()
    assert caught.value.attempts == 2


async def test_leaving_a_stream_early_closes_it(provider: Provider) -> None:
    events = provider.events(["one ", "two"])
    reply = Reply(events=events, hold_after=provider.first_text_event() + 1)
    with ScriptedServer([reply, Reply(events=provider.events(["again"]))]) as server:
        llm = provider.llm(server)
        parts = llm.stream(ASK, [])
        assert await anext(parts) == TextDelta("one ")
        await parts.aclose()  # type: ignore[attr-defined]
        server.release.set()
        _, final = await collect(llm.stream(ASK, []))  # the client still works
        await llm.aclose()
    assert final.text == "again"


# ---------------------------------------------------------------- Workers AI


class FakeReadableStream:
    """A JS ReadableStream of bytes as Pyodide hands it over: `getReader().read()` gives
    `{done, value}`; `fail_after=n` makes the n+1-th read raise, as a broken stream does."""

    def __init__(self, events: list[bytes], fail_after: int | None = None) -> None:
        self.events = list(events)
        self.fail_after = fail_after
        self.reads = 0
        self.cancelled = False

    def getReader(self) -> FakeReadableStream:  # the JS name
        return self

    async def read(self) -> dict[str, Any]:
        if self.fail_after is not None and self.reads == self.fail_after:
            raise RuntimeError("Error: Network connection lost.")
        self.reads += 1
        if not self.events:
            return {"done": True, "value": None}
        return {"done": False, "value": memoryview(self.events.pop(0))}

    async def cancel(self) -> None:
        self.cancelled = True


class StreamingAI:
    """`env.AI` answering `stream: true` with a stream, anything else from a script."""

    def __init__(self, *results: Any) -> None:
        self.results = list(results)
        self.inputs: list[Any] = []

    async def run(self, model: str, inputs: Any) -> Any:
        self.inputs.append(inputs)
        result = self.results.pop(0)
        if isinstance(result, BaseException):
            raise result
        return result


def workers_ai_events(pieces: list[str], calls: list[dict[str, Any]] | None = None) -> list[bytes]:
    events = [sse({"response": piece, "p": "abc"}) for piece in pieces]
    last: dict[str, Any] = {"response": "", "usage": {"prompt_tokens": 30, "completion_tokens": 4}}
    if calls:
        last["tool_calls"] = calls
    # Workers AI splits events across reads anywhere: join and re-cut them.
    body = b"".join([*events, sse(last), b"data: [DONE]\n\n"])
    return [body[i : i + 7] for i in range(0, len(body), 7)]


async def test_workers_ai_streams_what_the_binding_streams() -> None:
    call = {"name": "get_weather", "arguments": {"city": "Paris"}}
    ai = StreamingAI(FakeReadableStream(workers_ai_events(["Parí", "s is ", "sunny."], [call])))
    llm = WorkersAILLM(ai, retry=fast_retry())
    deltas, final = await collect(llm.stream(ASK, TOOLS))
    assert text_of(deltas) == ["Parí", "s is ", "sunny."]
    assert final == LLMResponse(
        "París is sunny.", [ToolCall("", "get_weather", {"city": "Paris"})], Usage(30, 4)
    )
    assert ai.inputs[0]["stream"] is True
    assert ai.inputs[0]["messages"][1] == {"role": "user", "content": "Weather in Paris?"}
    assert [d for d in deltas if isinstance(d, ToolCallDelta)] == [
        ToolCallDelta(0, None, "get_weather", '{"city": "Paris"}')
    ]


async def test_workers_ai_openai_style_chunks() -> None:
    events = b"".join(openai_events(["Oslo ", "is cold."], ("c1", "get_weather", CALL_ARGS)))
    ai = StreamingAI(FakeReadableStream([events]))
    deltas, final = await collect(WorkersAILLM(ai, retry=fast_retry()).stream(ASK, TOOLS))
    assert text_of(deltas) == ["Oslo ", "is cold."]
    assert final.tool_calls == [ToolCall("c1", "get_weather", {"city": "Paris"})]


async def test_workers_ai_stream_broken_midway_is_retried_without_repeating() -> None:
    events = workers_ai_events(["Hello ", "world"])
    ai = StreamingAI(
        FakeReadableStream(events, fail_after=3),
        FakeReadableStream(workers_ai_events(["Hello ", "world"])),
    )
    deltas, final = await collect(WorkersAILLM(ai, retry=fast_retry()).stream(ASK, []))
    assert "".join(text_of(deltas)) == final.text == "Hello world"
    assert len(ai.inputs) == 2


async def test_workers_ai_errors_before_the_stream_map_as_chats() -> None:
    ai = StreamingAI(
        RuntimeError("AiError: 3040: out of capacity"),
        FakeReadableStream(workers_ai_events(["ok"])),
    )
    _, final = await collect(WorkersAILLM(ai, retry=fast_retry()).stream(ASK, []))
    assert final.text == "ok"
    ai = StreamingAI(RuntimeError("AiError: 5007: No such model"))
    with pytest.raises(Exception, match="LLM_MODEL") as caught:
        await collect(WorkersAILLM(ai, retry=fast_retry()).stream(ASK, []))
    assert type(caught.value).__name__ == "LLMModelNotFoundError"


async def test_workers_ai_stream_cut_before_done_is_a_connection_error() -> None:
    body = b"".join([sse({"response": "half"})])
    ai = StreamingAI(FakeReadableStream([body]), FakeReadableStream([body]))
    with pytest.raises(LLMConnectionError, match=r"\[DONE\]"):
        await collect(WorkersAILLM(ai, retry=fast_retry(max_attempts=2)).stream(ASK, []))


async def test_workers_ai_a_whole_result_is_one_delta() -> None:
    ai = StreamingAI({"response": "whole", "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
    deltas, final = await collect(WorkersAILLM(ai).stream(ASK, []))
    assert deltas == [TextDelta("whole")]
    assert final == LLMResponse("whole", [], Usage(1, 1))


async def test_workers_ai_leaving_early_cancels_the_reader() -> None:
    stream = FakeReadableStream(workers_ai_events(["a ", "b ", "c"]))
    parts = WorkersAILLM(StreamingAI(stream)).stream(ASK, [])
    assert await anext(parts) == TextDelta("a ")
    await parts.aclose()  # type: ignore[attr-defined]
    assert stream.cancelled


# ---------------------------------------------------------------- offline models


def test_every_model_of_the_kit_is_a_streaming_llm() -> None:
    for llm in (
        AnthropicLLM("m", "k"),
        OpenAILLM("m"),
        WorkersAILLM(StreamingAI()),
        TestLLM(),
        FunctionLLM(lambda m, t: LLMResponse("x")),
        ScriptedLLM([]),
    ):
        assert isinstance(llm, StreamingLLM), llm


@pytest.mark.parametrize(
    "make",
    [
        lambda: TestLLM(text="The weather in Paris is sunny today."),
        lambda: FunctionLLM(lambda m, t: LLMResponse("The weather in Paris is sunny today.")),
        lambda: ScriptedLLM([LLMResponse("The weather in Paris is sunny today.")] * 2),
    ],
    ids=["TestLLM", "FunctionLLM", "ScriptedLLM"],
)
async def test_offline_models_stream_their_text_word_by_word(make: Callable[[], Any]) -> None:
    llm = make()
    deltas, streamed = await collect(llm.stream(ASK, []))
    assert streamed == await llm.chat(ASK, [])
    assert text_of(deltas) == ["The ", "weather ", "in ", "Paris ", "is ", "sunny ", "today."]


async def test_offline_tool_calls_stream_as_call_deltas_and_delays_apply() -> None:
    llm = TestLLM(delta_delay=0.01)
    deltas, final = await collect(llm.stream(ASK, TOOLS))
    assert [d.name for d in deltas if isinstance(d, ToolCallDelta)] == [t.name for t in TOOLS]
    assert [c.name for c in final.tool_calls] == [t.name for t in TOOLS]
    loop = asyncio.get_running_loop()
    started = loop.time()
    await collect(TestLLM(text="a b c d", delta_delay=0.02).stream(ASK, []))
    assert loop.time() - started >= 0.07


async def test_a_scripted_failure_raises_from_the_stream() -> None:
    llm = ScriptedLLM([LLMConnectionError("down")])
    with pytest.raises(LLMConnectionError):
        await collect(llm.stream(ASK, []))
    assert len(llm.calls) == 1


# ---------------------------------------------------------------- the SSE parser


async def _chunks(*pieces: bytes) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece


async def events_of(*pieces: bytes) -> list[SSEEvent]:
    return [event async for event in sse_events(sse_lines(_chunks(*pieces)))]


async def test_sse_lines_split_anywhere_and_every_line_end() -> None:
    body = "event: a\r\ndata: x\r\n\r\n: comment\rdata: é\rdata:  two\r\rid: 7\ndata:y\n\n".encode()
    for size in (1, 2, 3, 5, len(body)):
        pieces = [body[i : i + size] for i in range(0, len(body), size)]
        assert await events_of(*pieces) == [
            SSEEvent("a", "x"),
            SSEEvent("message", "é\n two"),
            SSEEvent("message", "y", "7"),
        ]


async def test_an_unfinished_event_at_the_end_is_dropped() -> None:
    assert await events_of(b'data: 1\n\ndata: {"cut') == [SSEEvent("message", "1")]
    assert await events_of(b"data: 1\n\ndata: 2\r\r") == [
        SSEEvent("message", "1"),
        SSEEvent("message", "2"),
    ]


# ---------------------------------------------------------------- the over-HTTP tests' fake


async def test_the_fake_model_of_the_dev_server_tests_streams_in_timed_chunks() -> None:
    from tests.support.worker_fakes import FakeServices

    conversation = [Message.system("Triage."), Message.user("triage issue 7")]
    with FakeServices() as fake:
        fake.chunk_delay = 0.05
        llm = OpenAILLM("fake-triage", base_url=f"{fake.url}/v1", retry=fast_retry())
        loop = asyncio.get_running_loop()
        started = loop.time()
        arrivals: list[tuple[float, StreamPart]] = []
        async for part in llm.stream(conversation, TOOLS):
            arrivals.append((loop.time() - started, part))
        whole = await llm.chat(conversation, TOOLS)
        await llm.aclose()
    deltas = [part for _, part in arrivals[:-1]]
    final = arrivals[-1][1]
    assert isinstance(final, LLMResponse)
    assert text_of(deltas) == ["Looking ", "it ", "up."]
    assert (
        (final.text, final.usage) == (whole.text, whole.usage) == ("Looking it up.", Usage(11, 7))
    )
    assert [(c.name, c.arguments) for c in final.tool_calls] == [("get_issue", {"id": "7"})]
    assert [(c.name, c.arguments) for c in whole.tool_calls] == [("get_issue", {"id": "7"})]
    assert len([d for d in deltas if isinstance(d, ToolCallDelta)]) == 3
    assert arrivals[-1][0] - arrivals[0][0] >= 0.05 * 7  # chunk_delay apart, not all at once
    assert [body.get("stream") for body in fake.llm_requests] == [True, None]


async def test_an_html_page_instead_of_a_stream_is_a_response_error_not_retried(
    provider: Provider,
) -> None:
    page = Reply(raw=b"<html>proxy login</html>", headers={"content-type": "text/html"})
    with ScriptedServer([page, Reply(events=provider.events(["x"]))]) as server:
        llm = provider.llm(server)
        with pytest.raises(LLMResponseError, match="LLM_BASE_URL"):
            await collect(llm.stream(ASK, []))
        await llm.aclose()
    assert len(server.requests) == 1


async def test_a_stream_that_stalls_midway_times_out_and_is_retried(provider: Provider) -> None:
    events = provider.events(["Still ", "here."])
    stalled = Reply(events=events, hold_after=provider.first_text_event() + 1)  # never released
    with ScriptedServer([stalled, Reply(events=events)]) as server:
        llm = provider.llm(server, timeout=0.5)
        deltas, final = await collect(llm.stream(ASK, []))
        await llm.aclose()
    assert len(server.requests) == 2
    assert text_of(deltas) == ["Still ", "here."]
    assert final.text == "Still here."
