"""The httpx client the kit builds when none is given, and where it sends.

An LLM adapter without an injected client, `MCPTools` without a run's
`http`, and the Worker's client for tools all come from `default_client`;
`durable_agents.cloudflare` makes `fetch` its default transport under Pyodide
(`set_default_transport`). See docs/llm-providers.md and docs/mcp.md.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import httpx

from ..errors import ConfigurationError
from .json_guard import refuse_deep_json

__all__ = ["TransportFactory", "default_client", "set_default_transport"]

TransportFactory = Callable[[], httpx.AsyncBaseTransport]

_default_transport: TransportFactory | None = None


def set_default_transport(factory: TransportFactory | None) -> None:
    """Where clients made by `default_client` without a `transport` send requests.

    `None` (the start) is httpx's own transport. The Worker side sets it:
    importing `durable_agents.cloudflare` under Pyodide sets `FetchTransport`,
    so an adapter built anywhere in a Worker (say by `llm_from_env` in an
    agent's `make_llm`) reaches its provider through `fetch`. This package
    never imports `cloudflare/`: the dependency points the other way.
    """
    global _default_transport
    _default_transport = factory


def default_client(
    timeout: float, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    """The client an adapter uses when none is injected, and the Worker hands the tools.

    It sends through `transport`, else through the default transport (see
    `set_default_transport`; inside a Worker, `fetch`), else httpx's own.
    Under Pyodide with neither, it refuses (`ConfigurationError`): httpx's
    own transport cannot open sockets there. Its responses whose JSON nests
    deeper than 128 levels raise `httpx.DecodingError` when read, before
    anything parses them (on Pyodide, parsing them would crash the runtime;
    see `durable_agents._http.json_guard`).
    """
    if transport is None and _default_transport is not None:
        transport = _default_transport()
    if transport is None and sys.platform == "emscripten":
        raise ConfigurationError(
            "httpx cannot open sockets under Pyodide: pass "
            "transport=durable_agents.cloudflare.FetchTransport(), or import "
            "durable_agents.cloudflare first (it makes fetch the default)"
        )
    hooks = {"response": [refuse_deep_json]}
    return httpx.AsyncClient(timeout=timeout, transport=transport, event_hooks=hooks)
