"""Whatever the model sends, the session stays usable and its history strict JSON.

A hostile (or merely odd) model, scripted: call ids no URL carries, NaN and
Infinity in arguments, lone surrogates in its text and arguments, usage counts
no store binds, a reply larger than a stored message may be. Each leaves a
session that takes its next message, a history a strict JSON parser reads, the
user's message kept, and no exception out of `run()`. On the SQLite store (a
real file); the same cases over HTTP against `scripts/dev` are in
tests/cloudflare/test_dev_server_model_hostile.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from durable_agents import (
    Agent,
    LLMResponse,
    Message,
    ToolCall,
    ToolContext,
    Usage,
    _json,
    approve,
    pending_approvals,
    run,
    tool,
)
from durable_agents.limits import MAX_ROW_BYTES
from durable_agents.llm.anthropic import build_request
from durable_agents.llm.openai import parse_response, to_openai_messages
from durable_agents.messages import CALL_ID, MAX_CALL_TOKENS, MalformedToolCall, tool_error
from durable_agents.stores import Store, sqlite_store
from durable_agents.testing import ScriptedLLM

SESSION = "s"
ODD_IDS = ["a/b", "a b", "café", "x" * 300, "..", ".", "%41", "a\nb", "lone \ud800"]


class Post(BaseModel):
    text: str


def strict(value: Any) -> Any:
    """`value` through a strict JSON parser, as `JSON.parse` would read it."""

    def refuse(name: str) -> None:
        raise ValueError(f"{name} in stored JSON")

    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    text.encode("utf-8")  # no lone surrogates
    return json.loads(text, parse_constant=refuse)


class World:
    """An agent with a side-effecting `post` and an approval-gated `refund`; what ran."""

    def __init__(self, tmp_path: Path) -> None:
        self.posts: list[tuple[str, Any]] = []
        self.refunds: list[str] = []
        self.store: Store = sqlite_store(tmp_path / "sessions.db")

        async def post(args: Post, ctx: ToolContext) -> dict[str, Any]:
            self.posts.append((ctx.tool_call_id, args.text))
            return {"ok": True}

        async def refund(args: Post, ctx: ToolContext) -> str:
            self.refunds.append(ctx.tool_call_id)
            return "refunded"

        self.agent = Agent(
            "hostile",
            "test",
            tools=[
                tool(post, input=Post),
                tool(refund, input=Post, requires_approval=True),
            ],
        )

    async def turn(self, llm: ScriptedLLM, message: str | None = "go") -> Any:
        return await run(self.agent, llm=llm, message=message, session_id=SESSION, store=self.store)

    async def history(self) -> list[dict[str, Any]]:
        return [strict(m.to_dict()) for m in await self.store.load_messages(SESSION)]


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def calls_of(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for m in history for c in m.get("tool_calls", [])]


async def test_odd_call_ids_get_ids_of_the_kit_and_go_back_to_the_provider(world: World) -> None:
    calls = [ToolCall(call_id, "post", {"text": str(i)}) for i, call_id in enumerate(ODD_IDS)]
    llm = ScriptedLLM([LLMResponse(tool_calls=calls), LLMResponse(text="posted")])
    result = await world.turn(llm)
    assert result.status == "complete"
    stored = calls_of(await world.history())
    assert all(CALL_ID.fullmatch(c["id"]) for c in stored)
    assert [c.get("provider_id") for c in stored] == [
        i.replace("\ud800", "\ufffd") for i in ODD_IDS
    ]
    assert len(world.posts) == len(ODD_IDS)  # each ran once, under the kit's id
    # The next LLM call gives the provider back its own ids, calls and results alike.
    sent = to_openai_messages(llm.calls[1].messages)
    assert [c["id"] for c in sent[2]["tool_calls"]] == [c["provider_id"] for c in stored]
    assert [m["tool_call_id"] for m in sent[3:]] == [c["provider_id"] for c in stored]
    anthropic = build_request("m", llm.calls[1].messages, [], max_tokens=10)["messages"]
    assert [b["tool_use_id"] for b in anthropic[2]["content"]] == [c["provider_id"] for c in stored]


async def test_a_repeated_odd_id_is_a_duplicate_and_never_goes_back_twice(world: World) -> None:
    first = [ToolCall("a/b", "post", {"text": "1"}), ToolCall("a/b", "post", {"text": "2"})]
    llm = ScriptedLLM(
        [LLMResponse(tool_calls=first),
         LLMResponse(tool_calls=[ToolCall("a/b", "post", {"text": "3"})]),
         LLMResponse(text="ok")]
    )  # fmt: skip
    await world.turn(llm)
    stored = calls_of(await world.history())
    assert [c.get("provider_id") for c in stored] == ["a/b", None, None]
    assert len({c["id"] for c in stored}) == 3
    sent = to_openai_messages(llm.calls[2].messages)
    wire = [c["id"] for m in sent if m["role"] == "assistant" for c in m["tool_calls"]]
    assert wire[0] == "a/b"
    assert len(set(wire)) == 3


async def test_a_plain_provider_id_is_kept_as_it_is(world: World) -> None:
    llm = ScriptedLLM(
        [LLMResponse(tool_calls=[ToolCall("call_Ab9:x~1.2-3", "post", {"text": "a"})]),
         LLMResponse(text="ok")]
    )  # fmt: skip
    await world.turn(llm)
    (call,) = calls_of(await world.history())
    assert call["id"] == "call_Ab9:x~1.2-3"
    assert "provider_id" not in call


async def test_an_approval_of_an_odd_id_is_decided_by_the_listed_id(world: World) -> None:
    llm = ScriptedLLM(
        [LLMResponse(tool_calls=[ToolCall("a/b", "refund", {"text": "order 7"})]),
         LLMResponse(text="refunded")]
    )  # fmt: skip
    first = await world.turn(llm)
    assert first.status == "awaiting_approval"
    (waiting,) = await pending_approvals(world.store, SESSION)
    assert CALL_ID.fullmatch(waiting.tool_call_id)
    assert waiting.tool_call_id == first.pending[0].tool_call_id
    await approve(world.store, SESSION, waiting.tool_call_id, digest=waiting.digest, approved=True)
    done = await world.turn(llm, message=None)
    assert done.status == "complete"
    assert world.refunds == [waiting.tool_call_id]
    sent = to_openai_messages(llm.calls[1].messages)
    assert sent[-1]["tool_call_id"] == "a/b"


@pytest.mark.parametrize(
    "raw",
    ['{"text": "a", "extra": NaN}', '{"text": Infinity}', '{"text": "a", "n": -Infinity}',
     '{"text": "a", "n": 1e400}'],
)  # fmt: skip
async def test_non_finite_numbers_from_the_wire_are_invalid_arguments(
    world: World, raw: str
) -> None:
    data = {"choices": [{"message": {"tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "post", "arguments": raw}}
    ]}}]}  # fmt: skip
    response = parse_response(data)
    (call,) = response.tool_calls
    assert isinstance(call, MalformedToolCall)
    result = await world.turn(ScriptedLLM([response, LLMResponse(text="sorry")]))
    assert result.status == "complete"
    assert world.posts == []
    history = await world.history()
    assert tool_error(history[2]["content"])["kind"] == "invalid-arguments"  # type: ignore[index]
    assert (await world.turn(ScriptedLLM([LLMResponse(text="next")]), "again")).status == "complete"


@pytest.mark.parametrize("tool_name", ["post", "refund"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
async def test_non_finite_numbers_built_in_python_are_invalid_arguments(
    world: World, tool_name: str, value: float
) -> None:
    calls = [ToolCall("c1", tool_name, {"text": "a", "n": value})]
    result = await world.turn(ScriptedLLM([LLMResponse(tool_calls=calls), LLMResponse(text="ok")]))
    assert result.status == "complete"  # a gated tool's call is answered, never awaits approval
    assert world.posts == []
    assert world.refunds == []
    history = await world.history()
    error = tool_error(history[2]["content"])
    assert error is not None
    assert error["kind"] == "invalid-arguments"
    assert "finite numbers" in error["error"]


async def test_lone_surrogates_from_the_model_are_repaired(world: World) -> None:
    calls = [ToolCall("c1", "post", {"text": "lone \ud800 here", "k\udfff": 1})]
    llm = ScriptedLLM(
        [LLMResponse(text="thinking \udc00", tool_calls=calls),
         LLMResponse(text="done \ud800 now")]
    )  # fmt: skip
    result = await world.turn(llm, message="hi \udbff")
    assert result.status == "complete"
    assert result.response == "done \ufffd now"
    assert world.posts == [("c1", "lone \ufffd here")]
    history = await world.history()
    assert history[0]["content"] == "hi \ufffd"
    assert history[1]["content"] == "thinking \ufffd"
    assert history[1]["tool_calls"][0]["arguments"] == {"text": "lone \ufffd here", "k\ufffd": 1}


async def test_lone_surrogates_in_json_text_are_repaired_and_pairs_kept() -> None:
    text = '{"a": "lone \\ud800 here", "b": "\\ud83d\\ude00", "c": "\\udc00\\ud800"}'
    assert _json.loads(text) == {"a": "lone \ufffd here", "b": "\U0001f600", "c": "\ufffd\ufffd"}
    data = {"choices": [{"message": {"content": "x \\ud800"}}]}
    assert parse_response(_json.loads(json.dumps(data).replace("\\\\", "\\"))).text == "x \ufffd"


async def test_a_handler_result_with_nan_or_a_lone_surrogate_is_stored_strict(
    world: World,
) -> None:
    results: list[Any] = [{"score": math.nan}, "lone \ud800 text", {"k": ["\udc00"]}]

    async def answer(args: Post, ctx: ToolContext) -> Any:
        return results[int(args.text)]

    agent = Agent("h", "t", tools=[tool(answer, input=Post)])
    calls = [ToolCall(f"c{i}", "answer", {"text": str(i)}) for i in range(3)]
    llm = ScriptedLLM([LLMResponse(tool_calls=calls), LLMResponse(text="ok")])
    result = await run(agent, llm=llm, message="go", session_id=SESSION, store=world.store)
    assert result.status == "complete"
    history = await world.history()
    nan_result = tool_error(history[2]["content"])
    assert nan_result is not None
    assert nan_result["kind"] == "invalid-output"
    assert "NaN" in nan_result["error"]
    assert history[3]["content"] == "lone \ufffd text"
    assert json.loads(history[4]["content"]) == {"k": ["\ufffd"]}


@pytest.mark.parametrize(
    ("usage", "stored"),
    [(Usage(10**30, -5), Usage(MAX_CALL_TOKENS, 0)), (Usage(7, 9), Usage(7, 9))],
)
async def test_usage_counts_are_bounded_before_they_are_stored(
    world: World, usage: Usage, stored: Usage
) -> None:
    result = await world.turn(ScriptedLLM([LLMResponse(text="hi", usage=usage)]))
    assert result.status == "complete"
    assert (await world.store.load_messages(SESSION))[-1].usage == stored
    assert (await world.turn(ScriptedLLM([LLMResponse(text="again")]), "more")).status == "complete"


@pytest.mark.parametrize("where", ["text", "arguments"])
async def test_a_reply_the_store_cannot_hold_ends_the_turn_and_keeps_the_message(
    world: World, where: str
) -> None:
    huge = "y" * (MAX_ROW_BYTES + 1)
    reply = (
        LLMResponse(text=huge)
        if where == "text"
        else LLMResponse(tool_calls=[ToolCall("c1", "post", {"text": huge})])
    )
    result = await world.turn(ScriptedLLM([reply]), message="hello")
    assert result.status == "error"
    assert result.error_code == "llm-response-too-large"
    assert result.error is not None
    assert "was not kept" in result.error
    assert world.posts == []
    assert [m["content"] for m in await world.history()] == ["hello"]
    resumed = await world.turn(ScriptedLLM([LLMResponse(text="short now")]), message=None)
    assert resumed.status == "complete"
    assert [m["role"] for m in await world.history()] == ["user", "assistant"]


async def test_a_huge_reply_on_a_later_step_keeps_every_earlier_write(world: World) -> None:
    calls = [ToolCall("c1", "post", {"text": "a"})]
    llm = ScriptedLLM([LLMResponse(tool_calls=calls), LLMResponse(text="z" * (MAX_ROW_BYTES + 1))])
    result = await world.turn(llm)
    assert result.error_code == "llm-response-too-large"
    assert [m["role"] for m in await world.history()] == ["user", "assistant", "tool"]
    nxt = await world.turn(ScriptedLLM([LLMResponse(text="ok")]), "next")
    assert nxt.status == "complete"
    assert world.posts == [("c1", "a")]


def test_a_message_repairs_its_content() -> None:
    assert Message.user("a\ud800").content == "a\ufffd"
    assert Message.user("\ud83d\ude00").content == "\U0001f600"
    text = "plain"
    assert Message.user(text).content is text


async def test_a_surrogate_pair_split_between_streamed_chunks_is_kept_whole() -> None:
    from durable_agents._http.sse import SSEEvent
    from durable_agents.llm.openai import parse_stream
    from durable_agents.messages import TextDelta

    def chunk(delta: dict[str, Any], finish: str | None = None) -> SSEEvent:
        data = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return SSEEvent("message", json.dumps(data).replace("\\\\u", "\\u"))

    async def events() -> Any:
        yield chunk({"content": "smile \\ud83d"})
        yield chunk({"content": "\\ude00 and a lone \\udc00"}, "stop")
        yield SSEEvent("message", "[DONE]")

    parts = [part async for part in parse_stream(events())]
    deltas = [p.text for p in parts if isinstance(p, TextDelta)]
    assert deltas == ["smile \ufffd", "\ufffd and a lone \ufffd"]  # previews, each valid
    reply = parts[-1]
    assert isinstance(reply, LLMResponse)
    assert reply.text == "smile \U0001f600 and a lone \ufffd"
