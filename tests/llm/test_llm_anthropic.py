"""AnthropicLLM against the wire format as the official `anthropic` SDK defines it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from anthropic.types import Message as AnthropicMessage
from anthropic.types import TextBlock, ToolUseBlock
from anthropic.types import Usage as AnthropicUsage
from pydantic import ValidationError
from tests.support.llm_support import (
    ERROR_CONTENT,
    PARIS,
    POST,
    ROME,
    TOOLS,
    capture_transport,
    conversations,
    fast_retry,
    validate_request,
)

from durable_agents import ConfigurationError, LLMResponse, Message, ToolCall, Usage
from durable_agents.llm import AnthropicLLM, MalformedToolCall
from durable_agents.llm.anthropic import build_request, parse_response

KEY = "sk-ant-test-secret-0123456789"


def anthropic_message(*content: Any, stop_reason: str = "end_turn", **usage: int) -> Any:
    """A response body as the SDK's own response model serialises it."""
    return AnthropicMessage(
        id="msg_01",
        type="message",
        role="assistant",
        model="claude-sonnet-4-5",
        content=list(content),
        stop_reason=stop_reason,  # type: ignore[arg-type]
        stop_sequence=None,
        usage=AnthropicUsage(
            input_tokens=usage.get("input_tokens", 12), output_tokens=usage.get("output", 7)
        ),
    ).model_dump(mode="json")


def text_reply(_: Any) -> Any:
    return anthropic_message(TextBlock(type="text", text="done", citations=None))


@pytest.mark.parametrize("name", list(conversations()))
async def test_every_request_body_fits_the_sdk_request_type(name: str) -> None:
    messages, tools = conversations()[name]
    transport, seen = capture_transport(text_reply)
    llm = AnthropicLLM("claude-sonnet-4-5", KEY, transport=transport, retry=fast_retry())
    await llm.chat(messages, tools)
    ((request, body),) = seen
    validate_request("anthropic", body)
    assert request.url == "https://api.anthropic.com/v1/messages"
    assert request.headers["x-api-key"] == KEY
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert request.headers["content-type"] == "application/json"


def test_the_strict_validator_catches_what_the_api_would_reject() -> None:
    body = build_request("m", [Message.user("hi")], TOOLS, max_tokens=10)
    validate_request("anthropic", body)
    for broken in (
        {**body, "temprature": 0},  # a misspelt top-level key
        {**body, "messages": [{"role": "user", "content": [{"type": "text", "txt": "hi"}]}]},
        {**body, "tools": [{"name": "x", "parameters": {"type": "object"}}]},
        {
            **body,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "a", "is_error": "yes"},
                    ],
                }
            ],
        },
    ):
        with pytest.raises(ValidationError):
            validate_request("anthropic", broken)


def test_system_messages_become_the_top_level_system() -> None:
    messages = [Message.system("Be brief."), Message.user("hi")]
    body = build_request("m", messages, [], max_tokens=99)
    assert body == {
        "model": "m",
        "max_tokens": 99,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }
    assert "system" not in build_request("m", [Message.system(""), *messages[1:]], [], max_tokens=1)


def test_tools_are_sent_with_their_input_schema() -> None:
    body = build_request("m", [Message.user("hi")], TOOLS, max_tokens=1)
    assert body["tools"][0] == {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "input_schema": TOOLS[0].input_schema,
    }


def test_parallel_calls_and_results_keep_call_order_in_one_user_turn() -> None:
    messages, _ = conversations()["full history, next turn"]
    turns = build_request("m", messages, TOOLS, max_tokens=1)["messages"]
    assert [t["role"] for t in turns] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert turns[1]["content"] == [
        {"type": "text", "text": "Checking both."},
        {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "call_2", "name": "get_weather", "input": {"city": "Rome"}},
    ]
    assert turns[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "call_1", "content": '{"temp_c": 21}'},
        {"type": "tool_result", "tool_use_id": "call_2", "content": "plain text result"},
    ]
    assert turns[3]["content"] == [
        {"type": "tool_use", "id": "call_3", "name": "post_slack", "input": POST.arguments}
    ]
    assert turns[4]["content"][0]["is_error"] is True
    assert turns[5]["content"] == [
        {"type": "text", "text": "Paris 21 C, Rome 25 C; posting failed."}
    ]
    assert turns[6]["content"] == [{"type": "text", "text": "Try posting again."}]


def test_error_results_are_flagged_and_a_following_user_message_joins_the_turn() -> None:
    messages = [
        Message.user("post it"),
        Message.assistant("", [POST]),
        Message.tool_result(POST, ERROR_CONTENT),
        Message.user("and try again"),
    ]
    turns = build_request("m", messages, TOOLS, max_tokens=1)["messages"]
    assert turns == [
        {"role": "user", "content": [{"type": "text", "text": "post it"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "call_3", "name": "post_slack", "input": POST.arguments}
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "call_3",
                    "content": ERROR_CONTENT,
                    "is_error": True,
                },
                {"type": "text", "text": "and try again"},
            ],
        },
    ]


