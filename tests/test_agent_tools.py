"""Agents as tools (`agent_tool`, `run(agents=)`): the child's turn in a session of its own,
run once however often the parent's call is, its answer or a typed error as the call's
result, its usage on the parent's spend, its events tagged, the depth limit and cancel.
The same over SIGKILLed processes: test_agent_tools_process.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from durable_agents import (
    Agent,
    AgentTurn,
    AgentTurnOutcome,
    CancelToken,
    ChildEvent,
    ConfigurationError,
    LLMResponse,
    LocalAgent,
    Message,
    MessageStored,
    RunEvent,
    RunFinished,
    ToolCall,
    ToolContext,
    ToolErrorKind,
    ToolSpec,
    Usage,
    agent_tool,
    idempotency_key,
    run,
    tool,
)
from durable_agents.agent_tools import child_session_name
from durable_agents.messages import ParentCall, tool_error
from durable_agents.stores import Store, memory_store, sqlite_store
from durable_agents.testing import FunctionLLM, ScriptedLLM, SimulatedCrash, crash_on_write
from durable_agents.worker import Runner, work_once


class RefundArgs(BaseModel):
    order: str


def refunds_agent(refunded: list[str], **options: Any) -> Agent:
    @tool
    async def refund(args: RefundArgs, ctx: ToolContext) -> str:
        """Refund an order."""
        refunded.append(args.order)
        return f"refunded {args.order}"

    return Agent("refunds", "You refund orders.", [refund], **options)


SUPPORT = Agent(
    "support", "You help customers.", [agent_tool("refunds", description="Refunds orders.")]
)

PARENT_USAGE = Usage(100, 10)
CHILD_USAGE = Usage(7, 3)


def parent_llm(message: str = "refund order 42") -> ScriptedLLM:
    return ScriptedLLM(
        [
            LLMResponse(
                tool_calls=[ToolCall("call_p1", "refunds", {"message": message})],
                usage=PARENT_USAGE,
            ),
            LLMResponse(text="Your order is refunded.", usage=PARENT_USAGE),
        ]
    )


def child_model(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
    """Refunds the order the user names, then says so."""
    last = messages[-1]
    if last.role == "user":
        order = last.content.rsplit(" ", 1)[-1]
        call = ToolCall(f"call_r{order}", "refund", {"order": order})
        return LLMResponse(tool_calls=[call], usage=CHILD_USAGE)
    return LLMResponse(text=f"done: {last.content}", usage=CHILD_USAGE)


def results_of(history: list[Message], name: str) -> list[Message]:
    return [m for m in history if m.role == "tool" and m.tool_name == name]


async def test_the_child_answers_in_a_session_of_its_own(durable_store: Store) -> None:
    refunded: list[str] = []
    child_llm = FunctionLLM(child_model)
    result = await run(
        SUPPORT, llm=parent_llm(), message="please refund 42", session_id="p1",
        store=durable_store, agents={"refunds": LocalAgent(refunds_agent(refunded), llm=child_llm)},
    )  # fmt: skip
    assert result.status == "complete"
    assert refunded == ["42"]
    (answer,) = results_of(await durable_store.load_messages("p1"), "refunds")
    assert answer.content == "done: refunded 42"
    name = child_session_name("p1", "call_p1")
    assert name.startswith("sub-")
    assert len(name) == 44
    child = await durable_store.load_messages(name)
    assert [m.role for m in child] == ["user", "assistant", "tool", "assistant"]
    assert child[0].content == "refund order 42"
    assert child[0].request_key == idempotency_key("p1", "call_p1")
    # The child knows its parent: the call it answers, stored with its first write.
    assert child[0].parent_call == ParentCall("p1", "call_p1")
    assert {m.origin for m in child} == {"agent-tool"}
    assert [m.parent_call for m in child[1:]] == [None, None, None]
    info = await durable_store.get_session(name)
    assert info is not None
    assert info.name == name
    assert info.agent_name == "refunds"
    # The child's two LLM calls, on the parent's call's result and the parent's spend.
    assert answer.usage == CHILD_USAGE + CHILD_USAGE
    parent = await durable_store.get_session("p1")
    assert parent is not None
    spent = PARENT_USAGE + PARENT_USAGE + CHILD_USAGE + CHILD_USAGE
    assert (parent.input_tokens, parent.output_tokens) == (spent.input_tokens, spent.output_tokens)


async def test_a_memory_store_runs_the_child_as_a_new_session_of_that_name() -> None:
    store = memory_store()
    refunded: list[str] = []
    result = await run(
        SUPPORT, llm=parent_llm(), message="refund 7", store=store,
        agents={"refunds": LocalAgent(refunds_agent(refunded), llm=FunctionLLM(child_model))},
    )  # fmt: skip
    assert result.status == "complete"
    assert refunded == ["42"]
    page = await store.find_sessions(child_session_name(result.session_id, "call_p1"))
    assert [s.agent_name for s in page] == ["refunds"]


class Refund(BaseModel):
    order: str
    amount: int


def test_a_parent_call_is_kept_in_a_column_it_splits_back_from() -> None:
    parent = ParentCall("team/alpha", "call_1")
    assert parent.key == "team/alpha/call_1"
    assert ParentCall.from_key(parent.key) == parent
    assert ParentCall.from_key("no-slash") is None
    message = Message("user", "hi", tool_call_id=parent.key, origin="agent-tool")
    assert Message.from_dict(message.to_dict()).parent_call == parent
    # Only a turn an agent tool started carries one.
    assert Message("user", "hi", tool_call_id=parent.key).parent_call is None


async def test_parent_call_goes_with_a_message_and_no_origin(durable_store: Store) -> None:
    parent = ParentCall("p1", "c1")
    for wrong in ({"message": None}, {"message": "x", "origin": "scheduled"}):
        with pytest.raises(ConfigurationError, match="parent_call"):
            await run(
                SUPPORT, llm=parent_llm(), session_id="p1", store=durable_store,
                parent_call=parent, **wrong,
            )  # fmt: skip


async def test_a_typed_child_answers_with_its_output_as_json(durable_store: Store) -> None:
    typed = Agent("refunds", "You refund orders.", output_type=Refund)
    child_llm = ScriptedLLM(
        [LLMResponse(tool_calls=[ToolCall("c1", "final_result", {"order": "42", "amount": 5})])]
    )
    await run(
        SUPPORT, llm=parent_llm(), message="refund 42", session_id="p1", store=durable_store,
        agents={"refunds": LocalAgent(typed, llm=child_llm)},
    )  # fmt: skip
    (answer,) = results_of(await durable_store.load_messages("p1"), "refunds")
    assert Refund.model_validate_json(answer.content) == Refund(order="42", amount=5)


async def test_a_child_without_an_answer_is_a_typed_error_not_a_failed_parent(
    durable_store: Store,
) -> None:
    broken = ScriptedLLM([RuntimeError("model down")])
    result = await run(
        SUPPORT, llm=parent_llm(), message="refund 42", session_id="p1", store=durable_store,
        agents={"refunds": LocalAgent(refunds_agent([]), llm=broken)},
    )  # fmt: skip
    assert result.status == "complete"
    (answer,) = results_of(await durable_store.load_messages("p1"), "refunds")
    error = tool_error(answer.content)
    assert error is not None
    assert error["kind"] == ToolErrorKind.AGENT_FAILED == "agent-failed"
    assert error["status"] == "error"
    assert error["agent"] == "refunds"
    assert error["session"] == child_session_name("p1", "call_p1")
    assert "model down" in error["error"]


async def test_a_child_over_its_budget_is_a_typed_error(durable_store: Store) -> None:
    thrifty = refunds_agent([], max_session_tokens=5)  # its first call spends 10
    result = await run(
        SUPPORT, llm=parent_llm(), message="refund 42", session_id="p1", store=durable_store,
        agents={"refunds": LocalAgent(thrifty, llm=FunctionLLM(child_model))},
    )  # fmt: skip
    assert result.status == "complete"
    (answer,) = results_of(await durable_store.load_messages("p1"), "refunds")
    error = tool_error(answer.content)
    assert error is not None
    assert error["status"] == "budget_exceeded"
    assert answer.usage == CHILD_USAGE  # what it spent before it stopped still counts


async def test_agents_are_checked_when_the_run_starts() -> None:
    with pytest.raises(ConfigurationError, match=r"agent tools for \['refunds'\]; pass run"):
        await run(SUPPORT, llm=parent_llm(), message="hi")
    other = Agent("billing", "You bill.")
    with pytest.raises(ConfigurationError, match=r"\['refunds'\].*it has \['billing'\]"):
        await run(SUPPORT, llm=parent_llm(), message="hi", agents={"billing": other})
    with pytest.raises(ConfigurationError, match="must be an Agent or a LocalAgent"):
        await run(SUPPORT, llm=parent_llm(), message="hi", agents={"refunds": "refunds"})  # type: ignore[dict-item]
    with pytest.raises(ConfigurationError, match="max_depth must be a positive int"):
        agent_tool("refunds", description="x", max_depth=0)


class RecordingRunner:
    """An `AgentRunner` of its own (as a Worker's reaches a Durable Object): records
    what it is asked and answers at once."""

    def __init__(self, names: Collection[str]) -> None:
        self.names = names
        self.turns: list[AgentTurn] = []

    async def run_turn(self, turn: AgentTurn) -> AgentTurnOutcome:
        self.turns.append(turn)
        return AgentTurnOutcome("complete", f"ok: {turn.message}", Usage(1, 2), "child-1")


async def test_a_runner_of_its_own_gets_the_turn_to_run(durable_store: Store) -> None:
    runner = RecordingRunner(["refunds"])
    token = CancelToken()
    await run(
        SUPPORT, llm=parent_llm(), message="refund 42", session_id="p1", store=durable_store,
        agents=runner, cancel=token,
    )  # fmt: skip
    (turn,) = runner.turns
    assert (turn.agent, turn.message, turn.depth) == ("refunds", "refund order 42", 1)
    assert turn.session_name == child_session_name("p1", "call_p1")
    assert turn.request_key == idempotency_key("p1", "call_p1")
    assert (turn.parent_session_id, turn.tool_call_id) == ("p1", "call_p1")
    assert turn.cancel is token
    assert turn.on_event is None
    (answer,) = results_of(await durable_store.load_messages("p1"), "refunds")
    assert (answer.content, answer.usage) == ("ok: refund order 42", Usage(1, 2))


async def test_an_agent_the_runner_no_longer_has_is_an_unknown_agent_result() -> None:
    names = ["refunds"]  # checked when the run starts; gone by the time the call runs
    runner = RecordingRunner(names)
    script = parent_llm()

    def model(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        names.clear()
        return script.steps[len(messages) > 2]  # type: ignore[return-value]

    result = await run(SUPPORT, llm=FunctionLLM(model), message="hi", agents=runner)
    (answer,) = results_of(result.messages, "refunds")
    error = tool_error(answer.content)
    assert error is not None
    assert error["kind"] == "unknown-agent"
    assert "There is no agent named 'refunds' to call; the agents are []" in error["error"]
    assert runner.turns == []


def ping_pong_model(other: str) -> FunctionLLM:
    """An agent that always asks `other`, then passes on what it was told."""

    def answer(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        last = messages[-1]
        if last.role == "user":
            return LLMResponse(tool_calls=[ToolCall("call_x", other, {"message": "and you?"})])
        return LLMResponse(text=f"{other} said: {last.content}")

    return FunctionLLM(answer)


@pytest.mark.parametrize("max_depth", [3, 1])
async def test_agents_calling_each_other_stop_at_the_depth_limit(
    durable_store: Store, max_depth: int
) -> None:
    a = Agent("a", "A.", [agent_tool("b", description="Ask B.", max_depth=max_depth)])
    b = Agent("b", "B.", [agent_tool("a", description="Ask A.", max_depth=max_depth)])
    agents = {
        "a": LocalAgent(a, llm=ping_pong_model("b")),
        "b": LocalAgent(b, llm=ping_pong_model("a")),
    }
    result = await run(
        a, llm=ping_pong_model("b"), message="hi", session_id="top", store=durable_store,
        agents=agents,
    )  # fmt: skip
    assert result.status == "complete"
    # Down the chain of child sessions to the turn whose call was refused.
    session, depth = "top", 0
    while True:
        history = await durable_store.load_messages(session)
        (answer,) = [m for m in history if m.role == "tool"]
        error = tool_error(answer.content)
        if error is not None:
            break
        session, depth = child_session_name(session, "call_x"), depth + 1
    assert depth == max_depth
    assert error["kind"] == "agent-depth-exceeded"
    assert f"depth {max_depth + 1}" in error["error"]


async def test_the_childs_usage_counts_toward_the_parents_spend_limit(
    durable_store: Store,
) -> None:
    limited = Agent(
        "support", "You help.", [agent_tool("refunds", description="x")], max_session_tokens=120
    )
    llm = parent_llm()
    result = await run(
        limited, llm=llm, message="refund 42", session_id="p1", store=durable_store,
        agents={"refunds": LocalAgent(refunds_agent([]), llm=FunctionLLM(child_model))},
    )  # fmt: skip
    # 110 of its own, under the limit; the child's 20 more put it over: no second call.
    assert result.status == "budget_exceeded"
    assert len(llm.calls) == 1
    assert "130 tokens" in (result.error or "")


async def test_a_resumed_call_reads_the_childs_turn_and_counts_it_once(
    durable_store: Store,
) -> None:
    refunded: list[str] = []
    child_llm = FunctionLLM(child_model)
    agents = {"refunds": LocalAgent(refunds_agent(refunded), llm=child_llm)}
    llm = parent_llm()
    crashing = crash_on_write(durable_store, before="result of refunds")  # the parent's write #2
    with pytest.raises(SimulatedCrash):
        await run(
            SUPPORT, llm=llm, message="refund 42", session_id="p1", store=crashing, agents=agents
        )
    assert child_llm.calls == 2
    assert refunded == ["42"]
    result = await run(SUPPORT, llm=llm, session_id="p1", store=durable_store, agents=agents)
    assert result.status == "complete"
    assert child_llm.calls == 2
    assert refunded == ["42"]
    (answer,) = results_of(await durable_store.load_messages("p1"), "refunds")
    assert answer.content == "done: refunded 42"
    assert answer.usage == CHILD_USAGE + CHILD_USAGE
    parent = await durable_store.get_session("p1")
    assert parent is not None
    assert parent.input_tokens == 2 * PARENT_USAGE.input_tokens + 2 * CHILD_USAGE.input_tokens


async def test_the_parents_watcher_gets_the_childs_events_tagged(durable_store: Store) -> None:
    seen: list[RunEvent] = []
    await run(
        SUPPORT, llm=parent_llm(), message="refund 42", session_id="p1", store=durable_store,
        agents={"refunds": LocalAgent(refunds_agent([]), llm=FunctionLLM(child_model))},
        on_event=seen.append,
    )  # fmt: skip
    tagged = [e for e in seen if isinstance(e, ChildEvent)]
    name = child_session_name("p1", "call_p1")
    assert {(e.agent, e.session_name, e.tool_call_id) for e in tagged} == {
        ("refunds", name, "call_p1")
    }
    stored = [e.event.message.role for e in tagged if isinstance(e.event, MessageStored)]
    assert stored == ["user", "assistant", "tool", "assistant"]
    assert isinstance(tagged[-1].event, RunFinished)
    assert tagged[-1].event.result.response == "done: refunded 42"
    # The child's events come while the parent's call runs: after its call, before its result.
    order = [
        "child" if isinstance(e, ChildEvent) else e.message.role
        for e in seen
        if isinstance(e, ChildEvent | MessageStored)
    ]
    assert order == ["user", "assistant", *["child"] * len(tagged), "tool", "assistant"]


async def test_a_grandchilds_events_come_wrapped_twice(durable_store: Store) -> None:
    seen: list[RunEvent] = []
    a = Agent("a", "A.", [agent_tool("b", description="Ask B.", max_depth=2)])
    b = Agent("b", "B.", [agent_tool("a", description="Ask A.", max_depth=2)])
    agents = {
        "a": LocalAgent(a, llm=ping_pong_model("b")),
        "b": LocalAgent(b, llm=ping_pong_model("a")),
    }
    await run(
        a, llm=ping_pong_model("b"), message="hi", session_id="top", store=durable_store,
        agents=agents, on_event=seen.append,
    )  # fmt: skip
    nested = [
        (e.agent, e.event.agent)
        for e in seen
        if isinstance(e, ChildEvent) and isinstance(e.event, ChildEvent)
    ]
    assert nested
    assert set(nested) == {("b", "a")}


async def test_cancelling_the_parent_cancels_the_child(durable_store: Store) -> None:
    token = CancelToken()

    async def cancelled_while_it_thinks(
        messages: list[Message], tools: list[ToolSpec]
    ) -> LLMResponse:
        token.cancel("the user left")
        await asyncio.sleep(10)  # abandoned: the run stops at once
        return child_model(messages, tools)

    refunded: list[str] = []
    llm = parent_llm()
    child = LocalAgent(refunds_agent(refunded), llm=FunctionLLM(cancelled_while_it_thinks))
    result = await run(
        SUPPORT, llm=llm, message="refund 42", session_id="p1", store=durable_store,
        agents={"refunds": child}, cancel=token,
    )  # fmt: skip
    assert result.status == "cancelled"
    assert len(llm.calls) == 1
    assert refunded == []
    (answer,) = results_of(await durable_store.load_messages("p1"), "refunds")
    error = tool_error(answer.content)
    assert error is not None
    assert error["status"] == "cancelled"
    stored = await durable_store.load_messages(child_session_name("p1", "call_p1"))
    assert [m.role for m in stored] == ["user"]  # its message kept, as for any cancel


async def test_bad_arguments_run_no_child(durable_store: Store) -> None:
    runner = RecordingRunner(["refunds"])
    llm = ScriptedLLM(
        [
            LLMResponse(tool_calls=[ToolCall("c1", "refunds", {"message": 1, "extra": True})]),
            LLMResponse(text="sorry"),
        ]
    )
    result = await run(
        SUPPORT, llm=llm, message="hi", session_id="p1", store=durable_store, agents=runner
    )
    (answer,) = results_of(result.messages, "refunds")
    error = tool_error(answer.content)
    assert error is not None
    assert error["kind"] == "invalid-arguments"
    assert runner.turns == []
    assert json.loads(json.dumps(SUPPORT.tools[0].input_schema))["additionalProperties"] is False


async def test_the_worker_resumes_a_parent_whose_process_died(tmp_path: Path) -> None:
    now = [1_800_000_000.0]
    store = sqlite_store(tmp_path / "worker.db", clock=lambda: now[0])
    refunded: list[str] = []
    child_llm = FunctionLLM(child_model)
    agents = {"refunds": LocalAgent(refunds_agent(refunded), llm=child_llm)}
    llm = parent_llm()
    with pytest.raises(SimulatedCrash):
        await run(
            SUPPORT, llm=llm, message="refund 42", session_id="p1", agents=agents,
            store=crash_on_write(store, before="result of refunds"),
        )  # fmt: skip
    assert await store.acquire_lease("p1", "elsewhere/4242/run1", 30_000) is None  # left behind
    now[0] += 31
    runner = Runner(SUPPORT, llm, agents=agents, clock=lambda: now[0])
    report = await work_once(runner, store)
    assert [(i.session_id, i.outcome, i.status) for i in report.items] == [
        ("p1", "resumed", "complete")
    ]
    assert child_llm.calls == 2
    assert refunded == ["42"]
    await store.close()
