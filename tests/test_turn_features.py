"""Per-turn instructions, typed output, `ModelRetry` and edited approvals, through `run()`
on real SQLite files: what the model is sent, what is stored, and what a crash at
every write leaves (each resumed turn sees what the model saw before)."""

from __future__ import annotations

import asyncio
import datetime
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from durable_agents import (
    Agent,
    ConfigurationError,
    LLMResponse,
    ModelRetry,
    RunContext,
    ToolArgumentsError,
    ToolCall,
    ToolContext,
    ToolErrorKind,
    Usage,
    approve,
    run,
    tool,
)
from durable_agents.messages import tool_error
from durable_agents.stores import Store, sqlite_store
from durable_agents.testing import ScriptedLLM, SimulatedCrash, count_writes, crash_on_write

SESSION = "s"
T0 = 1_796_000_000.0  # the injected clock's start (2026-11-30 UTC)


def clock_from(start: float) -> Any:
    now = [start]

    def clock() -> float:
        now[0] += 3600.0  # an hour per reading: a re-made instruction would differ
        return now[0]

    return clock


def ids() -> Any:
    count = [0]

    def new_id() -> str:
        count[0] += 1
        return f"id{count[0]}"

    return new_id


# ---------------------------------------------------------------- dynamic instructions


def dated(ctx: RunContext[dict[str, str]]) -> str:
    return f"Today is {ctx.now:%Y-%m-%d %H:%M}. You help {ctx.deps['caller']} ({ctx.session_name})."


@tool(safe_to_retry=True)
async def lookup(args: dict[str, Any]) -> str:
    """Look something up."""
    return "found"


def call(name: str, arguments: dict[str, Any] | None = None, call_id: str = "c1") -> LLMResponse:
    return LLMResponse(tool_calls=[ToolCall(call_id, name, arguments or {})])


def test_instructions_function_is_made_once_per_turn_and_stored_with_it(tmp_path: Path) -> None:
    store = sqlite_store(tmp_path / "a.db")
    agent = Agent("dated", dated, [lookup])
    llm = ScriptedLLM([call("lookup"), LLMResponse("done"), LLMResponse("again")])
    clock = clock_from(T0)

    async def go() -> None:
        first = await run(
            agent, llm=llm, message="hi", session_id=SESSION, store=store, clock=clock,
            deps={"caller": "Ada"}, session_name="ada-1",
        )  # fmt: skip
        assert first.status == "complete"
        second = await run(
            agent, llm=llm, message="more", session_id=SESSION, store=store, clock=clock,
            deps={"caller": "Ada"},
        )  # fmt: skip
        assert second.status == "complete"

    asyncio.run(go())
    systems = [c.messages[0].content for c in llm.calls]
    # both LLM calls of the first turn saw one text; the second turn a later one
    assert systems[0] == systems[1] != systems[2]
    assert "You help Ada (ada-1)" in systems[0]
    history = asyncio.run(store.load_messages(SESSION))
    users = [m for m in history if m.role == "user"]
    assert [u.instructions for u in users] == [systems[0], systems[2]]
    assert all(m.instructions is None for m in history if m.role != "user")


def test_a_resumed_turn_is_sent_the_instructions_stored_with_it(tmp_path: Path) -> None:
    """A crash at every write of a turn: the resume sends the model the turn's stored
    instructions, never new ones (the clock moves an hour per reading)."""
    writes = count_writes(sqlite_store(tmp_path / "count.db"))
    agent = Agent("dated", dated, [lookup])
    script = [call("lookup"), LLMResponse("done")]
    asyncio.run(
        run(agent, llm=ScriptedLLM(script), message="hi", session_id=SESSION, store=writes,
            clock=clock_from(T0), deps={"caller": "Ada"})
    )  # fmt: skip
    for n in range(1, len(writes.writes) + 1):
        store = sqlite_store(tmp_path / f"crash{n}.db")
        llm = ScriptedLLM(script * 2)
        clock = clock_from(T0)
        with pytest.raises(SimulatedCrash):
            asyncio.run(
                run(agent, llm=llm, message="hi", session_id=SESSION,
                    store=crash_on_write(store, n=n), clock=clock, deps={"caller": "Ada"})
            )  # fmt: skip
        seen = llm.calls[0].messages[0].content
        if not asyncio.run(store.load_messages(SESSION)):
            continue  # nothing of the turn was stored: the next message starts it afresh
        asyncio.run(
            run(agent, llm=llm, session_id=SESSION, store=store, clock=clock,
                deps={"caller": "Ada"})
        )  # fmt: skip
        later = [c.messages[0].content for c in llm.calls[1:]]
        assert later, n
        assert all(text == seen for text in later), n
        stored = asyncio.run(store.load_messages(SESSION))
        assert stored[0].instructions == seen


