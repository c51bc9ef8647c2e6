"""An MCP server as a dev stub: `mcp_stub(*tools)`, so an agent whose tools come from
`MCPTools` runs offline (the dev server, `check_agent`, a test).

    catalog = MCPTools(url_setting="CATALOG_MCP_URL", name="catalog")
    AGENT = Agent("desk", "Find books.", toolsets=[catalog])
    DEV_STUBS = {"CATALOG_MCP_URL": mcp_stub(search_catalog, reserve_book)}

It is a dev stub (`durable_agents.cloudflare.agent_module`): `stub(method, path, body,
headers) -> (status, json_body)`. It answers MCP's streamable HTTP transport in its
JSON-response mode, statelessly (no `Mcp-Session-Id`): a POSTed JSON-RPC request gets
its response as JSON, a notification or a response `202` with no body, any other
method `405`. It serves `initialize`, `ping`, `tools/list` and `tools/call` from the
kit's own `Tool`s (made with `durable_agents.tool`); anything else is error -32601.
The guide: docs/mcp.md ("Offline: an MCP server as a dev stub").

In the dev server it runs inside the Worker, which answers its own requests there
(it needs nothing but the standard library and pydantic).
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Mapping
from typing import Any

from . import _json
from .errors import (
    ConfigurationError,
    ModelRetry,
    ToolArgumentsError,
    ToolFailure,
    describe_exception,
)
from .tools import Tool

__all__ = ["STUB_VERSIONS", "MCPStub", "mcp_stub"]

STUB_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")
"""The MCP revisions the stub speaks (those with the streamable HTTP transport), newest
first: it answers `initialize` with the client's, or else the newest."""

_logger = logging.getLogger("durable_agents")

Answer = tuple[int, Any]

# JSON-RPC 2.0 error codes.
_PARSE_ERROR = -32700
_INVALID_REQUEST = -32600
_METHOD_NOT_FOUND = -32601
_INVALID_PARAMS = -32602


def mcp_stub(
    *tools: Tool,
    annotations: Mapping[str, Mapping[str, Any]] | None = None,
    name: str = "stub",
) -> MCPStub:
    """A dev stub that is an MCP server of `tools` (see the module docstring).

    Each tool is listed with its name, description and `input_schema`, and the
    annotations `{"readOnlyHint": tool.safe_to_retry}`, updated by
    `annotations[tool.name]` (e.g. `{"destructiveHint": True}`): `MCPTools` decides
    from them what a real server would make it decide (`safe_to_retry`, approval
    with `approve_destructive=True`). A tool's own `requires_approval` is not
    the server's to say, and is not sent.

    A `tools/call` checks the arguments with the tool (`Tool.parse_arguments`) and
    runs its handler with `ctx=None`: a stub's tools take no `ToolContext` (a
    server is not given one). The result is a text block holding the result as
    the kit encodes it (`Tool.encode_result`), and for a result that encodes to a
    JSON object, that object as `structuredContent`. Invalid arguments, a handler
    that raises (its traceback logged on the `durable_agents` logger) or a result
    that cannot be encoded answer `isError: true` with the message. `name` is the
    server's name in `initialize` and in the log.

    Use it for the dev server, `check_agent` and tests; against a real MCP
    server, `MCPTools` talks to that (set the URL setting). Raises
    `ConfigurationError` for a tool without a handler, two tools of one name, or
    annotations for a tool it does not serve.
    """
    return MCPStub(tools, annotations or {}, name)


