"""OpenAILLM against the wire format as the official `openai` SDK defines it, plus the
looser shapes OpenAI-compatible servers send."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_message_function_tool_call import (
    ChatCompletionMessageFunctionToolCall,
    Function,
)
from pydantic import ValidationError
from tests.support.llm_support import (
    ERROR_CONTENT,
    PARIS,
    POST,
    ROME,
    TOOLS,
    capture_transport,
    conversations,
    validate_request,
)

from durable_agents import ConfigurationError, LLMResponse, Message, ToolCall, Usage
from durable_agents.llm import LLMResponseError, MalformedToolCall, OpenAILLM
from durable_agents.llm.openai import build_request, parse_response

KEY = "sk-proj-test-secret-0123456789"


def completion(
    content: str | None = None, *calls: tuple[str, str, str], finish: str = "stop"
) -> Any:
    """A response body as the SDK's own response model serialises it."""
    tool_calls = [
        ChatCompletionMessageFunctionToolCall(
            id=call_id, type="function", function=Function(name=name, arguments=arguments)
        )
        for call_id, name, arguments in calls
    ]
    return ChatCompletion(
        id="chatcmpl-1",
        object="chat.completion",
        created=1_700_000_000,
        model="gpt-4.1-mini",
        choices=[
            Choice(
                index=0,
                finish_reason=finish,  # type: ignore[arg-type]
                message=ChatCompletionMessage(
                    role="assistant", content=content, tool_calls=tool_calls or None
                ),
            )
        ],
        usage=CompletionUsage(prompt_tokens=31, completion_tokens=9, total_tokens=40),
    ).model_dump(mode="json")


@pytest.mark.parametrize("name", list(conversations()))
async def test_every_request_body_fits_the_sdk_request_type(name: str) -> None:
    messages, tools = conversations()[name]
    transport, seen = capture_transport(lambda _: completion("done"))
    llm = OpenAILLM("gpt-4.1-mini", KEY, transport=transport)
    await llm.chat(messages, tools)
    ((request, body),) = seen
    validate_request("openai", body)
    assert request.url == "https://api.openai.com/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {KEY}"


def test_the_strict_validator_catches_what_the_api_would_reject() -> None:
    body = build_request("m", [Message.user("hi")], TOOLS)
    validate_request("openai", body)
    for broken in (
        {**body, "tool": body["tools"]},
        {**body, "messages": [{"role": "tool", "content": "x"}]},  # no tool_call_id
        {**body, "tools": [{"type": "function", "function": {"name": "x", "input_schema": {}}}]},
        {**body, "messages": [{"role": "assistant", "tool_calls": [{"id": "a"}]}]},
    ):
        with pytest.raises(ValidationError):
            validate_request("openai", broken)


