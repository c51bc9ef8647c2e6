"""Whole agent runs through each real adapter: a local server (or a fake `env.AI`) plays
the provider, answering with tool calls and then a final text."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from tests.support.llm_support import Reply, ScriptedServer, fast_retry, validate_request

from durable_agents import Agent, Message, ToolContext, Usage, run, tool
from durable_agents.llm import AnthropicLLM, OpenAILLM, WorkersAILLM
from durable_agents.stores import Store, sqlite_store

KEY = "sk-test-0123456789"


class City(BaseModel):
    city: str


class SlackPost(BaseModel):
    channel: str
    text: str


class Ping(BaseModel):
    note: str = ""


class Effects:
    """Side effects by tool, so tests assert counts, not only transcripts."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    def count(self, name: str) -> int:
        return sum(1 for tool_name, _, _ in self.calls if tool_name == name)


def weather_agent(effects: Effects) -> Agent:
    @tool(safe_to_retry=True)
    async def get_weather(args: City, ctx: ToolContext) -> dict[str, Any]:
        """Current weather for a city."""
        effects.calls.append(("get_weather", ctx.tool_call_id, args.model_dump()))
        return {"city": args.city, "temp_c": {"Paris": 21, "Rome": 25}.get(args.city, 10)}

    @tool
    async def post_slack(args: SlackPost, ctx: ToolContext) -> dict[str, str]:
        """Post a message to a Slack channel."""
        effects.calls.append(("post_slack", ctx.tool_call_id, args.model_dump()))
        return {"ts": "1700000000.1"}

    @tool
    async def ping(args: Ping, ctx: ToolContext) -> str:
        """Ping the on-call engineer (a side effect; no argument is required)."""
        effects.calls.append(("ping", ctx.tool_call_id, args.model_dump()))
        return "pinged"

    return Agent("weather", "You report the weather.", [get_weather, post_slack, ping])


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    durable = sqlite_store(tmp_path / "agent.db")
    yield durable
    await durable.close()


@pytest.fixture
def serve() -> Iterator[Callable[[list[Reply]], ScriptedServer]]:
    servers: list[ScriptedServer] = []

    def start(replies: list[Reply]) -> ScriptedServer:
        servers.append(ScriptedServer(replies).__enter__())
        return servers[-1]

    yield start
    for server in servers:
        server.__exit__(None, None, None)


def ids() -> Callable[[], str]:
    counter = itertools.count(1)
    return lambda: f"gen{next(counter)}"


# ---------------------------------------------------------------- provider scripts


def anthropic_reply(*blocks: dict[str, Any], stop: str = "end_turn", usage: int = 10) -> Reply:
    return Reply(
        {
            "id": "msg",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": list(blocks),
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": usage, "output_tokens": 2},
        }
    )


def tool_use(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def openai_reply(content: str | None, *calls: dict[str, Any], usage: int = 10) -> Reply:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    return Reply(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 1,
            "model": "gpt-4.1-mini",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": usage, "completion_tokens": 2, "total_tokens": usage + 2},
        }
    )


def function_call(call_id: str | None, name: str, arguments: str) -> dict[str, Any]:
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call_id is not None:
        call["id"] = call_id
    return call


# ---------------------------------------------------------------- Anthropic


