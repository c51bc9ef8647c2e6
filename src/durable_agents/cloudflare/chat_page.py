"""The chat page the dev server serves at `GET /` (setting `CHAT_PAGE` = "on"):
`chat_page_html()` reads it from chat_page.html, beside this module.

One self-contained page (inline CSS and JS, nothing fetched but the API): a person
gives the API token and a session name, sends a message and watches the turn come
in, approves or denies calls, cancels and resumes. Turns go over the session's chat
socket (`GET /sessions/{name}/ws`, the AI SDK's WebSocketChatTransport frames,
chat_socket.py; the token in each frame, never in the URL): a message is a `send`,
Cancel an `abort`, a decision the tool approval response in a `send`; opening, a
reload mid-turn and a lost socket send a `resume`. The stored messages, the truth of
the transcript, come over REST (`GET /sessions/{name}?after=N`) when a turn ends. What
it does for a person: docs/http-api.md ("The chat page"); the server that serves it:
docs/dev-server.md. Text from the API is only ever inserted as text.

Stable hooks for tests (tests/cloudflare/test_chat_page.py drives it in Chromium):
`#transcript` holds one `.msg` per stored message with `data-position` and
`data-role` (tool results also `data-kind` when they are an error); `#sent` is what
was sent, until it is stored; `#live` is the running turn's reply (its `.text` parts
and `.tool-call[data-tool-call-id]` parts, with `.arguments` and `.result`);
`#status` has `data-status` (idle, running, complete, cancelled, interrupted, error,
awaiting_approval, ...); `#older` (with `data-count`) while older messages are not
shown; `.approval[data-tool-call-id]` with `.approve` / `.deny` buttons.
"""

from __future__ import annotations

import functools

from .._resources import read_text

__all__ = ["chat_page_html"]


@functools.cache
def chat_page_html() -> str:
    """The page's HTML, as `GET /` answers it (read from the package once)."""
    return read_text("durable_agents.cloudflare", "chat_page.html")
