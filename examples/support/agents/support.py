"""The support desk: talks to the customer, and hands work to two other agents.

An agent module (the protocol is in `durable_agents.cloudflare.agent_module`), served at
/agents/support/sessions/... next to the agents it calls (`scripts/dev --agents
examples/support/agents`; in your project, the three files in `src/agents/`):

- `refunds` (`agent_tool`): a turn of the refunds agent (`agents/refunds.py`, which is
  examples/refunds/agent.py): it looks the order up and refunds it once a person
  approved the refund. Its approval is listed and decided from this session too
  (`GET /agents/support/sessions/{name}/approvals`), and this turn waits for it.
- `researcher` (`agent_tool`): a turn of the read-only researcher (`agents/researcher.py`).

Each call runs the other agent's turn in a session of its own, exactly once: a crash
anywhere finishes that turn or reads its answer back, never starting a second, and
never refunding twice (docs/several-agents.md).

Offline (`LLM_PROVIDER` unset or `demo`), `make_llm` plays the desk with a `FunctionLLM`:
a message asking to refund an order goes to `refunds`, any other to `researcher`, and the answer
says what that agent answered. Else `llm_from_env`.
"""

from __future__ import annotations

from typing import Any

import httpx

from durable_agents import LLM, Agent, LLMResponse, Message, ToolCall, ToolSpec, agent_tool
from durable_agents.llm import FunctionLLM, llm_from_env
from durable_agents.llm.settings import setting
from durable_agents.messages import tool_error

AGENT = Agent(
    "support",
    "You help the shop's customers. Refunds are the refunds agent's: ask it with the order's "
    "id. Questions about policies are the researcher's. Tell the customer what they said.",
    [
        agent_tool("refunds", description="Ask the refunds agent to refund an order."),
        agent_tool("researcher", description="Ask the researcher about the shop's policies."),
    ],
    max_steps=6,
)


def make_deps(env: Any, http: httpx.AsyncClient) -> None:
    return None


def make_llm(env: Any) -> LLM:
    """Offline (LLM_PROVIDER unset or demo): `play_support`. Else `llm_from_env`."""
    provider = setting(env, "LLM_PROVIDER")
    if provider is None or str(provider).strip().lower() == "demo":
        return FunctionLLM(play_support)
    return llm_from_env(env)


def play_support(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
    """Hand the customer's message to the agent it is for, then say what it answered."""
    asked = next(m.content for m in reversed(messages) if m.role == "user")
    last = messages[-1]
    if last.role == "user":
        words = asked.lower()
        agent = "refunds" if "refund" in words and "order" in words else "researcher"
        call = ToolCall(f"ask_{len(messages)}", agent, {"message": asked})
        return LLMResponse(tool_calls=[call])
    error = tool_error(last.content)
    if error is not None:
        return LLMResponse(f"Sorry, the {last.tool_name} agent could not answer: {error['error']}")
    return LLMResponse(f"The {last.tool_name} agent says: {last.content}")
