"""The triage bot: fetch an issue, post a one-line summary to Slack, say what it did.

An agent module (the protocol is in `durable_agents.cloudflare.agent_module`).
This is `examples/triage/agent.py`; the template's `src/agent.py` starts as a
copy of it, the one file to replace with your own agent.

- `get_issue` (`safe_to_retry`): GET `{ISSUES_API_URL}/issues/{id}`. A pure
  read, so a crash that loses its result just runs it again.
- `post_slack` (a side effect, the default): POST JSON to `SLACK_WEBHOOK_URL`
  with `Idempotency-Key: <ctx.idempotency_key>`. Never re-run by the kit; a
  crash that loses its result becomes a `tool-durability-error` for the model.

Offline (`LLM_PROVIDER` unset or `demo`), `make_llm` plays the bot with a
`FunctionLLM` that reads only the conversation it is sent, so it resumes as a
real model would. The dev server points the two settings, when empty, at
`DEV_STUBS`: an issue tracker that knows every issue and a webhook that logs
each post with its `Idempotency-Key`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

import httpx
from pydantic import BaseModel, Field

from durable_agents import (
    LLM,
    Agent,
    ConfigurationError,
    LLMResponse,
    Message,
    ToolCall,
    ToolContext,
    ToolSpec,
    Usage,
    tool,
)
from durable_agents.llm import FunctionLLM, llm_from_env
from durable_agents.llm.settings import setting

SETTINGS = ("ISSUES_API_URL", "SLACK_WEBHOOK_URL")
CHANNEL = "#triage"
INSTRUCTIONS = (
    "You triage incoming issues. Fetch the issue with get_issue, then post a one-line "
    f"summary to the {CHANNEL} Slack channel with post_slack, then report what you did. "
    "If a tool result is a tool-durability-error, the post may already have gone out: "
    "do not post again; say so and ask the user to check the channel."
)


class IssueRef(BaseModel):
    id: str = Field(description="The issue id, e.g. '42'", min_length=1, max_length=64)


class Issue(BaseModel):
    id: str
    title: str
    status: str


class SlackPost(BaseModel):
    channel: str = Field(description="Channel name, e.g. '#triage'", min_length=1)
    text: str = Field(description="The message text", min_length=1, max_length=4000)


class SlackReceipt(BaseModel):
    ok: bool
    status_code: int


@dataclass(frozen=True, slots=True)
class TriageDeps:
    """What the handlers get as `ctx.deps` (from `make_deps`)."""

    issues_api_url: str
    slack_webhook_url: str
    http: httpx.AsyncClient


@tool(safe_to_retry=True)
async def get_issue(args: IssueRef, ctx: ToolContext[TriageDeps]) -> Issue:
    """Fetch an issue by id: its title and status."""
    deps = ctx.deps
    url = f"{deps.issues_api_url.rstrip('/')}/issues/{quote(args.id, safe='')}"
    response = await deps.http.get(url)
    response.raise_for_status()
    data = response.json()
    return Issue(
        id=str(data.get("id", args.id)),
        title=str(data.get("title", "")),
        status=str(data.get("status", "unknown")),
    )


@tool(timeout=30)
async def post_slack(args: SlackPost, ctx: ToolContext[TriageDeps]) -> SlackReceipt:
    """Post a message to a Slack channel. Side-effecting: each call posts once."""
    deps = ctx.deps
    response = await deps.http.post(
        deps.slack_webhook_url,
        json={"channel": args.channel, "text": args.text},
        headers={"Idempotency-Key": ctx.idempotency_key},
    )
    response.raise_for_status()
    return SlackReceipt(ok=True, status_code=response.status_code)


AGENT = Agent("triage", INSTRUCTIONS, [get_issue, post_slack], max_steps=8, deps_type=TriageDeps)


def make_deps(env: Any, http: httpx.AsyncClient) -> TriageDeps:
    """The tools' settings from the Worker's env; ConfigurationError naming what is missing."""
    urls = {name: setting(env, name) for name in SETTINGS}
    missing = [name for name, value in urls.items() if value is None]
    if missing:
        raise ConfigurationError(
            f"{' and '.join(missing)} not set: the triage tools need them ([vars] in "
            "wrangler.toml, or .dev.vars)"
        )
    return TriageDeps(str(urls["ISSUES_API_URL"]), str(urls["SLACK_WEBHOOK_URL"]), http)


def make_llm(env: Any) -> LLM:
    """Offline (LLM_PROVIDER unset or demo): the scripted triage model. Else `llm_from_env`."""
    provider = setting(env, "LLM_PROVIDER")
    offline = provider is None and setting(env, "LLM_API_KEY") is None
    if offline or str(provider).strip().lower() == "demo":
        return FunctionLLM(play_triage)
    return llm_from_env(env)


# --- the offline model -------------------------------------------------------------

# "#ABC-1", "issue 42", or else the first number in the message.
_ISSUE_ID = re.compile(r"#([A-Za-z0-9_-]+)|\bissue\s+#?(\d+)|\b(\d+)\b", re.IGNORECASE)


def play_triage(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
    """The bot's next move in the current turn, read from the conversation alone.

    Asked about an issue ("triage issue 42"), it fetches it, posts a summary,
    and reports. Shown a `tool-durability-error` for the post, it says the
    post may have gone out and does not post again.
    """
    turn = _current_turn(messages)
    reply = _next_move(turn, {t.name for t in tools}, len(messages))
    prompt_chars = sum(len(m.content) for m in messages)
    out_chars = len(reply.text) + sum(len(json.dumps(c.arguments)) for c in reply.tool_calls)
    usage = Usage(max(1, prompt_chars // 4), max(1, out_chars // 4))
    return LLMResponse(reply.text, reply.tool_calls, usage)


def _next_move(turn: list[Message], tools: set[str], position: int) -> LLMResponse:
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
        text = f"Issue {issue_id}: {_summary(issue)}"
        if "post_slack" not in tools:
            return LLMResponse(text)
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
        "I am the offline triage model. Ask me to triage an issue, for example "
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
    # Tool results are JSON the kit wrote (bounded in depth), or plain text.
    try:
        data = json.loads(content)
    except (ValueError, RecursionError):
        return {"text": content}
    return data if isinstance(data, dict) else {"value": data}


def _summary(issue: dict[str, Any]) -> str:
    title = issue.get("title") or issue.get("text") or "(no title)"
    status = issue.get("status")
    return f"{title} ({status})" if status else str(title)


# --- dev stubs: what the dev server wires for an empty ISSUES_API_URL / SLACK_WEBHOOK_URL ---

_posted_keys: set[str] = set()


def issue_tracker_stub(
    method: str, path: str, body: bytes, headers: Mapping[str, str]
) -> tuple[int, Any]:
    """`GET /issues/{id}`: every issue exists, and is open."""
    match = re.fullmatch(r"/issues/([^/]+)", path)
    if method != "GET" or match is None:
        return 404, {"error": f"the dev issue tracker has no {method} {path}"}
    issue_id = unquote(match.group(1))
    return 200, {"id": issue_id, "title": f"Example issue {issue_id} (dev stub)", "status": "open"}


def slack_webhook_stub(
    method: str, path: str, body: bytes, headers: Mapping[str, str]
) -> tuple[int, Any]:
    """`POST /`: logs the post and its Idempotency-Key; a repeated key is not posted again."""
    if method != "POST" or path != "/":
        return 404, {"ok": False, "error": f"the dev webhook takes POST /, not {method} {path}"}
    try:
        post = json.loads(body)
    except ValueError:
        return 400, {"ok": False, "error": "invalid JSON"}
    if not isinstance(post, dict):
        return 400, {"ok": False, "error": "a post is a JSON object"}
    key = headers.get("idempotency-key", "")
    duplicate = key != "" and key in _posted_keys
    _posted_keys.add(key)
    print(
        f"dev: slack stub {'ignored a repeated' if duplicate else 'received a'} post to "
        f"{post.get('channel')}: {json.dumps(post.get('text'))} (Idempotency-Key {key or 'none'})"
    )
    return 200, {"ok": True, "duplicate": duplicate}


DEV_STUBS = {"ISSUES_API_URL": issue_tracker_stub, "SLACK_WEBHOOK_URL": slack_webhook_stub}
