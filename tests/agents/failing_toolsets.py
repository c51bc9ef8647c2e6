"""The agent `tests/cloudflare/test_dev_server_toolset_down.py` serves: a tool of its own,
`lookup`, and two toolsets whose tools cannot be had, each failing as a remote server
does at run time:

- `Clashing`, a toolset of the test's own, lists a tool named `lookup` (the agent's
  own) for a session whose name starts with "clash", as a server that starts listing a
  name the agent already has; nothing for any other session.
- `MCPTools(url_setting="MCP_URL")`, pointed at a port nothing listens on.

Its model answers in text; no turn gets that far.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx
from pydantic import BaseModel

from durable_agents import Agent, LLMResponse, Message, RunContext, Tool, ToolSpec, tool
from durable_agents.llm import FunctionLLM
from durable_agents.mcp import MCPTools


class Query(BaseModel):
    query: str


@tool(safe_to_retry=True)
def lookup(args: Query) -> str:
    """Look a word up."""
    return f"{args.query}: found"


class Clashing:
    """Lists a tool named like the agent's own, for the sessions named "clash..."."""

    settings: tuple[str, ...] = ()

    async def list_tools(self, ctx: RunContext[Any]) -> Sequence[Tool]:
        if not (ctx.session_name or "").startswith("clash"):
            return []
        theirs = tool(name="lookup", description="Theirs.", input={}, handler=lambda a, c: "x")
        return [theirs]


AGENT = Agent(
    "failing-toolsets", "Look words up.", [lookup],
    toolsets=[Clashing(), MCPTools(url_setting="MCP_URL")],
)  # fmt: skip


def make_deps(env: Any, http: httpx.AsyncClient) -> None:
    return None


def make_llm(env: Any) -> FunctionLLM:
    return FunctionLLM(play)


def play(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
    return LLMResponse("Nothing to look up.")
