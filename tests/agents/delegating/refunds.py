"""The refunds agent the support agent calls (tests/agents/delegating/support.py), served
at /agents/refunds/sessions/...

Its model, offline: "refund <order>" calls `refund_order`, a side effect that reads the
order, then POSTs the refund with the call's idempotency key to the payments API
(PAYMENTS_API_URL; the test's fake counts them, refunds once per key, and can hold
either request). The key is the same for every run of the call, so the tool is declared
`safe_to_retry`: a run that a crash cut short is run again, and the API refunds once.
With the result it answers "refunds: refunded <order>" (or, for a lost result of a call
the kit would not run again, a tool-durability-error, "refunds: the refund of <order>
may have gone through").
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


@tool(safe_to_retry=True)  # the API refunds once per Idempotency-Key
async def refund_order(args: OrderRef, ctx: ToolContext[tuple[httpx.AsyncClient, str]]) -> Any:
    """Refund an order in full."""
    http, url = ctx.deps
    order = (await http.get(f"{url}/orders/{args.order_id}")).json()
    answer = await http.post(
        f"{url}/refunds",
        json={"order_id": args.order_id, "amount_cents": order["amount_cents"]},
        headers={"Idempotency-Key": ctx.idempotency_key},
    )
    return answer.json()


AGENT = Agent("refunds", "You refund orders.", [refund_order])


def make_deps(env: Any, http: httpx.AsyncClient) -> tuple[httpx.AsyncClient, str]:
    return http, str(setting(env, "PAYMENTS_API_URL") or "").rstrip("/")


def make_llm(env: Any) -> LLM:
    def answer(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        order = next(m for m in reversed(messages) if m.role == "user").content.split()[-1]
        last = messages[-1]
        if last.role == "user":
            return LLMResponse(
                tool_calls=[ToolCall("call_refund", "refund_order", {"order_id": order})]
            )
        if tool_error(last.content) is not None:
            return LLMResponse(f"refunds: the refund of {order} may have gone through")
        return LLMResponse(f"refunds: refunded {order}")

    return FunctionLLM(answer)