def test_results_that_merely_mention_error_are_not_flagged() -> None:
    call = ToolCall("c", "search", {})
    for content in ('"error"', '{"errors": []}', "[1]", "not json {", ""):
        turns = build_request(
            "m",
            [Message.assistant("", [call]), Message.tool_result(call, content)],
            [],
            max_tokens=1,
        )["messages"]
        assert "is_error" not in turns[1]["content"][0]


def test_a_text_reply_parses() -> None:
    reply = parse_response(
        anthropic_message(TextBlock(type="text", text="Sunny in Paris.", citations=None))
    )
    assert reply == LLMResponse("Sunny in Paris.", [], Usage(12, 7))


def test_parallel_tool_use_parses_in_order_with_text() -> None:
    reply = parse_response(
        anthropic_message(
            TextBlock(type="text", text="Checking both.", citations=None),
            ToolUseBlock(
                type="tool_use", id="toolu_1", name="get_weather", input={"city": "Paris"}
            ),
            ToolUseBlock(type="tool_use", id="toolu_2", name="get_weather", input={"city": "Rome"}),
            stop_reason="tool_use",
        )
    )
    assert reply.text == "Checking both."
    assert reply.tool_calls == [
        ToolCall("toolu_1", "get_weather", {"city": "Paris"}),
        ToolCall("toolu_2", "get_weather", {"city": "Rome"}),
    ]


def test_cached_prompt_tokens_count_as_input() -> None:
    body = anthropic_message(TextBlock(type="text", text="x", citations=None))
    body["usage"].update(cache_read_input_tokens=100, cache_creation_input_tokens=5)
    assert parse_response(body).usage == Usage(117, 7)


def test_a_call_cut_off_at_max_tokens_is_never_run() -> None:
    reply = parse_response(
        anthropic_message(
            ToolUseBlock(
                type="tool_use", id="toolu_1", name="get_weather", input={"city": "Paris"}
            ),
            ToolUseBlock(type="tool_use", id="toolu_2", name="post_slack", input={"channel": "#o"}),
            stop_reason="max_tokens",
        )
    )
    first, second = reply.tool_calls
    assert type(first) is ToolCall
    assert isinstance(second, MalformedToolCall)
    assert second.arguments == {}
    assert "max_tokens" in second.arguments_error


def test_unknown_block_types_are_ignored() -> None:
    body = anthropic_message(TextBlock(type="text", text="ok", citations=None))
    body["content"].insert(0, {"type": "thinking", "thinking": "hmm", "signature": "s"})
    assert parse_response(body).text == "ok"


async def test_chat_round_trip_through_the_sdk_shapes() -> None:
    def answer(_: Any) -> Any:
        return anthropic_message(
            ToolUseBlock(type="tool_use", id="toolu_9", name="get_weather", input={"city": "Oslo"}),
            stop_reason="tool_use",
        )

    transport, _ = capture_transport(answer)
    llm = AnthropicLLM("claude-sonnet-4-5", KEY, transport=transport, max_tokens=256)
    reply = await llm.chat([Message.system("s"), Message.user("Oslo?")], TOOLS)
    assert reply.tool_calls == [ToolCall("toolu_9", "get_weather", {"city": "Oslo"})]
    await llm.aclose()


def test_extra_body_is_merged_and_max_tokens_sent() -> None:
    llm = AnthropicLLM("m", KEY, max_tokens=50, extra_body={"stop_sequences": ["END"]})
    body = llm.request_body([Message.user("hi")], [])
    assert body["max_tokens"] == 50
    assert body["stop_sequences"] == ["END"]
    validate_request("anthropic", body)


def test_the_key_never_shows() -> None:
    llm = AnthropicLLM("claude-sonnet-4-5", KEY)
    assert KEY not in repr(llm)
    assert KEY not in str(vars(llm).get("model"))


def test_construction_needs_a_key_and_a_model() -> None:
    with pytest.raises(ConfigurationError, match="LLM_API_KEY"):
        AnthropicLLM("m", "")
    with pytest.raises(ConfigurationError, match="LLM_MODEL"):
        AnthropicLLM("", KEY)


def test_request_body_is_plain_json() -> None:
    messages, tools = conversations()["full history, next turn"]
    body = build_request("m", messages, tools, max_tokens=1)
    assert json.loads(json.dumps(body)) == body
    assert [PARIS.id, ROME.id] == [
        b["id"] for b in body["messages"][1]["content"] if b["type"] == "tool_use"
    ]
