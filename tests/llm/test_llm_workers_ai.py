"""WorkersAILLM with a fake `env.AI` binding answering in the shapes Workers AI models use."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest
from tests.support.llm_support import ERROR_CONTENT, POST, TOOLS, conversations, fast_retry

from durable_agents import ConfigurationError, LLMResponse, Message, ToolCall, Usage
from durable_agents.llm import (
    LLMAuthenticationError,
    LLMContextLengthError,
    LLMError,
    LLMModelNotFoundError,
    LLMRateLimitError,
    LLMResponseError,
    LLMTimeoutError,
    MalformedToolCall,
    RetryPolicy,
    WorkersAILLM,
)
from durable_agents.llm.workers_ai import DEFAULT_WORKERS_AI_MODEL, parse_result

MODEL = "@cf/meta/llama-3.3-70b-instruct-fp8-fast"


class FakeAI:
    """Stands in for `env.AI`: records each `run` and answers from a script."""

    def __init__(self, *results: Any, delay: float = 0.0) -> None:
        self.results = list(results)
        self.calls: list[tuple[str, Any]] = []
        self.delay = delay

    async def run(self, model: str, inputs: Any) -> Any:
        self.calls.append((model, copy.deepcopy(inputs)))
        if self.delay:
            await asyncio.sleep(self.delay)
        result = self.results.pop(0)
        if isinstance(result, BaseException):
            raise result
        return result


class JsLike:
    """A result as Pyodide hands over a JS object: converted with `to_py()`."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def to_py(self) -> Any:
        return self.value


