"""The researcher: answers questions from the shop's policies, and changes nothing.

An agent module (the protocol is in `durable_agents.cloudflare.agent_module`), served at
/agents/researcher/sessions/... (`scripts/dev --agents examples/support/agents`), and
called by the support agent (`agent_tool("researcher")`, examples/support/agents/support.py).

- `search_policies` (`safe_to_retry`): the policies whose words match the query. A pure
  read of this module's `POLICIES`: a crash that loses its result just runs it again.
  A real one would read your help centre over `ctx.deps` (the Worker's HTTP client).

Offline (`LLM_PROVIDER` unset or `demo`), `make_llm` plays it with a `FunctionLLM`: it
searches for the question, then answers with what it found. Else `llm_from_env`.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
from pydantic import BaseModel, Field

from durable_agents import LLM, Agent, LLMResponse, Message, ToolCall, ToolContext, ToolSpec, tool
from durable_agents.llm import FunctionLLM, llm_from_env
from durable_agents.llm.settings import setting

POLICIES = {
    "refunds": "Orders can be refunded in full within 30 days of delivery.",
    "shipping": "Orders ship within 2 working days; tracking comes by email.",
    "returns": "Returns are free: print the label from your order page.",
}


class Query(BaseModel):
    query: str = Field(description="What to look up, in a few words", min_length=1, max_length=500)


@tool(safe_to_retry=True)
async def search_policies(args: Query, ctx: ToolContext) -> dict[str, str]:
    """The shop's policies that match the query, by topic."""
    words = set(re.findall(r"[a-z]+", args.query.lower()))
    return {topic: text for topic, text in POLICIES.items() if words & {topic, topic[:-1]}}


AGENT = Agent(
    "researcher",
    "You answer questions about the shop's policies with search_policies. You change nothing.",
    [search_policies],
    max_steps=4,
)


def make_deps(env: Any, http: httpx.AsyncClient) -> None:
    return None


def make_llm(env: Any) -> LLM:
    """Offline (LLM_PROVIDER unset or demo): `play_researcher`. Else `llm_from_env`."""
    provider = setting(env, "LLM_PROVIDER")
    if provider is None or str(provider).strip().lower() == "demo":
        return FunctionLLM(play_researcher)
    return llm_from_env(env)


def play_researcher(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
    """Search for the question, then answer with what was found."""
    question = next(m.content for m in reversed(messages) if m.role == "user")
    last = messages[-1]
    if last.role == "user":
        call = ToolCall(f"search_{len(messages)}", "search_policies", {"query": question})
        return LLMResponse(tool_calls=[call])
    try:
        found = json.loads(last.content)
    except ValueError:
        found = {}
    if not isinstance(found, dict) or not found or "kind" in found:
        return LLMResponse("I found no policy about that.")
    return LLMResponse(" ".join(str(text) for text in found.values()))
