"""The template agent: the seed's triage bot, one safe tool and one side-effecting tool.

- `get_issue` (`safe_to_retry`): GET `{issues_api_url}/issues/{id}`. A pure
  read, so a crash that loses its result just runs it again.
- `post_slack` (side-effecting, the default): POST JSON to the Slack webhook
  with `Idempotency-Key: <ctx.idempotency_key>`. Never re-run by the kit; a
  crash that loses its result becomes a `tool-durability-error` for the LLM.

The HTTP handlers read their settings and client from `ctx.deps`
(`TriageDeps`). The CLI demo swaps in offline handlers by name with
`run(..., tools={"get_issue": ..., "post_slack": ...})`.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

import httpx
from pydantic import BaseModel, Field

from .agent import Agent
from .tools import Tool, ToolContext, tool

INSTRUCTIONS = (
    "You triage incoming issues. Fetch the issue with get_issue, then post a one-line "
    "summary to the #triage Slack channel with post_slack, then report what you did. "
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
    """What the HTTP handlers need, passed as `run(..., deps=TriageDeps(...))`."""

    issues_api_url: str
    slack_webhook_url: str
    client: httpx.AsyncClient


def _deps(ctx: ToolContext) -> TriageDeps:
    if not isinstance(ctx.deps, TriageDeps):
        raise RuntimeError("the triage tools need run(..., deps=TriageDeps(...))")
    return ctx.deps


async def fetch_issue(args: IssueRef, ctx: ToolContext) -> Issue:
    deps = _deps(ctx)
    url = f"{deps.issues_api_url.rstrip('/')}/issues/{quote(args.id, safe='')}"
    response = await deps.client.get(url)
    response.raise_for_status()
    data = response.json()
    return Issue(
        id=str(data.get("id", args.id)),
        title=str(data.get("title", "")),
        status=str(data.get("status", "unknown")),
    )


async def send_to_slack(args: SlackPost, ctx: ToolContext) -> SlackReceipt:
    deps = _deps(ctx)
    response = await deps.client.post(
        deps.slack_webhook_url,
        json={"channel": args.channel, "text": args.text},
        headers={"Idempotency-Key": ctx.idempotency_key},
    )
    response.raise_for_status()
    return SlackReceipt(ok=True, status_code=response.status_code)


get_issue: Tool = tool(
    name="get_issue",
    description="Fetch an issue by id: its title and status.",
    input=IssueRef,
    output=Issue,
    safe_to_retry=True,
    handler=fetch_issue,
)

post_slack: Tool = tool(
    name="post_slack",
    description="Post a message to a Slack channel. Side-effecting: each call posts once.",
    input=SlackPost,
    output=SlackReceipt,
    handler=send_to_slack,
    timeout=30,
)


def triage_agent(max_steps: int = 8) -> Agent:
    """The template agent. Its handlers speak HTTP; override them by name to run offline."""
    return Agent("triage", INSTRUCTIONS, [get_issue, post_slack], max_steps=max_steps)
