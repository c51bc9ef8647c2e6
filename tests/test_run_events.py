"""`run(..., on_event=, cancel=)`: what a run reports while it goes, and stopping it at a step
boundary. Reporting adds no write; a cancelled turn is consistent and `message=None` finishes it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from durable_agents import (
    Agent,
    CancelToken,
    ConfigurationError,
    LLMResponse,
    Message,
    MessageStored,
    RunEvent,
    RunFinished,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolContext,
    ToolSpec,
    Usage,
    run,
    tool,
)
from durable_agents.stores import sqlite_store
from durable_agents.testing import count_writes

POSTED: list[str] = []


class PostArgs(BaseModel):
    text: str


@tool
async def post(args: PostArgs, ctx: ToolContext) -> str:
    """Post a message to the team channel."""
    POSTED.append(args.text)
    return "posted"


AGENT = Agent(name="poster", instructions="Post what you are told.", tools=[post])


class StreamingModel:
    """Calls `post` once per turn, then replies; streams its text in pieces.

    `gate`, when set, holds every call after its first piece until it is set."""

    def __init__(self, gate: asyncio.Event | None = None) -> None:
        self.gate = gate
        self.calls = 0
        self.streamed = 0

    def answer(self, messages: list[Message]) -> LLMResponse:
        self.calls += 1
        if messages[-1].role == "tool":
            return LLMResponse(text="Done: posted it.")
        return LLMResponse(text="Posting now.", tool_calls=[ToolCall("", "post", {"text": "hi"})])

    async def chat(self, messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        return self.answer(messages)

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec]
    ) -> AsyncIterator[TextDelta | ToolCallDelta | LLMResponse]:
        self.streamed += 1
        response = self.answer(messages)
        words = response.text.split(" ")
        yield TextDelta(words[0])
        if self.gate is not None:
            await self.gate.wait()
        for word in words[1:]:
            yield TextDelta(" " + word)
        for index, call in enumerate(response.tool_calls):
            yield ToolCallDelta(index, call.id, call.name, "{}")
        yield response


@pytest.fixture(autouse=True)
def _clear_posts() -> None:
    POSTED.clear()


async def test_events_report_deltas_then_each_stored_message_then_the_result(
    tmp_path: Path,
) -> None:
    store = sqlite_store(tmp_path / "s.db")
    seen: list[RunEvent] = []
    result = await run(
        AGENT, llm=StreamingModel(), message="post hi", session_id="s1", store=store,
        on_event=seen.append,
    )  # fmt: skip

    assert result.status == "complete"
    deltas = [e.text for e in seen if isinstance(e, TextDelta)]
    assert "".join(deltas) == "Posting now.Done: posted it."
    stored = [e for e in seen if isinstance(e, MessageStored)]
    history = await store.load_messages("s1")
    assert [e.position for e in stored] == list(range(len(history))) == [0, 1, 2, 3]
    assert [e.message for e in stored] == history
    assert seen[-1] == RunFinished(result)
    # each message is reported after its write, deltas before it: the order of a person's view
    kinds = [type(e).__name__ for e in seen]
    assert kinds.index("MessageStored") > kinds.index("TextDelta")


async def test_watching_adds_no_write_and_streams_only_when_watched(tmp_path: Path) -> None:
    plain, watched = (
        count_writes(sqlite_store(tmp_path / "a.db")),
        count_writes(sqlite_store(tmp_path / "b.db")),
    )
    quiet_model, loud_model = StreamingModel(), StreamingModel()
    await run(AGENT, llm=quiet_model, message="post", session_id="s", store=plain)
    await run(
        AGENT, llm=loud_model, message="post", session_id="s", store=watched,
        on_event=lambda e: None,
    )  # fmt: skip
    assert plain.appends == watched.appends == 3  # write #1, write #2, the reply
    assert quiet_model.streamed == 0
    assert loud_model.streamed == 2


async def test_an_async_watcher_is_awaited_and_one_that_raises_never_breaks_the_turn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[RunEvent] = []

    async def flaky(event: RunEvent) -> None:
        calls.append(event)
        if isinstance(event, MessageStored):  # between write #1 and the handler
            raise ConnectionResetError("the client went away")

    store = sqlite_store(tmp_path / "s.db")
    with caplog.at_level(logging.ERROR, logger="durable_agents"):
        result = await run(
            AGENT, llm=StreamingModel(), message="post", session_id="s", store=store,
            on_event=flaky,
        )  # fmt: skip
    assert result.status == "complete"
    assert POSTED == ["hi"]
    assert len(await store.load_messages("s")) == 4
    assert isinstance(calls[-1], MessageStored)  # dropped after it raised
    assert "on_event raised" in caplog.text


async def test_cancelled_before_the_first_call_keeps_the_message_and_resume_finishes(
    tmp_path: Path,
) -> None:
    store = sqlite_store(tmp_path / "s.db")
    token = CancelToken()
    token.cancel("the user pressed stop")
    model = StreamingModel()
    result = await run(
        AGENT, llm=model, message="post hi", session_id="s", store=store, cancel=token
    )
    assert (result.status, result.steps, result.error) == ("cancelled", 0, "the user pressed stop")
    assert model.calls == 0
    assert [m.role for m in await store.load_messages("s")] == ["user"]

    resumed = await run(AGENT, llm=model, session_id="s", store=store)
    assert resumed.status == "complete"
    assert POSTED == ["hi"]


async def test_cancel_during_a_streaming_call_abandons_it_and_stores_nothing_of_it(
    tmp_path: Path,
) -> None:
    store = count_writes(sqlite_store(tmp_path / "s.db"))
    gate, token = asyncio.Event(), CancelToken()
    seen: list[RunEvent] = []

    def watch(event: RunEvent) -> None:
        seen.append(event)
        if isinstance(event, TextDelta):
            token.cancel()  # mid-call: the model holds the rest of its answer

    result = await run(
        AGENT, llm=StreamingModel(gate), message="post", session_id="s", store=store,
        on_event=watch, cancel=token,
    )  # fmt: skip
    assert result.status == "cancelled"
    assert [m.role for m in await store.load_messages("s")] == ["user"]
    assert store.appends == 1
    assert POSTED == []
    assert isinstance(seen[-1], RunFinished)
    assert seen[-1].result.status == "cancelled"


async def test_cancel_while_handlers_run_lets_the_step_finish_then_stops(tmp_path: Path) -> None:
    store = sqlite_store(tmp_path / "s.db")
    token = CancelToken()

    async def post(args: PostArgs, ctx: ToolContext) -> str:
        token.cancel()  # write #1 has landed: the step must finish
        await asyncio.sleep(0.01)
        POSTED.append(args.text)
        return "posted"

    model = StreamingModel()
    result = await run(
        AGENT, llm=model, message="post", session_id="s", store=store, tools={"post": post},
        cancel=token,
    )  # fmt: skip
    assert result.status == "cancelled"
    assert result.steps == 1
    history = await store.load_messages("s")
    assert [m.role for m in history] == ["user", "assistant", "tool"]
    assert history[-1].content == "posted"  # its real result, not a durability error

    resumed = await run(AGENT, llm=model, session_id="s", store=store)
    assert resumed.response == "Done: posted it."
    assert POSTED == ["hi"]


async def test_a_stream_that_ends_without_a_response_ends_the_run_with_an_error(
    tmp_path: Path,
) -> None:
    class Broken:
        async def chat(self, messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
            raise AssertionError("not called when watched")

        async def stream(
            self, messages: list[Message], tools: list[ToolSpec]
        ) -> AsyncIterator[TextDelta]:
            yield TextDelta("half")

    result = await run(
        AGENT, llm=Broken(), message="post", session_id="s",
        store=sqlite_store(tmp_path / "s.db"), on_event=lambda e: None,
    )  # fmt: skip
    assert result.status == "error"
    assert "without an LLMResponse" in (result.error or "")


# --- spend limits: Agent(max_session_tokens=N) ---


class CountingModel(StreamingModel):
    """StreamingModel whose answers each report 10 input + 5 output tokens."""

    def answer(self, messages: list[Message]) -> LLMResponse:
        response = super().answer(messages)
        return LLMResponse(response.text, response.tool_calls, Usage(10, 5))


async def test_a_session_over_its_token_limit_stops_before_the_next_llm_call(
    tmp_path: Path,
) -> None:
    store = count_writes(sqlite_store(tmp_path / "s.db"))
    limited = Agent(name="poster", instructions="Post.", tools=[post], max_session_tokens=20)
    model = CountingModel()
    first = await run(limited, llm=model, message="post hi", session_id="s", store=store)
    # 15 tokens after the first call (< 20): the second call runs; 30 after it: the turn
    # already ended with the reply, so this one completes
    assert first.status == "complete"
    assert model.calls == 2
    writes = store.appends

    second = await run(limited, llm=model, message="post again", session_id="s", store=store)
    assert second.status == "budget_exceeded"
    assert "30 tokens" in (second.error or "")
    assert "limit of 20" in (second.error or "")
    assert model.calls == 2  # no LLM call at all
    history = await store.load_messages("s")
    assert history[-1].role == "user"  # the message is kept, for message=None
    assert store.appends == writes + 1
    assert POSTED == ["hi"]

    again = await run(limited, llm=model, session_id="s", store=store)
    assert again.status == "budget_exceeded"  # still over: nothing written
    assert store.appends == writes + 1

    raised = Agent(name="poster", instructions="Post.", tools=[post], max_session_tokens=1000)
    resumed = await run(raised, llm=model, session_id="s", store=store)
    assert resumed.status == "complete"
    assert POSTED == ["hi", "hi"]  # the second turn ran, once


async def test_the_budget_counts_stored_usage_so_it_survives_a_new_process(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.db"
    await run(AGENT, llm=CountingModel(), message="post", session_id="s", store=sqlite_store(path))
    limited = Agent(name="poster", instructions="Post.", tools=[post], max_session_tokens=30)
    result = await run(limited, llm=CountingModel(), message="more", session_id="s",
                       store=sqlite_store(path))  # fmt: skip
    assert result.status == "budget_exceeded"


@pytest.mark.parametrize("bad", [0, -5, True, 2.5, "100"])
def test_max_session_tokens_must_be_a_positive_int(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="max_session_tokens"):
        Agent(name="a", max_session_tokens=bad)  # type: ignore[arg-type]
