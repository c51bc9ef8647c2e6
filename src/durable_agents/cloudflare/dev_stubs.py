"""The dev server's stubs: `/__dev/<NAME>/...` answered by the agent module's stub for the
setting NAME (`DEV_STUBS` in agent.py), while the setting `DEV_STUBS` is "on" (the dev
server's doing, never set on Cloudflare). The guide is docs/dev-server.md.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping

from .. import _json
from .agent_module import DEV_STUB_PREFIX, DevStub
from .bodies import BodyReader
from .wire import Reply, error_reply, internal_error

__all__ = ["serve_dev_stub"]


async def serve_dev_stub(
    method: str,
    path: str,
    headers: Mapping[str, str],
    body: bytes | BodyReader,
    stubs: Mapping[str, DevStub],
    query: str = "",
) -> Reply:
    """Answer `/__dev/<NAME>/...` with the stub for setting NAME (see `agent_module`); the
    stub's `path` carries the request's query string (`query`, without "?"), if any."""
    name, _, rest = path[len(DEV_STUB_PREFIX) :].partition("/")
    stub = stubs.get(name)
    if stub is None:
        return error_reply(
            404, "not-found", f"no dev stub for {name[:100]!r}; the agent has {sorted(stubs)}"
        )
    raw = body if isinstance(body, bytes) else await body()
    try:
        _json.check_text_depth(raw)  # a stub may parse it: in a Worker, deep JSON is a crash
    except _json.JSONTooDeepError:
        return error_reply(
            400, "invalid-json", f"the body nests deeper than {_json.MAX_DEPTH} levels"
        )
    try:
        answer = stub(method.upper(), "/" + rest + (f"?{query}" if query else ""), raw, headers)
        result = await answer if inspect.isawaitable(answer) else answer
        status, payload = result
        if not isinstance(status, int) or not 100 <= status <= 599:
            raise TypeError(f"a stub returns (status, json_body), got status {status!r}")
        json.dumps(payload)  # a value that cannot be sent is the stub's bug, said here
    except Exception as exc:
        return internal_error(exc, f"the dev stub for {name}")
    if payload is None:  # no body (an MCP server's 202 to a notification)
        return Reply(status, None, text="")
    return Reply(status, payload)