def test_an_async_instructions_function_and_its_errors() -> None:
    async def slow(ctx: RunContext[Any]) -> str:
        await asyncio.sleep(0)
        return f"at {ctx.now.isoformat()}"

    llm = ScriptedLLM([LLMResponse("ok")])
    result = asyncio.run(run(Agent("a", slow), llm=llm, message="hi", clock=lambda: 0.0))
    assert llm.calls[0].messages[0].content == "at 1970-01-01T00:00:00+00:00"
    assert result.messages[0].content == "at 1970-01-01T00:00:00+00:00"

    def broken(ctx: RunContext[Any]) -> str:
        raise KeyError("caller")

    with pytest.raises(ConfigurationError, match="instructions function of agent 'b' raised"):
        asyncio.run(run(Agent("b", broken), llm=ScriptedLLM([]), message="hi"))
    with pytest.raises(ConfigurationError, match="must return a str, got int"):
        asyncio.run(run(Agent("c", lambda ctx: 3), llm=ScriptedLLM([]), message="hi"))  # type: ignore[arg-type,return-value]
    with pytest.raises(ConfigurationError, match="instructions must be a str or a function"):
        Agent("d", 3)  # type: ignore[arg-type]


def test_the_run_context_carries_settings_deps_and_the_clock() -> None:
    seen: list[RunContext[Any]] = []

    def remember(ctx: RunContext[Any]) -> str:
        seen.append(ctx)
        return "x"

    asyncio.run(
        run(Agent("a", remember), llm=ScriptedLLM([LLMResponse("ok")]), message="hi",
            settings={"REGION": "eu"}, deps=7, clock=lambda: 86400.0, session_name="n")
    )  # fmt: skip
    (ctx,) = seen
    assert ctx.settings == {"REGION": "eu"}
    assert ctx.deps == 7
    assert ctx.session_name == "n"
    assert ctx.now == datetime.datetime(1970, 1, 2, tzinfo=datetime.UTC)


# ---------------------------------------------------------------------- typed output


class Booking(BaseModel):
    """A confirmed booking."""

    slot: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}$")
    patient: str


def answer(arguments: dict[str, Any], call_id: str = "f1") -> LLMResponse:
    return call("final_result", arguments, call_id)


def test_typed_output_through_final_result(tmp_path: Path) -> None:
    store = sqlite_store(tmp_path / "a.db")
    agent = Agent("booker", "Book.", [lookup], output_type=Booking)
    llm = ScriptedLLM([
        call("lookup"),
        answer({"slot": "tomorrow", "patient": "Ada"}, "f1"),
        answer({"slot": "2026-12-03T09:30", "patient": "Ada"}, "f2"),
    ])  # fmt: skip
    result = asyncio.run(run(agent, llm=llm, message="book", session_id=SESSION, store=store))
    assert result.status == "complete"
    assert result.output == Booking(slot="2026-12-03T09:30", patient="Ada")
    assert json.loads(result.response) == {"slot": "2026-12-03T09:30", "patient": "Ada"}
    spec = next(s for s in llm.calls[0].tools if s.name == "final_result")
    assert spec.input_schema["required"] == ["slot", "patient"]
    assert "A confirmed booking." in spec.description
    rejected = tool_error(llm.calls[2].messages[-1].content)
    assert rejected is not None
    assert rejected["kind"] == ToolErrorKind.INVALID_ARGUMENTS
    assert "slot" in rejected["error"]
    assert "pattern" in rejected["error"]
    history = asyncio.run(store.load_messages(SESSION))
    assert history[-1].is_final_reply
    assert history[-1].content == result.response
    assert history[-2].content == "Final answer accepted."
    # read back: the finished turn's output, without calling the model
    again = asyncio.run(run(agent, llm=ScriptedLLM([]), session_id=SESSION, store=store))
    assert again.output == result.output