# Shapes as documented for Workers AI text-generation models.
TRADITIONAL = {
    "response": "",
    "tool_calls": [
        {"name": "get_weather", "arguments": {"city": "Paris"}},
        {"name": "get_weather", "arguments": {"city": "Rome"}},
    ],
    "usage": {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150},
}
WITH_IDS = {  # e.g. llama-4-scout: OpenAI-like calls, arguments still an object
    "response": None,
    "tool_calls": [
        {
            "id": "chatcmpl-tool-1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
        }
    ],
}
OPENAI_COMPATIBLE = {  # e.g. qwen3, gpt-oss: a chat.completion object
    "id": "id-1",
    "object": "chat.completion",
    "created": 1,
    "model": "@cf/qwen/qwen3-30b-a3b-fp8",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Need the weather.",
                "tool_calls": [
                    {
                        "id": "chatcmpl-tool-9",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 50, "completion_tokens": 8, "total_tokens": 58},
}


def test_traditional_shape() -> None:
    assert parse_result(TRADITIONAL) == LLMResponse(
        "",
        [
            ToolCall("", "get_weather", {"city": "Paris"}),
            ToolCall("", "get_weather", {"city": "Rome"}),
        ],
        Usage(120, 30),
    )


def test_tool_calls_with_ids_and_function_objects() -> None:
    reply = parse_result(WITH_IDS)
    assert reply == LLMResponse("", [ToolCall("chatcmpl-tool-1", "get_weather", {"city": "Paris"})])


def test_openai_compatible_shape() -> None:
    reply = parse_result(OPENAI_COMPATIBLE)
    assert reply == LLMResponse(
        "", [ToolCall("chatcmpl-tool-9", "get_weather", {"city": "Oslo"})], Usage(50, 8)
    )


def test_text_replies_in_every_form() -> None:
    assert parse_result({"response": "Sunny."}) == LLMResponse("Sunny.")
    assert parse_result("plain string") == LLMResponse("plain string")
    assert parse_result(JsLike({"response": "from JS", "tool_calls": []})).text == "from JS"
    assert parse_result({"response": {"city": "Paris"}}).text == '{"city": "Paris"}'


def test_string_arguments_and_broken_arguments() -> None:
    reply = parse_result(
        {
            "response": "",
            "tool_calls": [
                {"name": "get_weather", "arguments": '{"city": "Lima"}'},
                {"name": "get_weather", "arguments": '{"city": '},
            ],
        }
    )
    good, broken = reply.tool_calls
    assert good == ToolCall("", "get_weather", {"city": "Lima"})
    assert isinstance(broken, MalformedToolCall)
    assert broken.arguments == {}


@pytest.mark.parametrize("result", [None, 42, {"request_id": "async-1"}, ["a"]])
def test_unusable_results_are_response_errors(result: Any) -> None:
    with pytest.raises(LLMResponseError, match="text-generation"):
        parse_result(result)


@pytest.mark.parametrize("name", list(conversations()))
async def test_inputs_for_every_conversation_shape(name: str) -> None:
    messages, tools = conversations()[name]
    ai = FakeAI({"response": "ok"})
    assert (await WorkersAILLM(ai, MODEL).chat(messages, tools)).text == "ok"
    ((model, inputs),) = ai.calls
    assert model == MODEL
    json.dumps(inputs)  # plain data the binding can convert
    assert set(inputs) <= {"messages", "tools"}
    for entry in inputs["messages"]:
        assert entry["role"] in ("system", "user", "assistant", "tool")
        assert isinstance(entry["content"], str)  # the models' schemas want a string
    if tools:
        assert [t["function"]["name"] for t in inputs["tools"]] == [t.name for t in tools]


async def test_history_inputs_carry_call_ids_and_tool_names() -> None:
    ai = FakeAI({"response": "ok"})
    messages = [
        Message.system("sys"),
        Message.user("post it"),
        Message.assistant("", [POST]),
        Message.tool_result(POST, ERROR_CONTENT),
    ]
    await WorkersAILLM(ai, MODEL, max_tokens=512).chat(messages, TOOLS)
    inputs = ai.calls[0][1]
    assert inputs["max_tokens"] == 512
    assert inputs["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "post it"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_3",
                    "type": "function",
                    "function": {"name": "post_slack", "arguments": json.dumps(POST.arguments)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_3", "content": ERROR_CONTENT, "name": "post_slack"},
    ]
    assert inputs["tools"][1] == {
        "type": "function",
        "function": {
            "name": "post_slack",
            "description": "Post a message to a Slack channel.",
            "parameters": TOOLS[1].input_schema,
        },
    }


async def test_convert_input_and_js_results() -> None:
    ai = FakeAI(JsLike(TRADITIONAL))
    llm = WorkersAILLM(ai, MODEL, convert_input=lambda inputs: {"converted": inputs})
    reply = await llm.chat([Message.user("hi")], TOOLS)
    assert len(reply.tool_calls) == 2
    assert set(ai.calls[0][1]) == {"converted"}


async def test_out_of_capacity_is_retried_then_succeeds() -> None:
    ai = FakeAI(
        RuntimeError("AiError: 3040: Capacity temporarily exceeded, please try again."),
        RuntimeError("InferenceUpstreamError: internal server error"),
        {"response": "finally"},
    )
    llm = WorkersAILLM(ai, MODEL, retry=fast_retry())
    assert (await llm.chat([Message.user("hi")], [])).text == "finally"
    assert len(ai.calls) == 3


@pytest.mark.parametrize(
    ("message", "error_class", "hint"),
    [
        ("AiError: 5007: No such model @cf/nope or task", LLMModelNotFoundError, "LLM_MODEL"),
        ("3042: The model name is invalid", LLMModelNotFoundError, "LLM_MODEL"),
        ("5016: User has not agreed to Llama3.2 model terms", LLMAuthenticationError, "terms"),
        ("AiError: 3006: Request is too large", LLMContextLengthError, "too long"),
        ("3036: You have used up your daily free allocation", LLMRateLimitError, "daily"),
        ("TypeError: inputs.messages is not iterable", LLMError, "function calling"),
    ],
)
async def test_lasting_failures_fail_at_once(
    message: str, error_class: type[LLMError], hint: str
) -> None:
    ai = FakeAI(RuntimeError(message), {"response": "never"})
    llm = WorkersAILLM(ai, MODEL, retry=fast_retry())
    with pytest.raises(error_class, match=hint) as caught:
        await llm.chat([Message.user("hi")], [])
    assert type(caught.value) is error_class
    assert caught.value.retryable is False
    assert caught.value.provider == "workers-ai"
    assert len(ai.calls) == 1


async def test_a_slow_binding_times_out_and_is_retried() -> None:
    slow = FakeAI({"response": "late"}, {"response": "late"}, delay=1.0)
    llm = WorkersAILLM(slow, MODEL, timeout=0.05, retry=fast_retry(max_attempts=2))
    with pytest.raises(LLMTimeoutError) as caught:
        await llm.chat([Message.user("hi")], [])
    assert caught.value.attempts == 2


async def test_crashes_are_not_wrapped() -> None:
    class Crash(BaseException):
        pass

    llm = WorkersAILLM(FakeAI(Crash()), MODEL, retry=fast_retry())
    with pytest.raises(Crash):
        await llm.chat([Message.user("hi")], [])


def test_construction_needs_the_binding() -> None:
    with pytest.raises(ConfigurationError, match=r"wrangler\.toml"):
        WorkersAILLM(None, MODEL)
    with pytest.raises(ConfigurationError, match="binding"):
        WorkersAILLM(object(), MODEL)
    assert WorkersAILLM(FakeAI()).model == DEFAULT_WORKERS_AI_MODEL
    assert repr(WorkersAILLM(FakeAI(), MODEL)) == f"WorkersAILLM(model={MODEL!r})"


async def test_a_binding_that_never_answers_is_bounded_by_the_deadline() -> None:
    # No per-attempt timeout (the default): the retry deadline still ends the wait,
    # so a hung call cannot hold a session's turn forever.
    llm = WorkersAILLM(FakeAI({"response": "late"}, delay=30), MODEL,
                       retry=RetryPolicy(max_attempts=1, deadline=0.2))  # fmt: skip
    started = asyncio.get_running_loop().time()
    with pytest.raises(LLMTimeoutError):
        await llm.chat([Message.user("hi")], [])
    assert asyncio.get_running_loop().time() - started < 5
