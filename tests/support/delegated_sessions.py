"""A parent session whose agent tool ran a child session, stored in a SQLite file: what
the timeline and `sessions show` tests link both ways."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from durable_agents import Agent, LLMResponse, LocalAgent, ToolCall, ToolContext, run, tool
from durable_agents.agent_tools import agent_tool, child_session_name
from durable_agents.stores import sqlite_store
from durable_agents.testing import ScriptedLLM

PARENT = "support-1"
CALL = "call_p1"
CHILD = child_session_name(PARENT, CALL)


class RefundArgs(BaseModel):
    order: str


@tool
async def refund(args: RefundArgs, ctx: ToolContext) -> str:
    """Refund an order."""
    return f"refunded {args.order}"


REFUNDS = Agent("refunds", "You refund orders.", [refund])
SUPPORT = Agent(
    "support", "You help customers.", [agent_tool("refunds", description="Refunds orders.")]
)


async def store_delegated_sessions(path: Path) -> None:
    """Session `PARENT` (agent support) asks `refunds` once, as call `CALL`; its child
    `CHILD` refunds order 42."""
    parent_llm = ScriptedLLM(
        [
            LLMResponse(tool_calls=[ToolCall(CALL, "refunds", {"message": "refund order 42"})]),
            LLMResponse("Your order is refunded."),
        ]
    )
    child_llm = ScriptedLLM(
        [
            LLMResponse(tool_calls=[ToolCall("call_r1", "refund", {"order": "42"})]),
            LLMResponse("done: refunded 42"),
        ]
    )
    async with sqlite_store(path) as store:
        result = await run(
            SUPPORT, llm=parent_llm, message="please refund 42", session_id=PARENT, store=store,
            agents={"refunds": LocalAgent(REFUNDS, llm=child_llm)},
        )  # fmt: skip
        assert result.status == "complete", result