def test_typed_output_gives_up_after_max_output_retries(tmp_path: Path) -> None:
    store = sqlite_store(tmp_path / "a.db")
    agent = Agent("booker", "Book.", output_type=Booking, max_output_retries=1)
    bad = {"slot": "soon", "patient": "Ada"}
    llm = ScriptedLLM([answer(bad, "f1"), answer(bad, "f2")])
    result = asyncio.run(run(agent, llm=llm, message="book", session_id=SESSION, store=store))
    assert (result.status, result.error_code, result.output) == ("error", "invalid-output", None)
    assert "max_output_retries" in (result.error or "")
    # the turn is stored whole and stays resumable: the model gets another go
    history = asyncio.run(store.load_messages(SESSION))
    assert [m.role for m in history] == ["user", "assistant", "tool", "assistant", "tool"]
    good = answer({"slot": "2026-12-03T09:30", "patient": "Ada"}, "f3")
    resumed = asyncio.run(run(agent, llm=ScriptedLLM([good]), session_id=SESSION, store=store))
    assert resumed.output == Booking(slot="2026-12-03T09:30", patient="Ada")


def test_typed_output_from_text_and_text_sent_back_unstored(tmp_path: Path) -> None:
    store = sqlite_store(tmp_path / "a.db")
    agent = Agent("booker", "Book.", output_type=Booking)
    llm = ScriptedLLM([
        LLMResponse("It is booked!", usage=Usage(10, 5)),
        LLMResponse('```json\n{"slot": "2026-12-03T09:30", "patient": "Ada"}\n```',
                    usage=Usage(20, 7)),
    ])  # fmt: skip
    result = asyncio.run(run(agent, llm=llm, message="book", session_id=SESSION, store=store))
    assert result.output == Booking(slot="2026-12-03T09:30", patient="Ada")
    nudge = llm.calls[1].messages
    assert nudge[-2].content == "It is booked!"
    assert "final_result" in nudge[-1].content
    history = asyncio.run(store.load_messages(SESSION))
    assert [m.role for m in history] == ["user", "assistant"]  # the rejected text: not stored
    assert history[-1].usage == Usage(30, 12)  # but its tokens are counted


def test_final_result_beside_other_calls_is_not_accepted(tmp_path: Path) -> None:
    agent = Agent("booker", "Book.", [lookup], output_type=Booking)
    both = LLMResponse(tool_calls=[
        ToolCall("c1", "lookup", {}),
        ToolCall("f1", "final_result", {"slot": "2026-12-03T09:30", "patient": "Ada"}),
    ])  # fmt: skip
    llm = ScriptedLLM([both, answer({"slot": "2026-12-03T09:30", "patient": "Ada"}, "f2")])
    result = asyncio.run(run(agent, llm=llm, message="book"))
    assert result.status == "complete"
    assert result.steps == 2
    refused = tool_error(llm.calls[1].messages[-1].content)
    assert refused is not None
    assert "on its own" in refused["error"]


def test_non_object_output_types_are_wrapped() -> None:
    agent = Agent("counter", "Count.", output_type=list[int])
    llm = ScriptedLLM([answer({"result": [1, 2, 3]})])
    result = asyncio.run(run(agent, llm=llm, message="count"))
    assert result.output == [1, 2, 3]
    schema = llm.calls[0].tools[0].input_schema
    assert schema["type"] == "object"
    assert schema["required"] == ["result"]


