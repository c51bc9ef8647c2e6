"""The chat page the dev server serves at `GET /` (setting `CHAT_PAGE` = "on"):
`chat_page_html()` reads it from chat_page.html, beside this module.

One self-contained page (inline CSS and JS, nothing fetched but the API): a person
gives the API token and a session name, sends a message and watches the turn stream
in, approves or denies calls, cancels and resumes; a reload mid-turn replays from
the last event id it kept. What it does for a person: docs/http-api.md ("The chat
page"); the server that serves it: docs/dev-server.md. Text from the API is only
ever inserted as text.

Stable hooks for tests (tests/cloudflare/test_chat_page.py drives it in Chromium):
`#transcript` holds one `.msg` per stored message with `data-position` and
`data-role` (tool results also `data-kind` when they are an error); `#live` is the
streaming bubble; `#status` has `data-status` (idle, running, complete, cancelled,
error, awaiting_approval, ...); `#older` (with `data-count`) while older messages
are not shown; `.approval[data-tool-call-id]` with `.approve` / `.deny` buttons.
"""

from __future__ import annotations

import functools

from .._resources import read_text

__all__ = ["chat_page_html"]


@functools.cache
def chat_page_html() -> str:
    """The page's HTML, as `GET /` answers it (read from the package once)."""
    return read_text("durable_agents.cloudflare", "chat_page.html")
