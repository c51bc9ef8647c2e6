"""Reading the MCP traffic the check forwards: JSON-RPC messages in a request's body or a
server's answer (a JSON body or an event stream), and the idempotency key in `_meta`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from ..._http.sse import sse_events, sse_lines
from ...mcp import IDEMPOTENCY_KEY_META


def json_rpc(body: bytes) -> dict[str, Any] | None:
    """The JSON-RPC message a request's body is (an MCP client's), or None."""
    if not body.lstrip().startswith(b"{"):
        return None
    try:
        message = json.loads(body)
    except ValueError:
        return None
    ok = isinstance(message, dict) and message.get("jsonrpc") == "2.0"
    return message if ok else None


def meta_key(message: Mapping[str, Any]) -> str | None:
    """The idempotency key a `tools/call` carries in its `_meta` (`MCPTools` sends it)."""
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    key = meta.get(IDEMPOTENCY_KEY_META) if isinstance(meta, dict) else None
    return key if isinstance(key, str) else None


async def messages_in(body: bytes) -> list[dict[str, Any]]:
    """The JSON-RPC messages of an MCP server's answer: a JSON body, or an event stream's
    events (read as the kit's own SSE reader reads them)."""
    text = body.decode("utf-8", "replace")
    whole = json_value(text)
    if whole is not None:
        return [m for m in (whole if isinstance(whole, list) else [whole]) if isinstance(m, dict)]

    async def chunks() -> AsyncIterator[bytes]:
        yield body

    found = []
    async for event in sse_events(sse_lines(chunks())):
        value = json_value(event.data)
        if isinstance(value, dict):
            found.append(value)
    return found


def json_value(text: str) -> Any:
    """`text` as JSON, or None when it is not JSON."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None