def test_output_type_crash_at_every_write_ends_with_one_answer(tmp_path: Path) -> None:
    agent = Agent("booker", "Book.", [lookup], output_type=Booking)
    good = {"slot": "2026-12-03T09:30", "patient": "Ada"}
    script = [call("lookup"), answer(good)]
    writes = count_writes(sqlite_store(tmp_path / "count.db"))
    asyncio.run(run(agent, llm=ScriptedLLM(script), message="b", session_id=SESSION, store=writes))
    for n in range(1, len(writes.writes) + 1):
        store = sqlite_store(tmp_path / f"c{n}.db")
        with pytest.raises(SimulatedCrash):
            asyncio.run(run(agent, llm=ScriptedLLM(script), message="b", session_id=SESSION,
                            store=crash_on_write(store, n=n)))  # fmt: skip
        resumed = asyncio.run(
            run(agent, llm=ScriptedLLM(script * 2), session_id=SESSION, store=store)
            if asyncio.run(store.load_messages(SESSION))
            else run(agent, llm=ScriptedLLM(script), message="b", session_id=SESSION, store=store)
        )
        assert resumed.output == Booking(**good), n
        finals = [m for m in asyncio.run(store.load_messages(SESSION)) if m.is_final_reply]
        assert len(finals) == 1, n


def test_an_agent_tool_named_final_result_clashes_with_output_type() -> None:
    @tool
    async def final_result(args: dict[str, Any]) -> str:
        """Mine."""
        return ""

    with pytest.raises(ConfigurationError, match="rename the agent's own tool"):
        Agent("a", "", [final_result], output_type=Booking)


# -------------------------------------------------------------------------- ModelRetry


class Slot(BaseModel):
    date: str


def test_model_retry_is_a_tool_retry_result_bounded_per_tool(tmp_path: Path) -> None:
    runs: Counter[str] = Counter()

    @tool
    async def book(args: Slot, ctx: ToolContext) -> str:
        """Book a date."""
        runs[args.date] += 1
        if args.date < "2026-12-02":
            raise ModelRetry(f"{args.date} is in the past; pick a date from 2026-12-02 on")
        return "booked"

    store = sqlite_store(tmp_path / "a.db")
    agent = Agent("a", "", [book], max_tool_retries=2)
    llm = ScriptedLLM([
        call("book", {"date": "2026-01-01"}, "c1"),
        call("book", {"date": "2026-02-01"}, "c2"),
        call("book", {"date": "2026-03-01"}, "c3"),
        call("book", {"date": "2026-12-03"}, "c4"),
        LLMResponse("booked for the 3rd"),
    ])  # fmt: skip
    result = asyncio.run(run(agent, llm=llm, message="book", session_id=SESSION, store=store))
    assert result.status == "complete"
    kinds = [
        (tool_error(m.content) or {}).get("kind", "ok")
        for m in asyncio.run(store.load_messages(SESSION))
        if m.role == "tool"
    ]
    assert kinds == ["tool-retry", "tool-retry", "tool-failed", "ok"]
    first = tool_error(llm.calls[1].messages[-1].content)
    assert first is not None
    assert "pick a date from 2026-12-02 on" in first["error"]
    assert runs == {"2026-01-01": 1, "2026-02-01": 1, "2026-03-01": 1, "2026-12-03": 1}


def test_model_retry_from_an_unsafe_tool_is_stored_once_and_never_rerun(tmp_path: Path) -> None:
    """The handler ran (and did whatever it did before raising): the result is stored as
    for any call; a crash before it is stored is a durability error, not a rerun."""
    runs: list[str] = []

    @tool
    async def charge(args: Slot) -> str:
        """Charge."""
        runs.append(args.date)
        raise ModelRetry("use a weekday")

    agent = Agent("a", "", [charge])
    script = [call("charge", {"date": "2026-12-05"}), LLMResponse("ok")]
    store = sqlite_store(tmp_path / "a.db")
    with pytest.raises(SimulatedCrash):
        asyncio.run(run(agent, llm=ScriptedLLM(script), message="m", session_id=SESSION,
                        store=crash_on_write(store, before="result of charge")))  # fmt: skip
    asyncio.run(run(agent, llm=ScriptedLLM(script[1:]), session_id=SESSION, store=store))
    results = [m for m in asyncio.run(store.load_messages(SESSION)) if m.role == "tool"]
    assert runs == ["2026-12-05"]
    assert (tool_error(results[0].content) or {})["kind"] == "tool-durability-error"


