"""A child's approvals surface in the parent: an agent tool whose child turn waits for a
person's decision leaves the parent's call without a result and the parent's turn
waiting; `pending_approvals` on the parent lists the child's calls (and a grandchild's),
tagged with their session; `approve` on the parent decides them; a new message to the
parent is refused meanwhile; and the resumed parent gets the child's answer. The same
with a real process SIGKILLed after the decision, around the child's approved call.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from tests.support.delegating_process import APPROVAL_POINTS, ASK, PARENT_CALL, SCRIPT
from tests.support.history_checks import read_effects
from tests.support.process_agent import child, load_history, outcome_of, read_line, reap, wait_ready

from durable_agents import (
    Agent,
    ApprovalAlreadyDecidedError,
    ApprovalDigestMismatchError,
    ApprovalNotFoundError,
    ApprovalPendingError,
    LLMResponse,
    LocalAgent,
    Message,
    PendingApproval,
    ToolCall,
    ToolContext,
    ToolDurabilityError,
    ToolSpec,
    agent_tool,
    approval_digest,
    approve,
    pending_approvals,
    run,
    tool,
)
from durable_agents.agent_tools import child_session_name
from durable_agents.messages import tool_error
from durable_agents.stores import Store, memory_store, sqlite_store
from durable_agents.testing import FunctionLLM, SimulatedCrash, crash_on_write


class RefundArgs(BaseModel):
    order: str


def refunds_agent(refunded: list[str]) -> Agent:
    @tool(requires_approval=True)
    async def refund(args: RefundArgs, ctx: ToolContext) -> str:
        """Refund an order."""
        refunded.append(args.order)
        return f"refunded {args.order}"

    return Agent("refunds", "You refund orders.", [refund])


def asking(other: str, call_id: str) -> FunctionLLM:
    """An agent's model that asks agent `other` once, then passes on what it was told."""

    def answer(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        last = messages[-1]
        if last.role == "user":
            return LLMResponse(tool_calls=[ToolCall(call_id, other, {"message": "refund 42"})])
        return LLMResponse(text=f"{other} said: {last.content}")

    return FunctionLLM(answer)


def refunding() -> FunctionLLM:
    """The refunds agent's model: refunds the order the user names, then says how it went."""

    def answer(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        last = messages[-1]
        if last.role == "user":
            order = last.content.rsplit(" ", 1)[-1]
            return LLMResponse(tool_calls=[ToolCall("call_r1", "refund", {"order": order})])
        return LLMResponse(text=f"done: {last.content}")

    return FunctionLLM(answer)


SUPPORT = Agent("support", "You help.", [agent_tool("refunds", description="Refunds orders.")])
CHILD = child_session_name("p1", "call_p1")
WAITING = PendingApproval(
    "call_r1", "refund", {"order": "42"},
    approval_digest(CHILD, "call_r1", "refund", {"order": "42"}), CHILD,
)  # fmt: skip


class Family:
    """The support agent, its refunds child, their models and the refunds made."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.refunded: list[str] = []
        self.llm = asking("refunds", "call_p1")
        self.child_llm = refunding()
        child = LocalAgent(refunds_agent(self.refunded), llm=self.child_llm)
        self.agents = {"refunds": child}

    async def send(self, message: str = "help me") -> Any:
        return await run(
            SUPPORT, llm=self.llm, message=message, session_id="p1", store=self.store,
            agents=self.agents,
        )  # fmt: skip

    async def resume(self) -> Any:
        return await run(
            SUPPORT, llm=self.llm, session_id="p1", store=self.store, agents=self.agents
        )


def tool_results(history: list[Message]) -> list[Message]:
    return [m for m in history if m.role == "tool"]


async def test_the_parent_waits_for_its_childs_approval_and_gets_its_answer(
    durable_store: Store,
) -> None:
    family = Family(durable_store)
    result = await family.send()
    assert result.status == "awaiting_approval"
    assert result.pending == [WAITING]
    assert family.refunded == []
    # The parent's call has no result (not an agent-failed one): the step waits.
    assert [m.role for m in await durable_store.load_messages("p1")] == ["user", "assistant"]
    assert await pending_approvals(durable_store, "p1") == [WAITING]
    # Listed from the child's own session, the call is its own: untagged.
    (own,) = await pending_approvals(durable_store, CHILD)
    assert (own.tool_call_id, own.digest, own.session) == ("call_r1", WAITING.digest, None)
    assert own.to_dict() == {k: v for k, v in WAITING.to_dict().items() if k != "session"}
    assert WAITING.to_dict()["session"] == CHILD

    again = await family.resume()  # nothing decided: it waits again, nothing run
    assert (again.status, again.pending) == ("awaiting_approval", [WAITING])
    assert (family.llm.calls, family.child_llm.calls) == (1, 1)

    await approve(
        durable_store, "p1", "call_r1", digest=WAITING.digest, approved=True, reason="ann: ok"
    )
    assert await pending_approvals(durable_store, "p1") == []
    # The decision is the child's: stored in its session, none in the parent's.
    assert [e.event for e in await durable_store.load_approvals(CHILD)] == [
        "requested",
        "approved",
    ]
    assert await durable_store.load_approvals("p1") == []

    result = await family.resume()
    assert result.status == "complete"
    assert family.refunded == ["42"]
    (answer,) = tool_results(await durable_store.load_messages("p1"))
    assert answer.content == "done: refunded 42"
    assert result.response == "refunds said: done: refunded 42"
    child_info = await durable_store.get_session(CHILD)
    assert child_info is not None
    assert answer.usage is not None
    assert answer.usage.input_tokens == child_info.input_tokens  # counted once, when it landed
    assert (await family.resume()).response == result.response  # read back: nothing runs
    assert family.refunded == ["42"]


async def test_a_denial_gives_the_parent_the_childs_answer_to_it(durable_store: Store) -> None:
    family = Family(durable_store)
    await family.send()
    await approve(
        durable_store, "p1", "call_r1", digest=WAITING.digest, approved=False, reason="too much"
    )
    result = await family.resume()
    assert result.status == "complete"
    assert family.refunded == []
    (denied,) = tool_results(await durable_store.load_messages(CHILD))
    error = tool_error(denied.content)
    assert error is not None
    assert (error["kind"], error["reason"]) == ("tool-denied", "too much")
    (answer,) = tool_results(await durable_store.load_messages("p1"))
    assert answer.content == f"done: {denied.content}"  # the child's reply, not agent-failed


async def test_deciding_on_the_childs_own_session_works_too(durable_store: Store) -> None:
    family = Family(durable_store)
    await family.send()
    await approve(durable_store, CHILD, "call_r1", digest=WAITING.digest, approved=True)
    assert (await family.resume()).status == "complete"
    assert family.refunded == ["42"]


async def test_a_decision_from_the_parent_is_checked_as_the_childs(durable_store: Store) -> None:
    family = Family(durable_store)
    await family.send()
    with pytest.raises(ApprovalDigestMismatchError) as mismatch:
        await approve(durable_store, "p1", "call_r1", digest="0" * 64, approved=True)
    assert mismatch.value.session_id == CHILD
    with pytest.raises(ApprovalNotFoundError) as missing:
        await approve(durable_store, "p1", "call_nope", digest=WAITING.digest, approved=True)
    assert missing.value.session_id == "p1"
    await approve(durable_store, "p1", "call_r1", digest=WAITING.digest, approved=True)
    with pytest.raises(ApprovalAlreadyDecidedError):  # a second approver, through the parent
        await approve(durable_store, "p1", "call_r1", digest=WAITING.digest, approved=False)


async def test_a_new_message_is_refused_while_the_child_waits(durable_store: Store) -> None:
    family = Family(durable_store)
    await family.send()
    before = (await durable_store.load_messages("p1"), await durable_store.load_messages(CHILD))
    with pytest.raises(ApprovalPendingError) as refused:
        await family.send("never mind, something else")
    assert refused.value.tool_call_ids == ["call_r1"]
    assert refused.value.code == "approval-pending"
    after = (await durable_store.load_messages("p1"), await durable_store.load_messages(CHILD))
    assert after == before  # nothing written, in either session
    assert family.llm.calls == 1


async def test_the_parents_own_approvals_and_its_childs_wait_together(
    durable_store: Store,
) -> None:
    refunded: list[str] = []
    gated = refunds_agent(refunded).tools[0]
    both = Agent("support", "You help.", [gated, agent_tool("refunds", description="x")])

    def model(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        if messages[-1].role == "user":
            own = ToolCall("call_p0", "refund", {"order": "7"})
            asked = ToolCall("call_p1", "refunds", {"message": "refund 42"})
            return LLMResponse(tool_calls=[own, asked])
        return LLMResponse(text="both done")

    child = LocalAgent(refunds_agent(refunded), llm=refunding())
    go = {"llm": FunctionLLM(model), "session_id": "p1", "store": durable_store}
    result = await run(both, message="hi", agents={"refunds": child}, **go)  # type: ignore[arg-type]
    assert result.status == "awaiting_approval"
    assert [(p.tool_call_id, p.session) for p in result.pending] == [
        ("call_p0", None),
        ("call_r1", CHILD),
    ]
    assert await pending_approvals(durable_store, "p1") == result.pending
    for waiting in result.pending:  # both decided from the parent's session
        call_id, digest = waiting.tool_call_id, waiting.digest
        await approve(durable_store, "p1", call_id, digest=digest, approved=True)
    result = await run(both, agents={"refunds": child}, **go)  # type: ignore[arg-type]
    assert result.status == "complete"
    assert sorted(refunded) == ["42", "7"]
    answers = {m.tool_call_id: m.content for m in tool_results(result.messages)}
    assert answers == {"call_p0": "refunded 7", "call_p1": "done: refunded 42"}


async def test_a_child_that_asks_again_keeps_the_parent_waiting(durable_store: Store) -> None:
    def twice(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        last = messages[-1]
        if last.role == "user":
            return LLMResponse(tool_calls=[ToolCall("call_r1", "refund", {"order": "42"})])
        if last.tool_call_id == "call_r1":
            return LLMResponse(tool_calls=[ToolCall("call_r2", "refund", {"order": "43"})])
        return LLMResponse(text="both refunded")

    family = Family(durable_store)
    family.agents["refunds"] = LocalAgent(refunds_agent(family.refunded), llm=FunctionLLM(twice))
    (first,) = (await family.send()).pending
    await approve(durable_store, "p1", first.tool_call_id, digest=first.digest, approved=True)
    result = await family.resume()
    assert result.status == "awaiting_approval"
    assert [(p.tool_call_id, p.session) for p in result.pending] == [("call_r2", CHILD)]
    assert family.refunded == ["42"]
    assert [m.role for m in await durable_store.load_messages("p1")] == ["user", "assistant"]
    (second,) = result.pending
    await approve(durable_store, "p1", second.tool_call_id, digest=second.digest, approved=True)
    result = await family.resume()
    assert (result.status, result.response) == ("complete", "refunds said: both refunded")
    assert family.refunded == ["42", "43"]


async def test_a_step_beside_a_waiting_child_is_repaired_and_keeps_waiting(
    durable_store: Store,
) -> None:
    notified: list[str] = []

    @tool
    async def notify(args: RefundArgs, ctx: ToolContext) -> str:
        """Tell the customer (a side effect)."""
        notified.append(args.order)
        return "notified"

    both = Agent("support", "You help.", [notify, agent_tool("refunds", description="x")])

    def model(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        if messages[-1].role == "user":
            told = ToolCall("call_n", "notify", {"order": "42"})
            asked = ToolCall("call_p1", "refunds", {"message": "refund 42"})
            return LLMResponse(tool_calls=[told, asked])
        return LLMResponse(text="done")

    refunded: list[str] = []
    agents = {"refunds": LocalAgent(refunds_agent(refunded), llm=refunding())}
    go = {"llm": FunctionLLM(model), "session_id": "p1", "agents": agents}
    crashing = crash_on_write(durable_store, before="result of notify")  # the parent's write #2
    with pytest.raises(SimulatedCrash):
        await run(both, message="hi", store=crashing, **go)  # type: ignore[arg-type]
    assert notified == ["42"]
    result = await run(both, store=durable_store, **go)  # type: ignore[arg-type]
    assert (result.status, result.pending) == ("awaiting_approval", [WAITING])
    (lost,) = tool_results(await durable_store.load_messages("p1"))  # only notify's, repaired
    assert ToolDurabilityError.from_message(lost) is not None
    assert notified == ["42"]
    await approve(durable_store, "p1", "call_r1", digest=WAITING.digest, approved=True)
    result = await run(both, store=durable_store, **go)  # type: ignore[arg-type]
    assert result.status == "complete"
    assert (notified, refunded) == (["42"], ["42"])


async def test_a_new_message_that_finds_the_child_coming_to_wait_is_refused(
    durable_store: Store,
) -> None:
    family = Family(durable_store)
    with pytest.raises(SimulatedCrash):  # the parent's call stored, no child turn yet
        await run(
            SUPPORT, llm=family.llm, message="help me", session_id="p1", agents=family.agents,
            store=crash_on_write(durable_store, after="call of refunds"),
        )  # fmt: skip
    # The new message first finishes the turn before: the call runs its child's turn,
    # which comes to wait for a decision; so the message is refused, and not stored.
    with pytest.raises(ApprovalPendingError) as refused:
        await family.send("something else")
    assert refused.value.tool_call_ids == ["call_r1"]
    assert [m.role for m in await durable_store.load_messages("p1")] == ["user", "assistant"]
    assert await pending_approvals(durable_store, "p1") == [WAITING]
    await approve(durable_store, "p1", "call_r1", digest=WAITING.digest, approved=True)
    assert (await family.resume()).status == "complete"
    assert family.refunded == ["42"]


async def test_a_grandchilds_approval_is_listed_and_decided_from_the_top(
    durable_store: Store,
) -> None:
    refunded: list[str] = []
    a = Agent("a", "A.", [agent_tool("b", description="Ask B.")])
    b = Agent("b", "B.", [agent_tool("refunds", description="Ask refunds.")])
    agents = {
        "b": LocalAgent(b, llm=asking("refunds", "call_b")),
        "refunds": LocalAgent(refunds_agent(refunded), llm=refunding()),
    }
    go = {"llm": asking("b", "call_a"), "session_id": "a1", "store": durable_store}
    result = await run(a, message="hi", agents=agents, **go)  # type: ignore[arg-type]
    grandchild = child_session_name(child_session_name("a1", "call_a"), "call_b")
    digest = approval_digest(grandchild, "call_r1", "refund", {"order": "42"})
    expected = [PendingApproval("call_r1", "refund", {"order": "42"}, digest, grandchild)]
    assert (result.status, result.pending) == ("awaiting_approval", expected)
    assert await pending_approvals(durable_store, "a1") == expected
    assert await pending_approvals(durable_store, child_session_name("a1", "call_a")) == expected

    await approve(durable_store, "a1", "call_r1", digest=digest, approved=True)
    result = await run(a, agents=agents, **go)  # type: ignore[arg-type]
    assert result.status == "complete"
    assert refunded == ["42"]
    assert result.response == "b said: refunds said: done: refunded 42"


async def test_on_a_memory_store_the_child_is_tagged_with_its_own_id() -> None:
    store = memory_store()
    refunded: list[str] = []
    result = await run(
        SUPPORT, llm=asking("refunds", "call_p1"), message="hi", store=store,
        agents={"refunds": LocalAgent(refunds_agent(refunded), llm=refunding())},
    )  # fmt: skip
    assert result.status == "awaiting_approval"
    (found,) = await store.find_sessions(child_session_name(result.session_id, "call_p1"))
    (waiting,) = result.pending
    assert waiting.session == found.id  # a new id under the derived name
    assert waiting.digest == approval_digest(found.id, "call_r1", "refund", {"order": "42"})
    assert await pending_approvals(store, result.session_id) == [waiting]
    await approve(store, result.session_id, "call_r1", digest=waiting.digest, approved=True)
    assert await pending_approvals(store, result.session_id) == []


# -- SIGKILL of a real process resuming the parent after the child's call was approved --

SESSION = "parent-1"
CHILD_OF_PROCESS = child_session_name(SESSION, PARENT_CALL)
# How often the refund took effect, by where the kill landed: never where the child
# claimed its call and no handler ran (the claim makes it an orphan: never run again).
REFUNDS = {"child-claimed": 0, "child-handler": 1, "child-reply": 1}


def run_process(db: Path, effects: Path, *options: str) -> dict[str, Any]:
    """Run the parent's turn in a process of its own, to its end; its outcome."""
    with child(db, effects, SESSION, "--gated", *options, script=SCRIPT) as proc:
        wait_ready(proc)
        _, out, err = reap(proc, timeout=60)
    outcome = outcome_of(out)
    assert outcome is not None, f"no outcome:\n{out}\n{err}"
    return outcome


def kill_resume_at(db: Path, effects: Path, point: str) -> None:
    """Resume the parent's turn in a process, SIGKILL it once it reports `point`."""
    options = ("--mode", "resume", "--pause-at", point)
    with child(db, effects, SESSION, "--gated", *options, script=SCRIPT) as proc:
        wait_ready(proc)
        line = read_line(proc, timeout=60)
        if line != "paused\n":
            code, out, err = reap(proc)
            raise AssertionError(f"no pause at {point} ({code}): {line}{out}\n{err}")
        proc.send_signal(signal.SIGKILL)
        code, _, err = reap(proc)
    assert code == -signal.SIGKILL, err


async def decide_from_the_parent(db: Path) -> None:
    async with sqlite_store(db) as store:
        (waiting,) = await pending_approvals(store, SESSION)
        assert (waiting.tool_name, waiting.session) == ("refund", CHILD_OF_PROCESS)
        await approve(store, SESSION, waiting.tool_call_id, digest=waiting.digest, approved=True)


@pytest.mark.slow
@pytest.mark.parametrize("point", APPROVAL_POINTS)
def test_sigkill_after_the_childs_approval_runs_its_call_at_most_once(
    tmp_path: Path, point: str
) -> None:
    db, effects = tmp_path / "agents.db", tmp_path / "effects.log"
    assert run_process(db, effects)["status"] == "awaiting_approval"
    assert [m.role for m in load_history(db, SESSION)] == ["user", "assistant"]
    asyncio.run(decide_from_the_parent(db))
    kill_resume_at(db, effects, point)
    outcome = run_process(db, effects, "--mode", "resume")
    assert outcome["status"] == "complete"

    refunds = [e for e in read_effects(effects) if e.tool_name == "refund"]
    assert len(refunds) == REFUNDS[point], refunds
    child_history = load_history(db, CHILD_OF_PROCESS)
    assert [m.content for m in child_history if m.role == "user"] == [ASK]  # one child turn
    lost = [e.tool_name for m in child_history if (e := ToolDurabilityError.from_message(m))]
    assert lost == ([] if point == "child-reply" else ["refund"])
    (answer,) = tool_results(load_history(db, SESSION))
    assert ToolDurabilityError.from_message(answer) is None
    assert answer.content == child_history[-1].content  # the child's answer, as it stored it
    assert outcome["response"] == f"support: {answer.content}"
    if point == "child-reply":
        assert answer.content == "refunds: refunded order 42"
