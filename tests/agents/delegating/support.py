"""A support agent that hands refunds to another agent (`agent_tool("refunds")`), served
at /agents/support/sessions/... by tests/cloudflare/test_dev_server_agent_tools.py
(`scripts/dev --agents tests/agents/delegating`).

Its model, offline: "refund <order>" calls the refunds agent with that message ("pay
<order>": the payouts agent, whose call waits for approval); "refund <order> and check
<other>" also calls `check_order` on <other> in the same step (a read
of the payments API, which the test can hold: the child's turn is then over while the
step's results are not stored). With the results it answers "support: <the agent's
answer>".
"""

from __future__ import annotations

from typing import Any

import httpx
from pydantic import BaseModel

from durable_agents import (
    LLM,
    Agent,
    LLMResponse,
    Message,
    ToolCall,
    ToolContext,
    ToolSpec,
    agent_tool,
    tool,
)
from durable_agents.llm import FunctionLLM
from durable_agents.llm.settings import setting

SETTINGS = ("PAYMENTS_API_URL",)


class OrderRef(BaseModel):
    order_id: str


@tool(safe_to_retry=True)
async def check_order(args: OrderRef, ctx: ToolContext[tuple[httpx.AsyncClient, str]]) -> Any:
    """Read an order's state."""
    http, url = ctx.deps
    answer = await http.get(f"{url}/orders/{args.order_id}")
    return answer.json()


AGENT = Agent(
    "support",
    "You help customers; refunds are the refunds agent's.",
    [
        agent_tool("refunds", description="Ask the refunds agent to refund an order."),
        agent_tool("payouts", description="Ask the payouts agent to pay an order back."),
        check_order,
    ],
)


def make_deps(env: Any, http: httpx.AsyncClient) -> tuple[httpx.AsyncClient, str]:
    return http, str(setting(env, "PAYMENTS_API_URL") or "").rstrip("/")


def make_llm(env: Any) -> LLM:
    def answer(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        asked = next(m for m in reversed(messages) if m.role == "user")
        last = messages[-1]
        if last.role == "user":
            words = asked.content.split()
            agent = "payouts" if words[0] == "pay" else "refunds"
            calls = [ToolCall(f"call_{agent}", agent, {"message": f"{words[0]} {words[1]}"})]
            if "check" in words:
                calls.append(ToolCall("call_check", "check_order", {"order_id": words[-1]}))
            return LLMResponse(tool_calls=calls)
        child = next(m for m in messages if m.role == "tool" and m.tool_name != "check_order")
        return LLMResponse(f"support: {child.content}")

    return FunctionLLM(answer)
