"""The kinds of a failed tool call's result: one named set, wire strings that never change."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from durable_agents import (
    Agent,
    LLMResponse,
    Message,
    ToolCall,
    ToolContext,
    ToolDurabilityError,
    ToolErrorKind,
    run,
    tool,
)
from durable_agents.cloudflare import InvocationLimitError
from durable_agents.messages import tool_error, tool_error_content
from durable_agents.testing import ScriptedLLM

WIRE = {
    "unknown-tool",
    "invalid-arguments",
    "tool-failed",
    "tool-timeout",
    "invalid-output",
    "result-too-large",
    "tool-denied",
    "too-many-calls",
    "tool-durability-error",
    "tool-retry",
    "unknown-agent",
    "agent-depth-exceeded",
    "agent-failed",
}


def test_the_kinds_are_the_stored_wire_strings() -> None:
    assert {kind.value for kind in ToolErrorKind} == WIRE
    assert all(kind == kind.value for kind in ToolErrorKind)  # a str: compares with parsed JSON


@pytest.mark.parametrize("kind", list(ToolErrorKind))
def test_error_content_is_error_then_kind(kind: ToolErrorKind) -> None:
    content = tool_error_content(kind, "it failed: é")
    assert content == json.dumps({"error": "it failed: é", "kind": kind.value}, ensure_ascii=False)
    parsed = tool_error(content)
    assert parsed is not None
    assert parsed["kind"] == kind


def test_durability_error_keeps_its_four_keys_in_order() -> None:
    error = ToolDurabilityError("post_slack", "call_1", "lost")
    assert error.kind is ToolErrorKind.TOOL_DURABILITY_ERROR
    assert error.code == "tool-durability-error"
    assert error.to_content() == (
        '{"error": "lost", "kind": "tool-durability-error", "toolName": "post_slack", '
        '"toolCallId": "call_1"}'
    )
    stored = Message.tool_result(ToolCall("call_1", "post_slack"), error.to_content())
    again = ToolDurabilityError.from_message(stored)
    assert again is not None
    assert (again.tool_name, again.tool_call_id, again.message) == ("post_slack", "call_1", "lost")


async def test_a_fetch_cloudflare_refused_for_the_invocations_limit_is_a_plain_failure() -> None:
    """The request was never sent: an unsafe tool that meets it failed; nothing may have
    happened, so it is `tool-failed`, not `tool-durability-error`."""
    assert not issubclass(InvocationLimitError, httpx.TransportError)

    async def post(args: Any, ctx: ToolContext) -> str:
        request = httpx.Request("POST", "https://hooks.example/post")
        raise InvocationLimitError(
            "Error: Too many subrequests by single Worker invocation.", request=request
        )

    agent = Agent("a", "t", [tool(post, input={"type": "object"})])
    calls = [ToolCall("c1", "post", {"text": "hi"})]
    llm = ScriptedLLM([LLMResponse(tool_calls=calls), LLMResponse(text="ok")])
    result = await run(agent, llm=llm, message="go")
    error = tool_error(result.messages[3].content)
    assert error is not None
    assert error["kind"] == ToolErrorKind.TOOL_FAILED
    assert "Too many subrequests" in error["error"]
