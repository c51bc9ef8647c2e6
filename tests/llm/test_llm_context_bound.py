"""`max_context_tokens` bounds what is sent (issue 30): with `max_context_tokens=N`, no
request the kit sends is over 4N bytes (4 bytes a token, counted on the serialized
body), measured on what a fake provider on 127.0.0.1 receives, through each HTTP
adapter, at a small budget and the default. Tool-heavy turns (steps of 100 calls,
provider-style ids, JSON results) are what the old estimate (names and arguments only)
undercounted. The running turn is sent whole: the bound holds for every request whose
running turn fits the budget (with the instructions, the tool specs and the summary);
one larger is sent with the summary and nothing older.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from tests.support.llm_support import Reply, ScriptedServer, conversations, fast_retry

from durable_agents import Agent, Message, ToolCall, ToolContext, run, tool
from durable_agents.context import DEFAULT_MAX_CONTEXT_TOKENS
from durable_agents.llm import AnthropicLLM, OpenAILLM, WorkersAILLM
from durable_agents.stores import Store, sqlite_store
from durable_agents.testing.check_agent._check_history import assert_well_formed

KEY = "sk-test-0123456789"
BYTES_PER_TOKEN = 4  # the kit's rule: max_context_tokens=N bounds a request at 4N bytes
CALLS = 100  # calls per step
INSTRUCTIONS = "Look every item up with the lookup tool, then say what you found."
SESSION = "bound"


class Query(BaseModel):
    query: str


@tool(safe_to_retry=True)
async def lookup(args: Query, ctx: ToolContext) -> dict[str, Any]:
    """Look an item up in the catalogue."""
    return {"query": args.query, "found": True}


# ---------------------------------------------------------------- the model


class Model:
    """Plays the model from what it is sent: a turn is `steps` steps of CALLS calls, then
    a text reply; a request without tools (the kit's summarizer) gets a short summary.
    Call ids are the provider's style, 29 characters."""

    prefix = "call_"

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.ids = 0

    def reply(self, turn: int, steps_done: int) -> tuple[str, list[ToolCall]]:
        if steps_done >= self.steps:
            return f"Turn {turn}: all {self.steps * CALLS} items found.", []
        calls = []
        for item in range(CALLS):
            self.ids += 1
            calls.append(
                ToolCall(
                    f"{self.prefix}{self.ids:08d}{'x' * 16}",
                    "lookup",
                    {"query": f't{turn} s{steps_done} i{item} "q"'},
                )
            )
        return "", calls


def turn_number(user_text: str) -> int:
    match = re.match(r"turn (\d+)", user_text)
    assert match, user_text
    return int(match.group(1))


class OpenAIModel(Model):
    prefix = "call_"

    def __call__(self, body: Any) -> Reply:
        if "tools" not in body:
            return self.openai("Summary: items looked up so far.", [])
        messages = body["messages"]
        last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        steps = sum(m["role"] == "assistant" for m in messages[last_user:])
        text, calls = self.reply(turn_number(messages[last_user]["content"]), steps)
        return self.openai(text, calls)

    def openai(self, text: str, calls: list[ToolCall]) -> Reply:
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                }
                for c in calls
            ]
        return Reply(
            {
                "id": "c",
                "object": "chat.completion",
                "created": 1,
                "model": "m",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
            }
        )


class AnthropicModel(Model):
    prefix = "toolu_01"

    def __call__(self, body: Any) -> Reply:
        if "tools" not in body:
            return self.anthropic("Summary: items looked up so far.", [])
        turns = body["messages"]
        # the user's text blocks (a turn's message may share a user turn with results)
        texts = [
            (i, b["text"])
            for i, t in enumerate(turns)
            if t["role"] == "user"
            for b in t["content"]
            if b["type"] == "text"
        ]
        start, last = texts[-1]
        steps = sum(t["role"] == "assistant" for t in turns[start:])
        text, calls = self.reply(turn_number(last), steps)
        return self.anthropic(text, calls)

    def anthropic(self, text: str, calls: list[ToolCall]) -> Reply:
        blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
        blocks += [
            {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in calls
        ]
        return Reply(
            {
                "id": "msg",
                "type": "message",
                "role": "assistant",
                "model": "m",
                "content": blocks,
                "stop_reason": "tool_use" if calls else "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": 10, "output_tokens": 2},
            }
        )


def serve(provider: str, steps: int) -> tuple[ScriptedServer, Any]:
    model = OpenAIModel(steps) if provider == "openai" else AnthropicModel(steps)
    server = ScriptedServer([], answer=model).__enter__()
    if provider == "openai":
        llm: Any = OpenAILLM("gpt-4.1-mini", KEY, base_url=server.url, retry=fast_retry())
    else:
        llm = AnthropicLLM("claude-sonnet-4-5", KEY, base_url=server.url, retry=fast_retry())
    return server, llm


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    durable = sqlite_store(tmp_path / "agent.db")
    yield durable
    await durable.close()


@pytest.fixture
def servers() -> Iterator[list[ScriptedServer]]:
    started: list[ScriptedServer] = []
    yield started
    for server in started:
        server.__exit__(None, None, None)


async def turns(store: Store, llm: Any, budget: int, count: int, first: int = 0) -> list[Any]:
    agent = Agent("bound", INSTRUCTIONS, [lookup], max_context_tokens=budget)
    results = []
    for n in range(first, first + count):
        result = await run(
            agent, llm=llm, message=f"turn {n}: look up the next items", session_id=SESSION,
            store=store,
        )  # fmt: skip
        assert result.status == "complete", result.error
        results.append(result)
    return results