class MCPStub:
    """The stub `mcp_stub` makes: call it as a dev stub, `await stub(method, path, body,
    headers)`. `tools` are its tools by name."""

    def __init__(
        self, tools: tuple[Tool, ...], annotations: Mapping[str, Mapping[str, Any]], name: str
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"mcp_stub: name must be a non-empty string, got {name!r}")
        if not isinstance(annotations, Mapping):
            raise ConfigurationError(
                f"mcp_stub {name!r}: annotations map tool names to MCP hints, got "
                f"{type(annotations).__name__}"
            )
        self.name = name
        self.tools: dict[str, Tool] = {}
        for given in tools:
            if not isinstance(given, Tool):
                raise ConfigurationError(
                    f"mcp_stub {name!r}: serves tools made with durable_agents.tool, got "
                    f"{type(given).__name__}"
                )
            if given.handler is None:
                raise ConfigurationError(
                    f"mcp_stub {name!r}: tool {given.name!r} has no handler to run"
                )
            if given.name in self.tools:
                raise ConfigurationError(f"mcp_stub {name!r}: two tools are named {given.name!r}")
            self.tools[given.name] = given
        unknown = sorted(set(annotations) - set(self.tools))
        if unknown:
            raise ConfigurationError(
                f"mcp_stub {name!r}: annotations name {unknown}, which it does not serve "
                f"(its tools: {sorted(self.tools)})"
            )
        self._listing = [_listed(t, annotations.get(t.name, {}), name) for t in tools]

    def __repr__(self) -> str:
        return f"mcp_stub({', '.join(self.tools)}, name={self.name!r})"

    async def __call__(
        self, method: str, path: str, body: bytes, headers: Mapping[str, str]
    ) -> Answer:
        """The answer to one HTTP request at the server's URL."""
        if method.upper() != "POST":
            return 405, {"error": f"the MCP stub {self.name!r} answers POST only (no GET stream)"}
        try:
            message = _json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            return 400, _error(None, _PARSE_ERROR, f"the body is not JSON: {exc}")
        if isinstance(message, list):
            return 400, _error(None, _INVALID_REQUEST, "batches are not supported")
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return 400, _error(None, _INVALID_REQUEST, "not a JSON-RPC 2.0 message")
        if "method" not in message:
            if "id" in message and ("result" in message or "error" in message):
                return 202, None  # a response of the client's: nothing asked it
            return 400, _error(None, _INVALID_REQUEST, "a message with no method")
        key = message.get("id")
        if "id" not in message:
            return 202, None  # a notification (notifications/initialized, ...)
        if not isinstance(key, str | int) or isinstance(key, bool):
            return 400, _error(None, _INVALID_REQUEST, "the id must be a string or an integer")
        rpc_method, params = message["method"], message.get("params", {})
        if not isinstance(rpc_method, str):
            return 400, _error(key, _INVALID_REQUEST, "the method must be a string")
        if not isinstance(params, dict):
            return 200, _error(key, _INVALID_PARAMS, "params must be an object")
        result = await self._answer(key, rpc_method, params)
        return 200, result

    async def _answer(self, key: str | int, method: str, params: dict[str, Any]) -> Any:
        """The JSON-RPC response to request `key`."""
        if method == "initialize":
            return _result(key, self._initialized(params))
        if method == "ping":
            return _result(key, {})
        if method == "tools/list":
            return _result(key, {"tools": self._listing})
        if method == "tools/call":
            called = params.get("name")
            tool = self.tools.get(called) if isinstance(called, str) else None
            if tool is None:
                return _error(key, _INVALID_PARAMS, f"unknown tool: {str(called)[:100]!r}")
            return _result(key, await self._call(tool, params.get("arguments", {})))
        return _error(key, _METHOD_NOT_FOUND, f"the MCP stub does not serve {method[:100]!r}")

    def _initialized(self, params: dict[str, Any]) -> dict[str, Any]:
        asked = params.get("protocolVersion")
        return {
            "protocolVersion": asked if asked in STUB_VERSIONS else STUB_VERSIONS[0],
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": self.name, "version": "0"},
        }

    async def _call(self, tool: Tool, arguments: Any) -> dict[str, Any]:
        """A `tools/call` result: the handler's result, or `isError` with why not."""
        assert tool.handler is not None  # (checked when made)
        try:
            args = tool.parse_arguments(arguments)
            value = tool.handler(args, None)  # type: ignore[arg-type]  # no ctx: see mcp_stub
            if inspect.isawaitable(value):
                value = await value
        except ToolArgumentsError as exc:
            return _failed(f"the arguments of {tool.name!r} are invalid: {exc}")
        except (ModelRetry, ToolFailure) as exc:
            return _failed(exc.message)
        except Exception as exc:  # a validator's or the handler's: never out of the stub
            _logger.error(
                "mcp_stub %r: tool %r raised; answered isError", self.name, tool.name,
                exc_info=exc,
            )  # fmt: skip
            return _failed(describe_exception(exc))
        try:
            text = tool.encode_result(value)
        except Exception as exc:  # not JSON, too deep, or off its output schema
            return _failed(f"{tool.name!r} ran, but its result cannot be sent: {exc}")
        answer: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": False}
        if not isinstance(value, str) and text.lstrip().startswith("{"):
            answer["structuredContent"] = json.loads(text)
        return answer


def _listed(tool: Tool, annotations: Mapping[str, Any], server: str) -> dict[str, Any]:
    """A tool as `tools/list` lists it."""
    if not isinstance(annotations, Mapping):
        raise ConfigurationError(
            f"mcp_stub {server!r}: the annotations of {tool.name!r} must be a dict of MCP hints "
            f'(e.g. {{"destructiveHint": True}}), got {annotations!r}'
        )
    hints = {"readOnlyHint": tool.safe_to_retry, **annotations}
    return {
        "name": tool.name,
        "description": tool.description,
        "inputSchema": tool.input_schema,
        "annotations": hints,
    }


def _result(key: str | int, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": key, "result": result}


def _error(key: str | int | None, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": key, "error": {"code": code, "message": message}}


def _failed(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": True}
