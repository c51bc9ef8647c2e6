"""An agent module whose one tool waits for a person: served at /agents/refunds/... by
tests/cloudflare/test_dev_server_chat_http.py and test_dev_server_chat_ws.py (`scripts/dev
--agents tests/agents/chat`), where the AI SDK's own `Chat` approves the call through POST
.../chat and over the chat socket.

Offline model: asked anything, it calls `refund` (order "A-1", 4999 cents), which
requires approval; shown the call's result, it says so. `refund` POSTs to
`PAYMENTS_API_URL` (the test's `PaymentsAPI`) with the call's idempotency key, so the
test counts how often it ran.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from durable_agents import (
    LLM,
    Agent,
    LLMResponse,
    Message,
    ToolCall,
    ToolContext,
    ToolSpec,
    tool,
)
from durable_agents.llm import FunctionLLM
from durable_agents.llm.settings import setting


@dataclass(frozen=True, slots=True)
class Payments:
    url: str
    http: httpx.AsyncClient


@tool(requires_approval=True)
async def refund(ctx: ToolContext[Payments], order_id: str, amount_cents: int) -> dict[str, Any]:
    """Refund part of an order. Side-effecting: runs once, after a person approves."""
    response = await ctx.deps.http.post(
        f"{ctx.deps.url.rstrip('/')}/refunds",
        json={"order_id": order_id, "amount_cents": amount_cents, "reason": "asked in chat"},
        headers={"Idempotency-Key": ctx.idempotency_key},
    )
    response.raise_for_status()
    return dict(response.json())


AGENT = Agent("chat-refunds", "You refund orders.", [refund], deps_type=Payments)


def make_deps(env: Any, http: httpx.AsyncClient) -> Payments:
    return Payments(str(setting(env, "PAYMENTS_API_URL")), http)


def make_llm(env: Any) -> LLM:
    def answer(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        last = messages[-1]
        if last.role == "tool":
            return LLMResponse(f"{last.tool_name} answered: {last.content}")
        call = ToolCall(
            f"refund_{len(messages)}", "refund", {"order_id": "A-1", "amount_cents": 4999}
        )
        return LLMResponse(tool_calls=[call])

    return FunctionLLM(answer)