# ---------------------------------------------------------------- the bound


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize(
    ("budget", "steps", "count"),
    [(8_000, 1, 8), (DEFAULT_MAX_CONTEXT_TOKENS, 2, 9)],
    ids=["8000", "default"],
)
async def test_no_request_is_over_the_budget(
    provider: str, budget: int, steps: int, count: int, store: Store,
    servers: list[ScriptedServer],
) -> None:  # fmt: skip
    server, llm = serve(provider, steps)
    servers.append(server)
    await turns(store, llm, budget, count)
    await llm.aclose()
    sizes = [r.size for r in server.requests]
    summarizer = [r.size for r in server.requests if "tools" not in r.body]
    limit = BYTES_PER_TOKEN * budget
    assert max(sizes) <= limit, (max(sizes), limit, sorted(sizes)[-5:])
    assert summarizer, "the session never compacted: make it longer"
    assert max(sizes) > limit * 3 // 4, "the session never came near its budget"
    history = await store.load_messages(SESSION)
    # every call answered, every turn stored: compaction lost nothing
    assert sum(m.role == "tool" for m in history) == count * steps * CALLS
    assert_summaries_cut_where_turns_begin(history, count)


def assert_summaries_cut_where_turns_begin(history: list[Message], count: int) -> None:
    """Well formed, and every summary stands for the messages before a turn's start (its
    `summary_of` is a user message), stored after that message."""
    assert_well_formed(history, [f"turn {n}: look up the next items" for n in range(count)])
    summaries = [(i, m.summary_of) for i, m in enumerate(history) if m.summary_of is not None]
    assert summaries
    for position, cut in summaries:
        assert cut is not None
        assert cut < position
        assert history[cut].role == "user", (position, cut)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_running_turn_over_the_budget_is_sent_whole_with_nothing_older(
    provider: str, store: Store, servers: list[ScriptedServer]
) -> None:
    """Two turns that answer at once, one of 3 steps of 100 calls (over a 6,000-token
    budget by itself), two more that answer at once: only the big turn's requests are
    over the budget, and they carry the instructions, the summary and that turn, nothing
    older; the next turn's requests are within it again (the big turn is folded)."""
    budget = 6_000
    limit = BYTES_PER_TOKEN * budget
    small, big, after = serve(provider, 0), serve(provider, 3), serve(provider, 0)
    servers += [small[0], big[0], after[0]]
    await turns(store, small[1], budget, 2)
    await turns(store, big[1], budget, 1, first=2)
    await turns(store, after[1], budget, 2, first=3)
    for _, llm in (small, big, after):
        await llm.aclose()
    within = [r.size for r in small[0].requests + after[0].requests]
    assert max(within) <= limit, within
    over = [r for r in big[0].requests if r.size > limit]
    assert over, "the big turn never went over the budget"
    for request in over:
        text = json.dumps(request.body)
        assert "turn 2:" in text
        assert "turn 0:" not in text
        assert "turn 1:" not in text
    assert "turn 2:" not in json.dumps(after[0].requests[-1].body)
    assert_summaries_cut_where_turns_begin(await store.load_messages(SESSION), 5)


# ---------------------------------------------------------------- the estimate


def adapters() -> list[Any]:
    class Binding:
        async def run(self, model: str, inputs: Any) -> Any:
            raise AssertionError("not called")

    return [
        OpenAILLM("gpt-4.1-mini", KEY),
        AnthropicLLM("claude-sonnet-4-5", KEY),
        WorkersAILLM(Binding()),
    ]


def body_size(llm: Any, messages: list[Message], specs: list[Any]) -> int:
    if isinstance(llm, WorkersAILLM):
        body = {**llm.request_inputs(messages, specs), "stream": True}
    else:
        body = llm.stream_body(messages, specs)
    return len(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode())


@pytest.mark.parametrize("llm", adapters(), ids=lambda llm: type(llm).__name__)
@pytest.mark.parametrize("name", sorted(conversations()))
def test_an_adapters_estimate_is_at_least_its_request_body(llm: Any, name: str) -> None:
    from durable_agents.context import message_size

    messages, specs = conversations()[name]
    wire = {c.id: c.wire_id for m in messages for c in m.tool_calls}
    sized = [
        Message(m.role, m.content, m.tool_calls, wire.get(m.tool_call_id, m.tool_call_id),
                m.tool_name)
        if m.role == "tool" else m
        for m in messages
    ]  # fmt: skip
    estimate = llm.request_size(specs) + sum(llm.message_size(m) for m in sized)
    actual = body_size(llm, messages, specs)
    assert actual <= estimate <= actual + 40 * len(messages) + 16, (actual, estimate)
    # the generic estimate (an LLM without the methods) is at least every adapter's
    for message in sized:
        assert message_size(message) >= llm.message_size(message), message


def test_the_generic_estimate_counts_escapes_and_characters_outside_ascii() -> None:
    from durable_agents.context import message_size, request_size

    plain = Message.user("a" * 100)
    quoted = Message.user('"' * 100)
    wide = Message.user("\N{CJK UNIFIED IDEOGRAPH-4E00}" * 100)
    assert message_size(quoted) >= message_size(plain) + 100
    assert message_size(wide) >= message_size(plain) + 300
    call = Message.assistant("", [ToolCall("c1", "t", {"text": '"\\' * 50})])
    assert message_size(call) >= 4 * 100  # escaped twice: an argument string inside JSON
    assert request_size([]) > 0
