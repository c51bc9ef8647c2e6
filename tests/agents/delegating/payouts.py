"""A child agent whose one tool waits for a person's approval: the support agent
(support.py) calls it for "pay <order>"; tests/cloudflare/test_dev_server_agent_tools.py
lists and decides the approval from the support agent's session.

Its model, offline: "pay <order>" calls `payout`, which POSTs a refund of the order to
the payments API (PAYMENTS_API_URL) with the call's idempotency key, once approved; with
the result it answers "payouts: paid <order>", or "payouts: <order> was not paid" when
the call was denied.
"""

from __future__ import annotations

from typing import Any

import httpx
from pydantic import BaseModel

from durable_agents import LLM, Agent, LLMResponse, Message, ToolCall, ToolContext, ToolSpec, tool
from durable_agents.llm import FunctionLLM
from durable_agents.llm.settings import setting
from durable_agents.messages import tool_error

SETTINGS = ("PAYMENTS_API_URL",)


class OrderRef(BaseModel):
    order_id: str


@tool(requires_approval=True)
async def payout(args: OrderRef, ctx: ToolContext[tuple[httpx.AsyncClient, str]]) -> Any:
    """Pay an order's amount back, once a person approved it."""
    http, url = ctx.deps
    answer = await http.post(
        f"{url}/refunds",
        json={"order_id": args.order_id, "amount_cents": 100},
        headers={"Idempotency-Key": ctx.idempotency_key},
    )
    return answer.json()


AGENT = Agent("payouts", "You pay orders back, once approved.", [payout])


def make_deps(env: Any, http: httpx.AsyncClient) -> tuple[httpx.AsyncClient, str]:
    return http, str(setting(env, "PAYMENTS_API_URL") or "").rstrip("/")


def make_llm(env: Any) -> LLM:
    def answer(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        order = next(m for m in reversed(messages) if m.role == "user").content.split()[-1]
        last = messages[-1]
        if last.role == "user":
            return LLMResponse(tool_calls=[ToolCall("call_payout", "payout", {"order_id": order})])
        if tool_error(last.content) is not None:
            return LLMResponse(f"payouts: {order} was not paid")
        return LLMResponse(f"payouts: paid {order}")

    return FunctionLLM(answer)
