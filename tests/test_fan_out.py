"""A step's fan-out stays within what a Worker invocation may do: at most
`tool_concurrency` handlers at once (6 by default, Cloudflare's open connections per
invocation) and `max_tool_calls_per_step` calls run per reply; the rest are answered
`too-many-calls`, never run, never waiting for approval. On SQLite (a real file)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from durable_agents import (
    Agent,
    ConfigurationError,
    LLMResponse,
    ToolCall,
    ToolContext,
    run,
    tool,
)
from durable_agents.messages import tool_error
from durable_agents.stores import sqlite_store
from durable_agents.testing import ScriptedLLM, SimulatedCrash, crash_after_tool_results


class Item(BaseModel):
    n: int


class Meter:
    """Counts handler runs and the most in flight at once."""

    def __init__(self) -> None:
        self.now = self.most = 0
        self.ran: list[int] = []

    async def work(self, args: Item, ctx: ToolContext) -> int:
        self.now += 1
        self.most = max(self.most, self.now)
        await asyncio.sleep(0.002)
        self.now -= 1
        self.ran.append(args.n)
        return args.n


def agent_for(meter: Meter, **limits: Any) -> Agent:
    post = tool(meter.work, name="post", input=Item)
    refund = tool(meter.work, name="refund", input=Item, requires_approval=True)
    return Agent("fan", "t", [post, refund], **limits)


def step(count: int, name: str = "post") -> ScriptedLLM:
    calls = [ToolCall(f"c{i}", name, {"n": i}) for i in range(count)]
    return ScriptedLLM([LLMResponse(tool_calls=calls), LLMResponse(text="done")])


async def test_at_most_six_handlers_run_at_once_by_default(tmp_path: Path) -> None:
    meter = Meter()
    store = sqlite_store(tmp_path / "s.db")
    result = await run(agent_for(meter), llm=step(40), message="go", session_id="s", store=store)
    assert result.status == "complete"
    assert meter.most == 6
    assert sorted(meter.ran) == list(range(40))


async def test_tool_concurrency_sets_the_bound(tmp_path: Path) -> None:
    meter = Meter()
    store = sqlite_store(tmp_path / "s.db")
    agent = agent_for(meter, tool_concurrency=2)
    await run(agent, llm=step(10), message="go", session_id="s", store=store)
    assert meter.most == 2


async def test_calls_past_the_cap_are_answered_and_never_run(tmp_path: Path) -> None:
    meter = Meter()
    store = sqlite_store(tmp_path / "s.db")
    agent = agent_for(meter, max_tool_calls_per_step=5)
    result = await run(agent, llm=step(8), message="go", session_id="s", store=store)
    assert result.status == "complete"
    assert sorted(meter.ran) == [0, 1, 2, 3, 4]
    results = [m for m in await store.load_messages("s") if m.role == "tool"]
    assert [m.tool_call_id for m in results] == [f"c{i}" for i in range(8)]  # call order
    kinds = [(tool_error(m.content) or {}).get("kind") for m in results]
    assert kinds == [None] * 5 + ["too-many-calls"] * 3


async def test_a_gated_call_past_the_cap_never_waits_for_approval(tmp_path: Path) -> None:
    meter = Meter()
    store = sqlite_store(tmp_path / "s.db")
    agent = agent_for(meter, max_tool_calls_per_step=1)
    calls = [ToolCall("c0", "post", {"n": 0}), ToolCall("c1", "refund", {"n": 1})]
    llm = ScriptedLLM([LLMResponse(tool_calls=calls), LLMResponse(text="done")])
    result = await run(agent, llm=llm, message="go", session_id="s", store=store)
    assert result.status == "complete"
    assert await store.load_approvals("s") == []
    assert meter.ran == [0]


async def test_a_crash_in_a_capped_step_repairs_every_call_once(tmp_path: Path) -> None:
    meter = Meter()
    store = sqlite_store(tmp_path / "s.db")
    agent = agent_for(meter, max_tool_calls_per_step=3)
    with pytest.raises(SimulatedCrash):
        await run(
            agent, llm=step(5), message="go", session_id="s",
            store=crash_after_tool_results(store),
        )  # fmt: skip
    resumed = await run(
        agent, llm=ScriptedLLM([LLMResponse(text="ok")]), session_id="s", store=store
    )
    assert resumed.status == "complete"
    results = [m for m in await store.load_messages("s") if m.role == "tool"]
    assert len(results) == 5  # one per call
    assert sorted(meter.ran) == [0, 1, 2]  # ran once, before the crash; none again


@pytest.mark.parametrize("field", ["tool_concurrency", "max_tool_calls_per_step"])
@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_the_limits_must_be_positive_ints(field: str, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=field):
        Agent("a", **{field: value})
