"""An agent module that answers offline, naming itself: served at
/agents/refunds/sessions/... by tests/cloudflare/test_dev_server_several_agents.py
(`scripts/dev --agents tests/agents/several`).

Its model says "refunds-desk heard: <the last user message> (turn <n>)", n counting the user's
messages of the session, so a test tells the agents' sessions (and their histories) apart.
"""

from __future__ import annotations

from typing import Any

import httpx

from durable_agents import LLM, Agent, LLMResponse, Message, ToolSpec
from durable_agents.llm import FunctionLLM

AGENT = Agent("refunds-desk", "You answer in one line.")


def make_deps(env: Any, http: httpx.AsyncClient) -> None:
    return None


def make_llm(env: Any) -> LLM:
    def answer(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        asked = [m.content for m in messages if m.role == "user"]
        return LLMResponse(f"refunds-desk heard: {asked[-1]} (turn {len(asked)})")

    return FunctionLLM(answer)
