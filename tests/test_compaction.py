"""A bounded context, durably (durable_agents.context): what the model is sent stays within
`max_context_tokens` as a session grows; older messages are folded into a stored summary
at a step boundary, never between a call and its result; the history keeps every
message; a turn loads the latest summary's tail only; a crash at any write loses no
message and repeats no side effect. On SQLite (a real file) and the memory store.
"""

from __future__ import annotations

import gc
import itertools
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from pydantic import BaseModel

from durable_agents import (
    Agent,
    LLMResponse,
    Message,
    ToolCall,
    ToolContext,
    ToolSpec,
    Usage,
    run,
    tool,
)
from durable_agents.context import (
    BYTES_PER_TOKEN,
    estimate_tokens,
    message_size,
    summary_message,
)
from durable_agents.stores import MemoryStore, Store, sqlite_store
from durable_agents.testing import FunctionLLM, SimulatedCrash, count_writes, crash_on_write

SESSION = "s"
BUDGET = 2_000  # estimated tokens: a few turns of the model below


class Note(BaseModel):
    text: str


class World:
    """An agent that posts one note per turn (a side effect) and replies; a model that
    plays it and records what each call was sent; a summarizer that lists what it read."""

    def __init__(self, store: Store, **agent: Any) -> None:
        self.store = store
        self.posted: Counter[str] = Counter()
        self.sent: list[list[Message]] = []
        self.summaries = 0

        async def post(args: Note, ctx: ToolContext) -> str:
            self.posted[args.text] += 1
            return "posted " + "x" * 300

        def summarize(previous: str | None, messages: Sequence[Message]) -> str:
            self.summaries += 1
            users = [m.content.split()[0] for m in messages if m.role == "user"]
            return f"{previous or ''} | turns {' '.join(users)}".strip(" |")

        agent.setdefault("summarize", summarize)
        self.agent = Agent(
            "noter", "Post a note per message.", [tool(post, input=Note)],
            max_context_tokens=BUDGET, **agent,
        )  # fmt: skip
        self.llm = FunctionLLM(self.answer)

    def answer(self, messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        if not tools:  # the default summarizer's call
            return LLMResponse("a summary by the model")
        self.sent.append(messages)
        last = messages[-1]
        if last.role == "tool":
            return LLMResponse("done " + "y" * 200, usage=Usage(100, 10))
        note = last.content.split()[0]
        call = ToolCall(f"c-{note}", "post", {"text": note})
        return LLMResponse("posting " + "z" * 200, [call], Usage(100, 10))

    async def turn(self, n: int, store: Store | None = None) -> Any:
        return await run(
            self.agent, llm=self.llm, message=f"t{n} " + "w" * 400, session_id=SESSION,
            store=store or self.store,
        )  # fmt: skip


@pytest.fixture
async def world(tmp_path: Path) -> World:
    return World(sqlite_store(tmp_path / "s.db"))


def paired(window: list[Message]) -> bool:
    """Every tool result in `window` follows the assistant message that made its call."""
    calls: set[str] = set()
    for message in window:
        if message.role == "assistant":
            calls = {c.id for c in message.tool_calls}
        elif message.role == "tool" and message.tool_call_id not in calls:
            return False
    return True


async def test_the_window_stays_bounded_and_the_history_keeps_everything(world: World) -> None:
    for n in range(30):
        result = await world.turn(n)
        assert result.status == "complete"
    history = await world.store.load_messages(SESSION)
    plain = [m for m in history if not m.is_summary]
    assert len(plain) == 30 * 4  # user, assistant(call), tool, assistant: all kept
    assert world.posted == Counter({f"t{n}": 1 for n in range(30)})
    summaries = [m for m in history if m.is_summary]
    assert summaries
    assert all(m.role == "system" for m in summaries)
    assert [m.summary_of for m in summaries] == sorted({m.summary_of for m in summaries})
    for window in world.sent:
        assert estimate_tokens(window) <= BUDGET
        assert paired(window)
        assert window[0].content == "Post a note per message."
    last = world.sent[-1]
    assert last[1].role == "system"
    assert "turns t0" in last[1].content  # the summary folds every older turn in
    assert "Summary of the conversation" in last[1].content


async def test_a_summary_covers_a_prefix_that_ends_where_a_turn_begins(world: World) -> None:
    for n in range(20):
        await world.turn(n)
    history = await world.store.load_messages(SESSION)
    for summary in (m for m in history if m.is_summary):
        assert summary.summary_of is not None
        assert history[summary.summary_of].role == "user"
        assert history.index(summary) > summary.summary_of


async def test_a_turn_loads_only_the_latest_summarys_tail(world: World) -> None:
    for n in range(30):
        await world.turn(n)
    base, tail = await world.store.load_context(SESSION)
    history = await world.store.load_messages(SESSION)
    assert base > 0
    assert tail == history[base:]
    assert len(tail) < len(history) // 3
    assert sum(m.is_summary for m in tail) == 1


async def test_a_step_measures_its_new_messages_not_the_whole_window() -> None:
    """What a step costs to estimate does not grow with the window: in a turn of 60
    steps, an LLM's `message_size` is asked about each message once (the turn's
    message twice: before and after its first write), not once a step."""
    asked: Counter[str] = Counter()

    def message_size(message: Message) -> int:
        asked[message.role] += 1
        return len(message.content) + 64 * (1 + len(message.tool_calls))

    def answer(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        steps = sum(m.role == "assistant" for m in messages)
        if steps == 60:
            return LLMResponse("done")
        return LLMResponse("", [ToolCall(f"c{steps}", "post", {"text": f"n{steps}"})])

    async def post(args: Note, ctx: ToolContext) -> str:
        return "posted"

    llm = FunctionLLM(answer)
    llm.message_size = message_size  # type: ignore[attr-defined]
    agent = Agent("noter", "Post notes.", [tool(post, input=Note)], max_steps=61)
    result = await run(agent, llm=llm, message="post 60 notes")
    assert (result.status, result.steps) == ("complete", 61)
    assert asked == Counter({"system": 1, "user": 2, "assistant": 60, "tool": 60})


class KeptStore(MemoryStore):
    """The memory store taken as durable: a session's turns without a file's I/O (and
    without a thread: all of a step's work is on the one counted)."""

    durable = True


class StepWork:
    """An LLM that asks for one call a step, `steps` times, then replies, and counts the
    work of each step (from one of its calls to the next: the compaction check, the
    window, both writes, the handler): the messages it is asked to measure (its own
    `message_size`) and the function calls made (`sys.setprofile`: Python functions, and
    C ones called from Python, `json.dumps` among them)."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.asked = 0  # messages measured so far
        self.calls = 0  # function calls counted so far
        self.marks: list[tuple[int, int]] = []  # (asked, calls) at each chat()

    def message_size(self, message: Message) -> int:
        self.asked += 1
        return len(message.content) + 64 * (1 + len(message.tool_calls))

    def request_size(self, tools: Sequence[ToolSpec]) -> int:
        return 512

    def count(self, frame: FrameType, event: str, arg: object) -> None:
        if event in ("call", "c_call"):
            self.calls += 1

    async def chat(self, messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        sys.setprofile(None)  # its own work is not the step's
        self.marks.append((self.asked, self.calls))
        if len(self.marks) > self.steps:
            return LLMResponse("done")
        reply = LLMResponse("", [ToolCall(f"new-{len(self.marks)}", "post", {"text": "n" * 50})])
        sys.setprofile(self.count)
        return reply

    def per_step(self) -> list[tuple[int, int]]:
        """(messages measured, function calls) of each step."""
        return [(b[0] - a[0], b[1] - a[1]) for a, b in itertools.pairwise(self.marks)]


async def step_work(stored: int) -> StepWork:
    """The work of a 6-step turn on a session of `stored` messages (whole turns)."""
    store = KeptStore()
    history = []
    for n in range(stored // 4):
        call = ToolCall(f"old-{n}", "post", {"text": "o" * 50})
        history += [
            Message.user(f"turn {n}"), Message.assistant("", [call]),
            Message.tool_result(call, "posted"), Message.assistant("noted"),
        ]  # fmt: skip
    await store.append_messages_atomic(SESSION, 0, history)

    async def post(args: Note, ctx: ToolContext) -> str:
        return "posted"

    agent = Agent("noter", "Post notes.", [tool(post, input=Note)], max_steps=7)
    work = StepWork(6)
    profiler = sys.getprofile()  # (one a tool may have set: put back after)
    gc.disable()  # a collection's finalizers would be counted as the step's calls
    try:
        result = await run(agent, llm=work, message="post", session_id=SESSION, store=store)
    finally:
        sys.setprofile(profiler)
        gc.enable()
    assert (result.status, len(work.marks)) == ("complete", 7)
    return work


async def test_a_steps_work_does_not_grow_with_the_history() -> None:
    """The guard of a step's cost, counted, not timed (issue 33): every message is
    measured once, as it is loaded or stored, never the whole window again; and a step
    makes the same function calls on a 12-message and a 2,000-message history (no scan
    of the history, no re-serialised arguments: the window is copied, not looked through)."""
    short, long = await step_work(12), await step_work(2_000)
    assert short.marks[0][0] == 12 + 2  # the loaded history, the instructions, the message
    assert long.marks[0][0] == 2_000 + 2
    assert short.per_step() == long.per_step()
    # each step measures its call and its result; the first also the turn's message again,
    # stored by its first write (measured before as not stored yet)
    assert [asked for asked, _ in long.per_step()] == [3, 2, 2, 2, 2, 2]


async def test_a_summary_over_half_the_budget_is_cut_to_fit(tmp_path: Path) -> None:
    world = World(
        sqlite_store(tmp_path / "s.db"), summarize=lambda previous, messages: "s" * 20_000
    )
    for n in range(12):
        assert (await world.turn(n)).status == "complete"
    summaries = [m for m in await world.store.load_messages(SESSION) if m.is_summary]
    assert summaries
    for summary in summaries:
        assert "more characters of the summary cut" in summary.content
        assert message_size(summary_message(summary)) <= BUDGET * BYTES_PER_TOKEN // 2
    for window in world.sent:
        assert estimate_tokens(window) <= BUDGET


async def test_the_default_summarizer_is_the_runs_own_model(tmp_path: Path) -> None:
    world = World(sqlite_store(tmp_path / "s.db"), summarize=None)
    for n in range(12):
        await world.turn(n)
    summary = next(m for m in await world.store.load_messages(SESSION) if m.is_summary)
    assert summary.content == "a summary by the model"


async def test_a_history_processor_changes_what_is_sent_never_what_is_stored(
    tmp_path: Path,
) -> None:
    def redact(messages: list[Message]) -> list[Message]:
        return [
            Message(m.role, m.content.replace("w", "#"), m.tool_calls, m.tool_call_id, m.tool_name)
            for m in messages
        ]

    world = World(sqlite_store(tmp_path / "s.db"), history_processor=redact)
    await world.turn(0)
    assert "w" not in world.sent[0][-1].content
    assert (await world.store.load_messages(SESSION))[0].content.endswith("w" * 400)


async def test_a_retried_request_key_of_a_turn_past_the_summary_returns_its_reply(
    world: World,
) -> None:
    first = await run(
        world.agent, llm=world.llm, message="t0 first", session_id=SESSION, store=world.store,
        request_key="k0",
    )  # fmt: skip
    for n in range(1, 30):
        await world.turn(n)
    base, _ = await world.store.load_context(SESSION)
    assert base > 0
    again = await run(
        world.agent, llm=world.llm, message="t0 first", session_id=SESSION, store=world.store,
        request_key="k0",
    )  # fmt: skip
    assert (again.status, again.response) == ("complete", first.response)
    assert world.posted["t0"] == 1


async def test_the_session_budget_counts_the_whole_history_not_the_window(tmp_path: Path) -> None:
    world = World(sqlite_store(tmp_path / "s.db"))
    for n in range(20):
        await world.turn(n)
    info = await world.store.get_session(SESSION)
    assert info is not None
    used = info.input_tokens + info.output_tokens
    assert used == 20 * 2 * 110
    capped = World(world.store, max_session_tokens=used)
    result = await capped.turn(99)
    assert result.status == "budget_exceeded"


async def test_every_crash_point_of_compacting_turns_loses_nothing_and_repeats_nothing(
    tmp_path: Path,
) -> None:
    """Run 14 turns (compacting from the 5th or so) once to count the writes, then
    once per write, crashing before and after it, and finishing every turn after."""
    plain = World(sqlite_store(tmp_path / "plain.db"))
    counter = count_writes(plain.store)
    for n in range(14):
        await plain.turn(n, store=counter)
    writes = counter.appends
    assert sum(m.is_summary for m in await plain.store.load_messages(SESSION)) >= 2
    for n in range(1, writes + 1):
        for when in ("before", "after"):
            world = World(sqlite_store(tmp_path / f"{n}-{when}.db"))
            crashing = crash_on_write(world.store, n, when=when)  # type: ignore[arg-type]
            crashed = False
            for turn in range(14):
                try:
                    result = await world.turn(turn, store=crashing)
                except SimulatedCrash:
                    crashed = True
                    stored = await world.store.load_messages(SESSION)
                    if any(m.content.startswith(f"t{turn} ") for m in stored):
                        result = await run(  # the turn's message landed: finish the turn
                            world.agent, llm=world.llm, session_id=SESSION, store=world.store
                        )
                    else:  # it did not: the client sends it again
                        result = await world.turn(turn)
                assert result.status == "complete", (n, when, turn)
            assert crashed
            history = await world.store.load_messages(SESSION)
            users = [m.content.split()[0] for m in history if m.role == "user"]
            assert users == [f"t{t}" for t in range(14)], (n, when)  # none lost, none twice
            assert max(world.posted.values()) == 1, (n, when, world.posted)
            results = [m.tool_call_id for m in history if m.role == "tool"]
            assert len(results) == len(set(results))  # one result per call