# ------------------------------------------------------------------- edited approvals


class Refund(BaseModel):
    order_id: str
    amount_cents: int = Field(gt=0)


def refund_agent(ran: list[dict[str, Any]]) -> Agent:
    @tool(requires_approval=True)
    async def issue_refund(args: Refund, ctx: ToolContext) -> dict[str, Any]:
        """Refund."""
        ran.append(args.model_dump())
        return {"refunded_cents": args.amount_cents}

    return Agent("refunds", "", [issue_refund])


async def _pending(store: Store, agent: Agent, llm: ScriptedLLM) -> Any:
    result = await run(agent, llm=llm, message="refund", session_id=SESSION, store=store)
    assert result.status == "awaiting_approval"
    return result.pending[0]


def test_an_edited_approval_runs_once_with_the_edit_and_says_so(tmp_path: Path) -> None:
    ran: list[dict[str, Any]] = []
    agent = refund_agent(ran)
    store = sqlite_store(tmp_path / "a.db")
    asked = {"order_id": "A1", "amount_cents": 5000}
    llm = ScriptedLLM([call("issue_refund", asked), LLMResponse("refunded 30.00")])
    pending = asyncio.run(_pending(store, agent, llm))
    edited = {"order_id": "A1", "amount_cents": 3000}
    asyncio.run(
        approve(store, SESSION, pending.tool_call_id, digest=pending.digest, approved=True,
                arguments=edited, agent=agent, reason="partial")
    )  # fmt: skip
    result = asyncio.run(run(agent, llm=llm, session_id=SESSION, store=store))
    assert result.status == "complete"
    assert ran == [edited]
    history = asyncio.run(store.load_messages(SESSION))
    assert history[1].tool_calls[0].arguments == asked  # what the model asked for stays
    sent = json.loads(llm.calls[1].messages[-1].content)
    assert sent["result"] == {"refunded_cents": 3000}
    assert sent["edited_arguments"] == edited
    assert "edited" in sent["note"]
    # running it again changes nothing
    again = asyncio.run(run(agent, llm=ScriptedLLM([]), session_id=SESSION, store=store))
    assert again.status == "complete"
    assert ran == [edited]


def test_an_invalid_edit_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    agent = refund_agent([])
    store = sqlite_store(tmp_path / "a.db")
    asked = {"order_id": "A1", "amount_cents": 5000}
    pending = asyncio.run(_pending(store, agent, ScriptedLLM([call("issue_refund", asked)])))
    with pytest.raises(ToolArgumentsError, match="amount_cents"):
        asyncio.run(approve(store, SESSION, pending.tool_call_id, digest=pending.digest,
                            approved=True, arguments={"order_id": "A1", "amount_cents": -1},
                            agent=agent))  # fmt: skip
    assert asyncio.run(store.load_approvals(SESSION))[-1].event == "requested"