async def test_anthropic_full_run_with_parallel_calls_and_a_retry(
    serve: Callable[[list[Reply]], ScriptedServer], store: Store
) -> None:
    server = serve(
        [
            anthropic_reply(
                text("Checking both."),
                tool_use("toolu_1", "get_weather", city="Paris"),
                tool_use("toolu_2", "get_weather", city="Rome"),
                stop="tool_use",
            ),
            Reply({"type": "error", "error": {"type": "overloaded_error"}}, status=529),
            anthropic_reply(
                tool_use("toolu_3", "post_slack", channel="#ops", text="Paris 21 C"),
                stop="tool_use",
                usage=20,
            ),
            anthropic_reply(text("Paris 21 C, Rome 25 C. Posted to #ops."), usage=30),
        ]
    )
    effects = Effects()
    llm = AnthropicLLM("claude-sonnet-4-5", KEY, base_url=server.url, retry=fast_retry())
    result = await run(
        weather_agent(effects), llm=llm, message="Weather?", session_id="s1", store=store
    )
    await llm.aclose()

    assert result.status == "complete", result.error
    assert result.response == "Paris 21 C, Rome 25 C. Posted to #ops."
    assert (effects.count("get_weather"), effects.count("post_slack")) == (2, 1)
    assert result.usage == Usage(60, 6)
    assert [r.path for r in server.requests] == ["/v1/messages"] * 4
    for request in server.requests:
        validate_request("anthropic", request.body)
    # the step after the parallel calls sends both results, in call order, in one user turn
    turns = server.requests[1].body["messages"]
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    assert [
        (b["tool_use_id"], json.loads(b["content"])["temp_c"]) for b in turns[2]["content"]
    ] == [
        ("toolu_1", 21),
        ("toolu_2", 25),
    ]
    assert server.requests[1].body == server.requests[2].body  # the retry resent the same call
    assert [m.role for m in await store.load_messages("s1")] == [
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]


async def test_anthropic_next_turn_resends_the_whole_history(
    serve: Callable[[list[Reply]], ScriptedServer], store: Store
) -> None:
    server = serve(
        [
            anthropic_reply(tool_use("toolu_1", "get_weather", city="Oslo"), stop="tool_use"),
            anthropic_reply(text("Oslo is 10 C.")),
            anthropic_reply(text("You are welcome.")),
        ]
    )
    effects = Effects()
    agent = weather_agent(effects)
    async with AnthropicLLM("claude-sonnet-4-5", KEY, base_url=server.url) as llm:
        await run(agent, llm=llm, message="Oslo?", session_id="s2", store=store)
        second = await run(agent, llm=llm, message="Thanks!", session_id="s2", store=store)
    assert second.response == "You are welcome."
    last = server.requests[-1].body
    validate_request("anthropic", last)
    assert last["system"] == "You report the weather."
    assert [t["role"] for t in last["messages"]] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert last["messages"][3]["content"] == [text("Oslo is 10 C.")]
    assert last["messages"][4]["content"] == [text("Thanks!")]
    assert effects.count("get_weather") == 1


# ---------------------------------------------------------------- OpenAI-compatible


