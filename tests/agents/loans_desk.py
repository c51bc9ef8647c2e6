"""A library's loans desk whose every tool is an MCP server's (its catalogue), with that
server's stand-in as a dev stub (`mcp_stub`, plain-parameter tools). Issue 32 ran `.ci/run`
with it as src/agent.py: `cp tests/agents/loans_desk.py src/agent.py && scripts/test`."""

from typing import Any

import httpx

from durable_agents import Agent, tool
from durable_agents.mcp import MCPTools, mcp_stub

catalog = MCPTools(url_setting="CATALOG_MCP_URL", name="catalog", approve_destructive=True)
AGENT = Agent("loans", "Find books, place holds and renew loans.", toolsets=[catalog])


def make_deps(env: Any, http: httpx.AsyncClient) -> None:
    return None  # MCPTools reads its setting and gets its client from the run


# -- the catalogue's stand-in, while CATALOG_MCP_URL is empty --------------------------

HOLDS: list[dict[str, Any]] = []


@tool(safe_to_retry=True)
def search_catalog(title: str, limit: int = 5) -> list[dict[str, Any]]:
    """Find books by title.

    Args:
        title: words of the title
        limit: at most this many books
    """
    return [{"book_id": 7, "title": title.title(), "on_shelf": True}][:limit]


@tool
def place_hold(book_id: int, reader: str) -> str:
    """Place a hold on a book for a reader."""
    HOLDS.append({"book_id": book_id, "reader": reader})
    return f"hold {len(HOLDS)} placed for {reader}"


@tool
def renew_loan(loan_id: str, weeks: int = 2) -> dict[str, Any]:
    """Renew a loan by some weeks."""
    return {"loan_id": loan_id, "renewed_weeks": weeks}


DEV_STUBS = {
    "CATALOG_MCP_URL": mcp_stub(
        search_catalog,
        place_hold,
        renew_loan,
        name="catalog",
        annotations={
            "place_hold": {"destructiveHint": False},
            "renew_loan": {"destructiveHint": True},
        },
    )
}