def test_an_edited_approval_under_a_crash_at_every_write_runs_at_most_once(
    tmp_path: Path,
) -> None:
    asked = {"order_id": "A1", "amount_cents": 5000}
    edited = {"order_id": "A1", "amount_cents": 3000}
    for n in range(1, 4):  # the decision's write, the claim, the result
        ran: list[dict[str, Any]] = []
        agent = refund_agent(ran)
        store = sqlite_store(tmp_path / f"c{n}.db")
        llm = ScriptedLLM([call("issue_refund", asked), LLMResponse("done"), LLMResponse("x")])
        pending = asyncio.run(_pending(store, agent, llm))
        crashing = crash_on_write(store, n=n)
        try:
            asyncio.run(approve(crashing, SESSION, pending.tool_call_id, digest=pending.digest,
                                approved=True, arguments=edited, agent=agent))  # fmt: skip
            asyncio.run(run(agent, llm=llm, session_id=SESSION, store=crashing))
        except SimulatedCrash:
            pass
        if not asyncio.run(store.load_approvals(SESSION))[-1:] or all(
            e.event == "requested" for e in asyncio.run(store.load_approvals(SESSION))
        ):
            asyncio.run(approve(store, SESSION, pending.tool_call_id, digest=pending.digest,
                                approved=True, arguments=edited, agent=agent))  # fmt: skip
        asyncio.run(run(agent, llm=llm, session_id=SESSION, store=store))
        assert ran in ([edited], []), n
        assert all(r == edited for r in ran)
        results = [m for m in asyncio.run(store.load_messages(SESSION)) if m.role == "tool"]
        assert len(results) == 1, n


def test_the_agents_own_tools_store_no_policy() -> None:
    """Only a toolset's calls carry what was decided for them (see tests/test_mcp.py)."""
    llm = ScriptedLLM([call("lookup"), LLMResponse("ok")])
    result = asyncio.run(run(Agent("a", "", [lookup]), llm=llm, message="m"))
    assert result.messages[2].tool_calls[0].policy is None


def test_retries_are_counted_per_turn_across_runs(tmp_path: Path) -> None:
    """A turn that pauses for approval resumes in another run(): the retries it already
    used still count (here one of one), as do answers already sent back."""

    @tool
    async def book(args: Slot) -> str:
        """Book."""
        raise ModelRetry("pick another date")

    @tool(requires_approval=True)
    async def confirm(args: dict[str, Any]) -> str:
        """Confirm with the desk."""
        return "confirmed"

    store = sqlite_store(tmp_path / "a.db")
    agent = Agent("a", "", [book, confirm], max_tool_retries=1)
    llm = ScriptedLLM([
        call("book", {"date": "2026-01-01"}, "c1"),
        call("confirm", {}, "c2"),
        call("book", {"date": "2026-01-02"}, "c3"),
        LLMResponse("gave up"),
    ])  # fmt: skip
    paused = asyncio.run(run(agent, llm=llm, message="m", session_id=SESSION, store=store))
    assert paused.status == "awaiting_approval"
    pending = paused.pending[0]
    asyncio.run(approve(store, SESSION, pending.tool_call_id, digest=pending.digest,
                        approved=True))  # fmt: skip
    asyncio.run(run(agent, llm=llm, session_id=SESSION, store=store))
    kinds = [
        (tool_error(m.content) or {}).get("kind", "ok")
        for m in asyncio.run(store.load_messages(SESSION))
        if m.role == "tool"
    ]
    assert kinds == ["tool-retry", "ok", "tool-failed"]


def test_test_llm_answers_a_typed_agent_through_final_result() -> None:
    from durable_agents.llm.offline import TestLLM

    agent = Agent("booker", "Book.", [lookup], output_type=Booking)
    result = asyncio.run(run(agent, llm=TestLLM(), message="book"))
    assert result.status == "complete"
    assert isinstance(result.output, Booking)
    steps = [m.tool_calls for m in result.messages if m.role == "assistant" and m.tool_calls]
    assert [[c.name for c in s] for s in steps] == [["lookup"], ["final_result"]]


def test_handlers_read_the_runs_clock() -> None:
    seen: list[datetime.datetime] = []

    @tool
    async def when(args: dict[str, Any], ctx: ToolContext) -> str:
        """Now."""
        seen.append(ctx.now)
        return "ok"

    llm = ScriptedLLM([call("when"), LLMResponse("ok")])
    asyncio.run(run(Agent("a", "", [when]), llm=llm, message="m", clock=lambda: 86400.0))
    assert seen == [datetime.datetime(1970, 1, 2, tzinfo=datetime.UTC)]
