"""An offline, deterministic triage model: what runs when no LLM is configured.

It plays the seed's triage bot with the tools `get_issue` and `post_slack`:
asked about an issue ("triage issue 42"), it fetches it, posts a summary to
Slack, and reports. It reads only the conversation it is sent, so it resumes
like a real model would: shown a `tool-durability-error` for the post, it
says so and does not post again. Good for the CLI demo, the dev server with
no key, and tests; useless for anything else.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .. import _json
from ..messages import LLMResponse, Message, ToolCall, ToolSpec, Usage

# "#ABC-1", "issue 42", or else the first number in the message.
_ISSUE_ID = re.compile(r"#([A-Za-z0-9_-]+)|\bissue\s+#?(\d+)|\b(\d+)\b", re.IGNORECASE)
CHANNEL = "#triage"


class DemoLLM:
    """The offline triage model. `chat()` never touches the network."""

    model = "demo"

    async def chat(self, messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        turn = _current_turn(messages)
        available = {t.name for t in tools}
        reply = self._next(turn, available, len(messages))
        prompt_chars = sum(len(m.content) for m in messages)
        out_chars = len(reply.text) + sum(len(json.dumps(c.arguments)) for c in reply.tool_calls)
        usage = Usage(max(1, prompt_chars // 4), max(1, out_chars // 4))
        return LLMResponse(reply.text, reply.tool_calls, usage)

    def _next(self, turn: list[Message], tools: set[str], position: int) -> LLMResponse:
        ask = turn[0].content if turn and turn[0].role == "user" else ""
        results = {m.tool_name: m for m in turn if m.role == "tool"}
        issue_id = _issue_id(ask)

        if "post_slack" in results:
            post = _parse(results["post_slack"].content)
            if post.get("kind") == "tool-durability-error":
                return LLMResponse(
                    f"I may already have posted about issue {issue_id} to {CHANNEL}: the run "
                    "stopped before the post's result was saved. I will not post again; please "
                    f"check {CHANNEL} for the message."
                )
            if "error" in post:
                return LLMResponse(f"Posting to {CHANNEL} failed: {post['error']}")
            return LLMResponse(f"Triaged issue {issue_id} and posted a summary to {CHANNEL}.")

        if "get_issue" in results:
            issue = _parse(results["get_issue"].content)
            if "error" in issue:
                return LLMResponse(f"I could not fetch issue {issue_id}: {issue['error']}")
            if "post_slack" not in tools:
                return LLMResponse(f"Issue {issue_id}: {_summary(issue)}")
            text = f"Issue {issue_id}: {_summary(issue)}"
            return LLMResponse(
                "Posting the summary.",
                [ToolCall(f"demo_{position}", "post_slack", {"channel": CHANNEL, "text": text})],
            )

        if issue_id and "get_issue" in tools:
            return LLMResponse(
                f"Looking up issue {issue_id}.",
                [ToolCall(f"demo_{position}", "get_issue", {"id": issue_id})],
            )
        return LLMResponse(
            "I am the offline demo model. Ask me to triage an issue, for example "
            "'triage issue 42', and I will look it up and post a summary to Slack."
        )


def _current_turn(messages: list[Message]) -> list[Message]:
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role == "user":
            return messages[index:]
    return []


def _issue_id(text: str) -> str | None:
    match = _ISSUE_ID.search(text)
    return next((g for g in match.groups() if g), None) if match else None


def _parse(content: str) -> dict[str, Any]:
    try:
        data = _json.loads(content)
    except ValueError:  # not JSON, or nested too deep to parse
        return {"text": content}
    return data if isinstance(data, dict) else {"value": data}


def _summary(issue: dict[str, Any]) -> str:
    title = issue.get("title") or issue.get("text") or "(no title)"
    status = issue.get("status")
    return f"{title} ({status})" if status else str(title)
