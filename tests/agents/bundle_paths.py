"""The agent tests/test_bundle.py serves from its deploy bundle: one of each path the bundle
keeps, so a file of `python_modules/` that wrangler.toml's `[python_modules] exclude` leaves
out and one of them needs fails that test.

- its model: `llm_from_env` (the default `make_llm`): the test sets LLM_PROVIDER, so the
  OpenAI adapter reaches the test's scripted provider on 127.0.0.1 through the Worker's
  `fetch`, its answers streamed;
- `read_page`: a GET of `PAGES_URL` with the `http` the Worker hands `make_deps` (the
  kit's client over `fetch`), its JSON read into a model, and the host of an
  internationalised URL as httpx sends it (`idna`, without its UTS 46 tables);
- the notes server's tools (`MCPTools(url_setting="NOTES_MCP_URL")`), its stand-in an
  `mcp_stub` that the test serves over real HTTP (DEV_STUBS);
- `remind`: `ctx.schedule(...)`, a turn the session's Durable Object runs from its alarm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import BaseModel, Field

from durable_agents import Agent, ConfigurationError, ToolContext, tool
from durable_agents.llm.settings import setting
from durable_agents.mcp import MCPTools, mcp_stub

SETTINGS = ("PAGES_URL",)


class PageRef(BaseModel):
    path: str = Field(description="The page's path, e.g. '/about'", pattern=r"^/[a-z/]*$")


class Page(BaseModel):
    path: str
    status: int
    body: dict[str, Any]
    idn_host: str


class Reminder(BaseModel):
    text: str = Field(min_length=1, max_length=200)


@dataclass(frozen=True, slots=True)
class Deps:
    pages_url: str
    http: httpx.AsyncClient


@tool(safe_to_retry=True)
async def read_page(args: PageRef, ctx: ToolContext[Deps]) -> Page:
    """Read a page of the pages server."""
    response = await ctx.deps.http.get(ctx.deps.pages_url.rstrip("/") + args.path)
    idn_host = httpx.URL("https://bücher.example/").raw_host.decode()
    return Page(
        path=args.path, status=response.status_code, body=response.json(), idn_host=idn_host
    )


@tool
def remind(args: Reminder, ctx: ToolContext[Deps]) -> str:
    """Send a reminder to this session as a turn of its own, at once."""
    schedule = ctx.schedule(f"reminder: {args.text}", delay_seconds=0)
    return f"scheduled {schedule.schedule_id}"


notes = MCPTools(url_setting="NOTES_MCP_URL", name="notes")
AGENT = Agent(
    "bundle-paths", "Use the tools you are asked to use.", [read_page, remind], toolsets=[notes]
)


def make_deps(env: Any, http: httpx.AsyncClient) -> Deps:
    pages_url = setting(env, "PAGES_URL")
    if pages_url is None:
        raise ConfigurationError("PAGES_URL is not set")
    return Deps(str(pages_url), http)


# -- the notes server's stand-in ---------------------------------------------------------

NOTES: list[str] = []


@tool
def add_note(text: str) -> str:
    """Keep a note."""
    NOTES.append(text)
    return f"note {len(NOTES)} kept"


@tool(safe_to_retry=True)
def list_notes() -> list[str]:
    """Every note kept, oldest first."""
    return list(NOTES)


DEV_STUBS = {"NOTES_MCP_URL": mcp_stub(add_note, list_notes, name="notes")}