def test_history_maps_to_chat_messages() -> None:
    messages, _ = conversations()["full history, next turn"]
    wire = build_request("m", messages, TOOLS)["messages"]
    assert wire == [
        {"role": "system", "content": "You are a weather assistant."},
        {"role": "user", "content": "Weather in Paris and Rome? Then post Paris to #ops."},
        {
            "role": "assistant",
            "content": "Checking both.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'},
        {"role": "tool", "tool_call_id": "call_2", "content": "plain text result"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_3",
                    "type": "function",
                    "function": {"name": "post_slack", "arguments": json.dumps(POST.arguments)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_3", "content": ERROR_CONTENT},
        {"role": "assistant", "content": "Paris 21 C, Rome 25 C; posting failed."},
        {"role": "user", "content": "Try posting again."},
    ]


def test_tools_are_function_tools_with_the_input_schema_as_parameters() -> None:
    body = build_request("m", [Message.user("hi")], TOOLS)
    assert body["tools"][0] == {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": TOOLS[0].input_schema,
        },
    }
    assert "tools" not in build_request("m", [Message.user("hi")], [])


def test_a_text_reply_parses_with_usage() -> None:
    assert parse_response(completion("Sunny.")) == LLMResponse("Sunny.", [], Usage(31, 9))


def test_parallel_tool_calls_parse_in_order() -> None:
    reply = parse_response(
        completion(
            None,
            ("call_a", "get_weather", '{"city": "Paris"}'),
            ("call_b", "get_weather", '{"city":"Rome"}'),
            finish="tool_calls",
        )
    )
    assert reply.text == ""
    assert reply.tool_calls == [
        ToolCall("call_a", "get_weather", {"city": "Paris"}),
        ToolCall("call_b", "get_weather", {"city": "Rome"}),
    ]


@pytest.mark.parametrize("arguments", ['{"city": "Par', "[1, 2]", '"Paris"', "{'city': 'Paris'}"])
def test_malformed_arguments_become_an_empty_call_that_says_why(arguments: str) -> None:
    reply = parse_response(completion(None, ("call_x", "get_weather", arguments)))
    (call,) = reply.tool_calls
    assert isinstance(call, MalformedToolCall)
    assert isinstance(call, ToolCall)
    assert (call.id, call.name, call.arguments) == ("call_x", "get_weather", {})
    assert call.raw_arguments == arguments
    assert "was not run" in call.arguments_error
    assert "get_weather" in call.arguments_error


@pytest.mark.parametrize("arguments", ["", "   ", "null", "{}"])
def test_empty_arguments_are_an_empty_object(arguments: str) -> None:
    (call,) = parse_response(completion(None, ("c", "list_all", arguments))).tool_calls
    assert type(call) is ToolCall
    assert call.arguments == {}


def test_compatible_servers_loose_shapes_are_tolerated() -> None:
    # Ollama / llama.cpp / vLLM variants: no ids, no usage, no content key,
    # arguments already decoded, an extra field or two.
    body = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "tool_calls": [
                        {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                        {"type": "function", "function": {"name": "get_weather", "arguments": ""}},
                    ],
                    "reasoning_content": "thinking...",
                },
                "finish_reason": "tool_calls",
            }
        ]
    }
    reply = parse_response(body)
    assert reply == LLMResponse(
        "", [ToolCall("", "get_weather", {"city": "Paris"}), ToolCall("", "get_weather", {})]
    )
    assert reply.usage is None


def test_content_parts_and_null_content() -> None:
    parts = {"choices": [{"message": {"content": [{"type": "text", "text": "a"}, {"text": "b"}]}}]}
    assert parse_response(parts).text == "ab"
    assert parse_response({"choices": [{"message": {"content": None}}]}).text == ""


@pytest.mark.parametrize(
    "body", [{}, {"choices": []}, {"choices": [{"text": "legacy"}]}, [], "html", None]
)
def test_a_body_without_a_message_is_a_response_error(body: Any) -> None:
    with pytest.raises(LLMResponseError, match=r"LLM_BASE_URL|message"):
        parse_response(body)


async def test_no_key_no_authorization_header_and_custom_base_url() -> None:
    transport, seen = capture_transport(lambda _: completion("hi"))
    llm = OpenAILLM("llama3.2", base_url="http://localhost:11434/v1/", transport=transport)
    await llm.chat([Message.user("hi")], [])
    ((request, _),) = seen
    assert request.url == "http://localhost:11434/v1/chat/completions"
    assert "authorization" not in request.headers


def test_max_tokens_and_extra_body() -> None:
    assert "max_tokens" not in OpenAILLM("m").request_body([Message.user("hi")], [])
    llm = OpenAILLM("m", max_tokens=64, extra_body={"temperature": 0, "parallel_tool_calls": True})
    body = llm.request_body([Message.user("hi")], TOOLS)
    assert (body["max_tokens"], body["temperature"], body["parallel_tool_calls"]) == (64, 0, True)
    validate_request("openai", body)


def test_the_key_never_shows() -> None:
    assert KEY not in repr(OpenAILLM("gpt-4.1-mini", KEY))


def test_construction_needs_a_model() -> None:
    with pytest.raises(ConfigurationError, match="LLM_MODEL"):
        OpenAILLM("")


def test_ids_round_trip() -> None:
    messages = [Message.user("x"), Message.assistant("", [PARIS, ROME])]
    wire = build_request("m", messages, [])["messages"][1]["tool_calls"]
    assert [c["id"] for c in wire] == ["call_1", "call_2"]


def test_a_200_carrying_an_error_object_says_so() -> None:
    body = {"error": {"message": "upstream model unavailable", "code": 503}}
    with pytest.raises(LLMResponseError, match="upstream model unavailable"):
        parse_response(body)


@pytest.mark.parametrize("url", ["localhost:11434/v1", "api.openai.com", "ftp://x"])
def test_a_base_url_without_scheme_is_a_configuration_error(url: str) -> None:
    with pytest.raises(ConfigurationError, match="LLM_BASE_URL"):
        OpenAILLM("m", base_url=url)
