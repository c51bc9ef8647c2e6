"""The agent `tests/cloudflare/test_dev_server_mcp.py` serves: no tools of its own, only
an MCP server's (`MCPTools(url_setting="MCP_URL")`), and a scripted model that shows
what reached it inside the Worker. Its move comes from the turn's message:

    notes       calls list_notes, then answers JSON: the names of the tools it was
                offered and list_notes' result
    delete N    calls slow_delete(note_id=N), then answers JSON: the result's kind
                ("ok" for a result that is not an error) and its content
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from durable_agents import Agent, LLMResponse, Message, ToolCall, ToolSpec
from durable_agents.llm import FunctionLLM
from durable_agents.mcp import MCPTools
from durable_agents.messages import tool_error

AGENT = Agent(
    "mcp-only", "Keep the user's notes with the notes server's tools.",
    toolsets=[MCPTools(url_setting="MCP_URL")],
)  # fmt: skip


def make_deps(env: Any, http: httpx.AsyncClient) -> None:
    return None  # MCPTools reads its setting and gets the fetch client from the run


def make_llm(env: Any) -> FunctionLLM:
    return FunctionLLM(play)


def play(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
    """The next move in the current turn, from the conversation alone (see the docstring)."""
    start = max(i for i, m in enumerate(messages) if m.role == "user")
    move, *rest = messages[start].content.split()
    results = [m.content for m in messages[start:] if m.role == "tool"]
    call_id = f"mcp_{len(messages)}"
    if move == "notes":
        if not results:
            return LLMResponse("Reading the notes.", [ToolCall(call_id, "list_notes", {})])
        offered = sorted(spec.name for spec in tools)
        return LLMResponse(json.dumps({"tools": offered, "list_notes": results[-1]}))
    if move == "delete":
        if not results:
            arguments = {"note_id": int(rest[0])}
            return LLMResponse("Deleting.", [ToolCall(call_id, "slow_delete", arguments)])
        error = tool_error(results[-1])
        kind = "ok" if error is None else error.get("kind")
        return LLMResponse(json.dumps({"kind": kind, "content": results[-1]}))
    return LLMResponse(f"I do not know {move!r}.")
