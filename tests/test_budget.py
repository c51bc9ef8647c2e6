"""Steps larger than a Workers invocation may fetch (`durable_agents.budget`): the calls
that fit run, the rest are recorded as deferred with the step's results (requested and
approved by the kit, not claimed) and run by `run(message=None)` in the next
invocation, each claimed first. A call that fetches nothing is never deferred. On a
real SQLite file, with the budget a Durable Object would set (`budget.invocation`).

The crash sweep crashes the sequence at every write, before and after it lands, and
resumes in fresh invocations until the turn is done: every call is answered once, no
unsafe handler runs twice, and a deferred call never claimed is never called lost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from durable_agents import Agent, LLMResponse, ToolCall, ToolContext, run, tool
from durable_agents.budget import InvocationBudget, invocation, spend
from durable_agents.errors import SessionBusyError
from durable_agents.messages import ToolErrorKind, tool_error
from durable_agents.run import DEFERRED_REASON
from durable_agents.stores import Store, sqlite_store
from durable_agents.testing import FunctionLLM, SimulatedCrash, count_writes, crash_on_write

CALLS = 11  # with room for 4 calls an invocation: 4 + 4 + 3


class Item(BaseModel):
    n: int


class Effects:
    def __init__(self) -> None:
        self.ran: list[str] = []

    async def post(self, args: Item, ctx: ToolContext) -> str:
        spend(subrequests=1)  # as a fetch does, inside a Workers invocation
        self.ran.append(ctx.tool_call_id)
        return f"posted {args.n}"


def model(messages: list[Any], tools: Any) -> LLMResponse:
    last_user = max(i for i, m in enumerate(messages) if m.role == "user")
    if any(m.role == "assistant" for m in messages[last_user:]):
        return LLMResponse(text="all posted")
    return LLMResponse(tool_calls=[ToolCall(f"c{i}", "post", {"n": i}) for i in range(CALLS)])


def room(calls: int) -> InvocationBudget:
    """An invocation's budget leaving room for `calls` calls (RESERVED_SUBREQUESTS aside)."""
    return InvocationBudget(subrequests=calls + 2, queries=1_000)


def agent_for(effects: Effects) -> Agent[Any]:
    return Agent("poster", "Post them all.", [tool(effects.post, name="post", input=Item)])


async def turn(agent: Agent[Any], store: Store, message: str | None) -> Any:
    with invocation(room(4)):  # each call of run() is an invocation of its own
        return await run(agent, llm=FunctionLLM(model), message=message, session_id="s",
                         store=store, lease_seconds=None)  # fmt: skip


async def test_a_step_over_the_budget_runs_in_three_invocations(tmp_path: Path) -> None:
    effects = Effects()
    agent = agent_for(effects)
    async with sqlite_store(tmp_path / "a.db") as store:
        first = await turn(agent, store, "post eleven")
        assert first.status == "deferred"
        assert effects.ran == ["c0", "c1", "c2", "c3"]
        events = await store.load_approvals("s")
        assert {e.tool_call_id for e in events if e.event == "approved"} == {
            f"c{i}" for i in range(4, CALLS)
        }
        assert all(e.reason == DEFERRED_REASON for e in events if e.event == "approved")
        # A new message while deferred calls wait is refused: the turn before goes first.
        with pytest.raises(SessionBusyError):
            await turn(agent, store, "something else")
        second = await turn(agent, store, None)
        assert second.status == "deferred"
        assert len(effects.ran) == 8
        third = await turn(agent, store, None)
        assert (third.status, third.response) == ("complete", "all posted")
        assert effects.ran == [f"c{i}" for i in range(CALLS)]
        history = await store.load_messages("s")
        results = [m for m in history if m.role == "tool"]
        assert sorted(m.tool_call_id or "" for m in results) == sorted(effects.ran)
        assert all(tool_error(m.content) is None for m in results)
        claims = [e.tool_call_id for e in await store.load_approvals("s") if e.event == "claimed"]
        assert set(claims) == {f"c{i}" for i in range(4, CALLS)}
        assert len(claims) == CALLS - 4


async def test_calls_that_fetch_nothing_are_never_deferred(tmp_path: Path) -> None:
    ran: list[str] = []

    async def pure(args: Item, ctx: ToolContext) -> str:
        ran.append(ctx.tool_call_id)
        return "done in the Worker"

    agent = Agent("pure", "t", [tool(pure, name="post", input=Item)])
    async with sqlite_store(tmp_path / "a.db") as store:
        result = await turn(agent, store, "post eleven")
    assert result.status == "complete"
    assert len(ran) == CALLS


async def test_without_a_budget_nothing_is_deferred(tmp_path: Path) -> None:
    effects = Effects()
    async with sqlite_store(tmp_path / "a.db") as store:
        result = await run(agent_for(effects), llm=FunctionLLM(model), message="post",
                           session_id="s", store=store)  # fmt: skip
    assert result.status == "complete"
    assert len(effects.ran) == CALLS


async def _play(store: Store, crash: tuple[int, str] | None) -> tuple[Effects, list[Any]]:
    effects = Effects()
    agent = agent_for(effects)
    target: Any = crash_on_write(store, crash[0], when=crash[1]) if crash else count_writes(store)  # type: ignore[arg-type]
    for _ in range(20):
        stored = await store.load_messages("s")
        message = None if stored else "post eleven"
        try:
            result = await turn(agent, target, message)
        except SimulatedCrash:
            target = store  # the process died; the next invocation resumes
            continue
        if result.status == "complete":
            break
    return effects, await store.load_messages("s")


async def test_every_crash_point_of_a_deferred_step(tmp_path: Path) -> None:
    async with sqlite_store(tmp_path / "base.db") as store:
        counted = count_writes(store)
        effects = Effects()
        agent = agent_for(effects)
        message: str | None = "post eleven"
        for _ in range(5):
            with invocation(room(4)):
                result = await run(agent, llm=FunctionLLM(model), message=message,
                                   session_id="s", store=counted, lease_seconds=None)  # fmt: skip
            message = None
            if result.status == "complete":
                break
        writes = counted.appends
    scenarios = 0
    for n in range(1, writes + 1):
        for when in ("before", "after"):
            async with sqlite_store(tmp_path / f"c{n}{when}.db") as store:
                effects, history = await _play(store, (n, when))
                events = await store.load_approvals("s")
            scenarios += 1
            where = f"crash at write {n} ({when})"
            assert history[-1].content == "all posted", where
            results = [m for m in history if m.role == "tool"]
            assert len(results) == CALLS, where  # one result per call
            assert {m.tool_call_id for m in results} == {f"c{i}" for i in range(CALLS)}, where
            assert len(effects.ran) == len(set(effects.ran)), (where, effects.ran)  # never twice
            claimed = {e.tool_call_id for e in events if e.event == "claimed"}
            deferred = {e.tool_call_id for e in events if e.event == "approved"}
            for m in results:
                kind = (tool_error(m.content) or {}).get("kind")
                if m.tool_call_id in deferred and m.tool_call_id not in claimed:
                    # deferred, never claimed: known never started, so never "lost"
                    assert kind != ToolErrorKind.TOOL_DURABILITY_ERROR, where
                if kind is None:
                    assert m.tool_call_id in effects.ran, where
    assert scenarios == 2 * writes
    assert writes >= 6  # write #1, results, claims and results twice, the reply