async def test_openai_full_run_with_parallel_calls_missing_ids_and_a_dropped_connection(
    serve: Callable[[list[Reply]], ScriptedServer], store: Store
) -> None:
    server = serve(
        [
            openai_reply(
                None,
                function_call(None, "get_weather", '{"city": "Paris"}'),
                function_call(None, "get_weather", '{"city": "Rome"}'),
            ),
            Reply(drop=True),
            openai_reply(
                "Posting.",
                function_call("call_p", "post_slack", '{"channel": "#ops", "text": "hi"}'),
                usage=20,
            ),
            openai_reply("Done.", usage=30),
        ]
    )
    effects = Effects()
    llm = OpenAILLM("gpt-4.1-mini", KEY, base_url=server.url + "/v1", retry=fast_retry())
    result = await run(
        weather_agent(effects),
        llm=llm,
        message="Weather?",
        session_id="s1",
        store=store,
        new_id=ids(),
    )
    await llm.aclose()

    assert result.status == "complete", result.error
    assert result.response == "Done."
    assert (effects.count("get_weather"), effects.count("post_slack")) == (2, 1)
    assert result.usage == Usage(60, 6)
    for request in server.requests:
        assert request.path == "/v1/chat/completions"
        assert request.headers["authorization"] == f"Bearer {KEY}"
        validate_request("openai", request.body)
    # the ids the run loop assigned go out on the calls and come back on the results
    sent = server.requests[1].body["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "tool"]
    call_ids = [c["id"] for c in sent[2]["tool_calls"]]
    assert call_ids == ["call_gen1", "call_gen2"]
    assert [m["tool_call_id"] for m in sent[3:]] == call_ids
    assert [json.loads(m["content"])["city"] for m in sent[3:]] == ["Paris", "Rome"]
    assert server.requests[1].body == server.requests[2].body


async def test_malformed_arguments_do_not_crash_and_the_model_is_told(
    serve: Callable[[list[Reply]], ScriptedServer],
) -> None:
    server = serve(
        [
            openai_reply(None, function_call("call_1", "post_slack", '{"channel": "#ops", "te')),
            openai_reply("Sorry, retrying was not possible."),
        ]
    )
    effects = Effects()
    async with OpenAILLM("m", base_url=server.url, retry=fast_retry()) as llm:
        result = await run(weather_agent(effects), llm=llm, message="post")
    assert result.status == "complete"
    assert effects.count("post_slack") == 0
    tool_message = server.requests[1].body["messages"][-1]
    assert tool_message["role"] == "tool"
    assert tool_message["tool_call_id"] == "call_1"
    assert "error" in json.loads(tool_message["content"])


async def test_malformed_arguments_never_run_a_tool_without_required_arguments(
    serve: Callable[[list[Reply]], ScriptedServer],
) -> None:
    server = serve(
        [
            openai_reply(None, function_call("call_1", "ping", "{not json")),
            openai_reply("ok"),
        ]
    )
    effects = Effects()
    async with OpenAILLM("m", base_url=server.url, retry=fast_retry()) as llm:
        await run(weather_agent(effects), llm=llm, message="ping")
    assert effects.count("ping") == 0
    content = json.loads(server.requests[1].body["messages"][-1]["content"])
    assert "not valid JSON" in content["error"]


# ---------------------------------------------------------------- Workers AI binding


class FakeAI:
    def __init__(self, *results: Any) -> None:
        self.results = list(results)
        self.inputs: list[Any] = []

    async def run(self, model: str, inputs: Any) -> Any:
        self.inputs.append(json.loads(json.dumps(inputs)))
        result = self.results.pop(0)
        if isinstance(result, BaseException):
            raise result
        return result


async def test_workers_ai_full_run_through_the_binding(store: Store) -> None:
    ai = FakeAI(
        {
            "response": "",
            "tool_calls": [
                {"name": "get_weather", "arguments": {"city": "Paris"}},
                {"name": "get_weather", "arguments": {"city": "Rome"}},
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 2},
        },
        RuntimeError("3040: Capacity temporarily exceeded"),
        {
            "choices": [
                {
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            function_call(
                                "chatcmpl-tool-1", "post_slack", '{"channel":"#ops","text":"x"}'
                            )
                        ],
                    }
                }
            ],
        },
        {"response": "Posted.", "usage": {"prompt_tokens": 30, "completion_tokens": 4}},
    )
    effects = Effects()
    llm = WorkersAILLM(ai, "@cf/meta/llama-3.3-70b-instruct-fp8-fast", retry=fast_retry())
    result = await run(
        weather_agent(effects),
        llm=llm,
        message="Weather?",
        session_id="w1",
        store=store,
        new_id=ids(),
    )
    assert result.status == "complete", result.error
    assert result.response == "Posted."
    assert (effects.count("get_weather"), effects.count("post_slack")) == (2, 1)
    assert result.usage == Usage(40, 6)
    after_calls = ai.inputs[1]["messages"]
    assert [m["role"] for m in after_calls] == ["system", "user", "assistant", "tool", "tool"]
    assert [m["tool_call_id"] for m in after_calls[3:]] == ["call_gen1", "call_gen2"]
    assert [m["name"] for m in after_calls[3:]] == ["get_weather", "get_weather"]
    assert ai.inputs[1] == ai.inputs[2]
    history = await store.load_messages("w1")
    assert history[-1] == Message.assistant("Posted.", usage=Usage(30, 4))
