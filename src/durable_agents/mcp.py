"""Tools from an MCP server: `MCPTools`, a toolset for `Agent(toolsets=[...])`.

An MCP (Model Context Protocol) server lists tools and runs them. `MCPTools`
speaks its streamable HTTP transport: JSON-RPC 2.0 in POSTs, each answered
with JSON or a stream of server-sent events, in a session the server names
(`Mcp-Session-Id`); protocol revision 2025-11-25, or 2025-06-18 / 2025-03-26
when the server offers one of those instead. The server's tools are listed
at the start of every turn, and each becomes a `Tool` whose handler calls it:

    notes = MCPTools(url_setting="NOTES_MCP_URL", token_setting="NOTES_MCP_TOKEN", name="notes")
    agent = Agent("assistant", "Keep the user's notes.", toolsets=[notes])
    result = await run(agent, llm=llm, message="Drop the milk note", session_id="s1", store=store)
    # the model sees list_notes, add_note, delete_note...: the server's tools

What the server's annotations decide (`safe_to_retry`, approval), what each
call's answer becomes, and how a failure to list ends the turn: the guide,
docs/mcp.md. What the kit decided is stored with each call (`ToolCall.policy`);
each call carries its idempotency key in `_meta`, under `IDEMPOTENCY_KEY_META`.

Offline, `mcp_stub(*tools)` (`durable_agents.mcp_stub`) is an MCP server of the
kit's own tools, for an agent module's `DEV_STUBS`.

Names. The model sees `prefix` + the server's name, each character outside
`[A-Za-z0-9_-]` replaced by `_` (`notes.search` becomes `notes_search`); a
name longer than 64 characters keeps its first 55 and a hash of the whole.
Calls go to the server under its own name. Two server tools that come out
with the same name are a `ToolsetError` (name one of them in `allow`).

`allow` names the server's tools the model may see, by their server names.
One the server does not list is a `ToolsetError` (a typo would otherwise
silently drop a tool); tools left out are never checked, so `allow` also
keeps a malformed tool of a server out of the way.

Sessions. The session (its id and protocol version) is kept on the
`MCPTools` instance across turns (in a Worker, the agent module's instance
lives as long as the isolate); the tools are listed again every turn. A 404
to a request that carried the session's id means the server dropped the
session: a new one is opened and the request sent again, once (a 404 means it
was not processed). Requests go through `RunContext.http`: `run(http=)`, or
the client `run()` makes for the turn and closes after it (in a Worker, the
client over `fetch`); given a `RunContext` without one (`list_tools` called
directly), it opens a client of its own (`llm.default_client`): close it
with `aclose()`. A request from the server in the
middle of a call (`ping`, `elicitation/create`, `sampling/createMessage`...)
is answered at once: `ping` with `{}`, anything else with error -32601, since
a tool call of an agent has no one to ask. A 2025-11-25 server that closes
an event stream before the answer (SSE polling) is followed with `GET` and
`Last-Event-ID`, up to 10 times.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import importlib.metadata
import itertools
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from typing import Any, cast

import httpx

from . import _json
from ._http.client import default_client
from ._http.sse import SSEEvent, sse_events, sse_lines
from .errors import ConfigurationError, ToolFailure, ToolsetError, describe_exception, redact
from .mcp_stub import MCPStub, mcp_stub
from .messages import ToolErrorKind
from .tools import RunContext, Tool, ToolContext

__all__ = ["IDEMPOTENCY_KEY_META", "PROTOCOL_VERSION", "MCPStub", "MCPTools", "mcp_stub"]

PROTOCOL_VERSION = "2025-11-25"
"""The MCP revision `initialize` offers."""

SUPPORTED_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")
"""The revisions a server may answer with: each has the streamable HTTP transport."""

IDEMPOTENCY_KEY_META = "io.github.durable-agents/idempotency-key"
"""The `_meta` key of a `tools/call` that carries the call's idempotency key."""

MAX_ANSWER_BYTES = 8_000_000
"""The most of one answer (a JSON body, or an event stream) that is read."""

MAX_PAGES = 20
"""The most `tools/list` pages followed (`nextCursor`) in one listing."""

MAX_SCHEMA_BYTES = 100_000
"""The largest input schema a tool may have: it is stored with every call of the tool."""

MAX_RESUMES = 10
"""How many times one answer's event stream is picked up again after the server closed it."""

MAX_SERVER_REQUESTS = 16
"""How many of the server's requests one call answers; later ones are ignored."""

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NOT_NAME = re.compile(r"[^A-Za-z0-9_-]")
_ERROR_TEXT = 2_000  # characters of an error body or message kept for a message


class MCPTools:
    """The tools of one MCP server, listed every turn: `Agent(toolsets=[MCPTools(...)])`.

    - `url` (e.g. `"https://notes.example.com/mcp"`), or `url_setting`: the name
      of the setting that holds it (`RunContext.settings`: the Worker's vars,
      `run(settings=)`, on CPython `os.environ` by default). Exactly one.
    - `token_setting`: the setting that holds a bearer token, sent as
      `Authorization: Bearer ...`.
    - `allow`: the server's tools (by their server names) the model may see;
      all when None. See the module docstring.
    - `prefix`: put before each tool's name as the model sees it (`"notes_"`),
      so two servers with a `search` each can serve one agent.
    - `approve_destructive`: a call of a tool that may destroy something waits
      for a person's approval (`durable_agents.approve`).
    - `name`: the server's name in errors and in each call's stored policy
      (`"mcp:<name>"`); by default the URL's host.
    - `timeout`: seconds a request may take (also each tool's `timeout`).

    A setting that is missing or empty is a `ConfigurationError` when the tools
    are listed (a turn of `run()` ends with status "error" and `error_code`
    "configuration", saying where to set it); a server that cannot be listed is
    a `ToolsetError` (`error_code` "toolset-error"). Both keep the turn's
    message, resumable.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        url_setting: str | None = None,
        token_setting: str | None = None,
        allow: Sequence[str] | None = None,
        prefix: str = "",
        approve_destructive: bool = False,
        name: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        _check_endpoint(url, url_setting, token_setting)
        allow = _allowed(allow)
        _check_naming(prefix, name)
        if not (isinstance(timeout, int | float) and timeout > 0):
            raise ConfigurationError(f"MCPTools: timeout must be positive seconds, got {timeout!r}")
        self.url = url
        self.url_setting = url_setting
        self.token_setting = token_setting
        self.allow = allow
        self.prefix = prefix
        self.approve_destructive = approve_destructive
        self.name = name
        self.timeout = float(timeout)
        self._session: _Session | None = None
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        where = f"url={self.url!r}" if self.url is not None else f"url_setting={self.url_setting!r}"
        return f"MCPTools({where}, name={self.name!r})"

    @property
    def settings(self) -> tuple[str, ...]:
        """The settings it reads: `url_setting` and `token_setting`, those given."""
        return tuple(s for s in (self.url_setting, self.token_setting) if s is not None)

    async def list_tools(self, ctx: RunContext[Any]) -> list[Tool]:
        """The server's tools as the model sees them this turn (see the module docstring)."""
        url, token = self._endpoint(ctx.settings)
        source = f"mcp:{self.name or httpx.URL(url).host}"
        client = ctx.http if ctx.http is not None else self._own_client()
        session = self._session
        if session is None or (session.url, session.token) != (url, token):
            session = self._session = _Session(url, token, self.timeout)
        try:
            listed = await session.list_tools(client)
        except (_Problem, httpx.HTTPError) as exc:
            raise ToolsetError(source, self._listing_problem(exc, url, token)) from exc
        return self._tools(listed, session, client, source)

    async def aclose(self) -> None:
        """Close the HTTP client it made for itself (a run's `http` is left open)."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _endpoint(self, settings: Mapping[str, str]) -> tuple[str, str | None]:
        url = self.url
        if self.url_setting is not None:
            url = (settings.get(self.url_setting) or "").strip()
            if not url:
                raise ConfigurationError(
                    f"MCPTools: the setting {self.url_setting} (the MCP server's URL) is "
                    "missing or empty"
                )
            _check_url(url, self.url_setting)
        token = None
        if self.token_setting is not None:
            token = (settings.get(self.token_setting) or "").strip()
            if not token:
                raise ConfigurationError(
                    f"MCPTools: the setting {self.token_setting} (the MCP server's bearer "
                    "token) is missing or empty"
                )
        assert url is not None
        return url, token

    def _own_client(self) -> httpx.AsyncClient:
        # One per event loop: a client's pooled connections belong to the loop that
        # opened them (a Worker has one loop; a CPython program may run several).
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            self._client = default_client(self.timeout)
            self._client_loop = loop
        return self._client

    def _listing_problem(self, exc: Exception, url: str, token: str | None) -> str:
        if isinstance(exc, _OpenFailed):
            exc = exc.cause
        if isinstance(exc, _Refused) and exc.status in (401, 403):
            if self.token_setting is None:
                how = "it wants a token: name the setting that holds one with token_setting="
            else:
                how = f"check the token in {self.token_setting}"
            problem = f"the MCP server at {url} refused us (HTTP {exc.status}); {how}"
        elif isinstance(exc, _Refused) and exc.status == 404:
            problem = (
                f"there is no MCP endpoint at {url} (HTTP 404); check the URL (a streamable "
                "HTTP endpoint's path often ends in /mcp)"
            )
        elif isinstance(exc, _Refused):
            problem = f"the MCP server at {url} refused to list its tools: {exc.problem}"
        elif isinstance(exc, _RPCError | _ServerError):
            problem = f"the MCP server at {url} could not list its tools: {exc.problem}"
        elif isinstance(exc, _Problem):
            problem = f"{url} does not answer as an MCP server: {exc.problem}"
        elif isinstance(exc, httpx.TimeoutException):
            problem = f"the MCP server at {url} did not answer within {self.timeout:g} s"
        elif isinstance(exc, httpx.TransportError):
            problem = (
                f"cannot reach the MCP server at {url} ({describe_exception(exc)}); is it running?"
            )
        elif isinstance(exc, httpx.DecodingError):
            problem = f"the MCP server at {url} answered with a body that cannot be read: {exc}"
        else:  # e.g. a Worker invocation out of subrequests: nothing was sent
            problem = (
                f"no request could be sent to the MCP server at {url}: {describe_exception(exc)}"
            )
        return redact(problem, token)

    def _tools(
        self, listed: list[Any], session: _Session, client: httpx.AsyncClient, source: str
    ) -> list[Tool]:
        by_name: dict[str, dict[str, Any]] = {}
        for entry in listed:
            if not (
                isinstance(entry, dict) and isinstance(entry.get("name"), str) and entry["name"]
            ):
                raise ToolsetError(source, "its tools/list answer has a tool without a name")
            if entry["name"] in by_name:
                raise ToolsetError(source, f"it lists the tool {entry['name']!r} twice")
            by_name[entry["name"]] = entry
        chosen = list(by_name.values())
        if self.allow is not None:
            missing = [n for n in self.allow if n not in by_name]
            if missing:
                names = ", ".join(repr(n) for n in missing)
                listed_names = ", ".join(sorted(by_name)[:50]) or "none"
                raise ToolsetError(
                    source,
                    f"allow names {names}, which the server does not list (it lists: "
                    f"{listed_names})",
                )
            chosen = [entry for name, entry in by_name.items() if name in self.allow]
        tools: dict[str, Tool] = {}
        server_names: dict[str, str] = {}  # the model's name -> the server's
        for entry in chosen:
            made = self._tool(entry, session, client, source)
            if made.name in tools:
                raise ToolsetError(
                    source,
                    f"its tools {server_names[made.name]!r} and {entry['name']!r} both become "
                    f"{made.name!r} for the model; name one of them in allow=",
                )
            tools[made.name] = made
            server_names[made.name] = entry["name"]
        return list(tools.values())

    def _tool(
        self, entry: dict[str, Any], session: _Session, client: httpx.AsyncClient, source: str
    ) -> Tool:
        server_name: str = entry["name"]
        schema = entry.get("inputSchema")
        if not (isinstance(schema, dict) and schema.get("type", "object") == "object"):
            raise ToolsetError(
                source, f"its tool {server_name!r} has no inputSchema describing an object"
            )
        if "type" not in schema:  # the providers want it said
            schema = {"type": "object", **schema}
        size = len(json.dumps(schema, ensure_ascii=False))
        if size > MAX_SCHEMA_BYTES:
            raise ToolsetError(
                source,
                f"its tool {server_name!r} has an inputSchema of {size:,} bytes, over "
                f"{MAX_SCHEMA_BYTES:,}; leave it out with allow=",
            )
        annotations = entry.get("annotations")
        hints = annotations if isinstance(annotations, dict) else {}
        safe, approval = tool_policy(hints, self.approve_destructive)
        description = entry.get("description")
        if not isinstance(description, str):
            title = entry.get("title")
            description = title if isinstance(title, str) else ""
        name = model_name(self.prefix, server_name)
        handler = _Caller(session, client, server_name)
        return Tool(
            name=name,
            description=description,
            input_schema=schema,
            safe_to_retry=safe,
            handler=handler,
            timeout=self.timeout,
            requires_approval=approval,
            source=source,
            annotations=dict(hints) if isinstance(annotations, dict) else None,
        )


# -- mapping: pure functions ------------------------------------------------------------


def model_name(prefix: str, server_name: str) -> str:
    """The name the model sees for a server's tool: `prefix` + the name, each character
    outside `[A-Za-z0-9_-]` replaced by `_`; past 64 characters, the first 55, `-`
    and 8 hex digits of the name's SHA-256."""
    name = prefix + _NOT_NAME.sub("_", server_name)
    if len(name) > 64:
        digest = hashlib.sha256(server_name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        name = f"{name[:55]}-{digest}"
    return name


def tool_policy(annotations: Mapping[str, Any], approve_destructive: bool) -> tuple[bool, bool]:
    """`(safe_to_retry, requires_approval)` for a tool with these MCP annotations."""
    read_only = annotations.get("readOnlyHint") is True
    destructive = annotations.get("destructiveHint") is not False  # the spec's default: true
    return read_only, approve_destructive and not read_only and destructive


def call_result(result: Mapping[str, Any]) -> Any:
    """A `tools/call` result as the call's result (see the module docstring). Raises
    `ToolFailure` for `isError`, and `_Problem` for a result that is not MCP's."""
    content = result.get("content", [])
    if not isinstance(content, list):
        raise _Problem("its answer's content is not a list")
    if result.get("isError") is True:
        text = "\n".join(
            b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)
        )
        raise ToolFailure(_clip(text) or "the MCP server reported an error, without a text")
    structured = result.get("structuredContent")
    if structured is not None:
        return structured
    if all(_is_text(block) for block in content):
        return "\n".join(block["text"] for block in content)
    return [_without_data(block) for block in content]


def _is_text(block: Any) -> bool:
    return (
        isinstance(block, dict)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
    )


def _without_data(block: Any) -> Any:
    """A content block with its base64 payload (image, audio, a resource's blob) replaced
    by a note of its size."""
    if not isinstance(block, dict):
        return block
    kind = block.get("type")
    if kind in ("image", "audio") and isinstance(block.get("data"), str):
        kept = {k: v for k, v in block.items() if k != "data"}
        return {**kept, "data": _omitted(block["data"], kind)}
    resource = block.get("resource")
    if kind == "resource" and isinstance(resource, dict) and isinstance(resource.get("blob"), str):
        kept = {k: v for k, v in resource.items() if k != "blob"}
        return {**block, "resource": {**kept, "blob": _omitted(resource["blob"], "binary")}}
    return block


def _omitted(data: str, kind: str) -> str:
    return f"({len(data) * 3 // 4:,} bytes of {kind} data, not kept)"


def _check_endpoint(url: str | None, url_setting: str | None, token_setting: str | None) -> None:
    """The server's URL, or the names of the settings that hold it and its token."""
    if (url is None) == (url_setting is None):
        raise ConfigurationError(
            "MCPTools takes the server's url or url_setting (the name of the setting "
            "that holds it): exactly one of them"
        )
    if url is not None:
        _check_url(url, "url")
    for what, setting in (("url_setting", url_setting), ("token_setting", token_setting)):
        if setting is not None and (not isinstance(setting, str) or not setting):
            raise ConfigurationError(f"MCPTools: {what} must name a setting, got {setting!r}")


def _allowed(allow: Sequence[str] | None) -> tuple[str, ...] | None:
    """`allow` as a tuple of tool names (None: all); refused if it names none."""
    if allow is None:
        return None
    if isinstance(allow, str):
        raise ConfigurationError(
            f"MCPTools: allow is a list of tool names, got the string {allow!r}"
        )
    names = tuple(allow)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ConfigurationError(
            f"MCPTools: allow must name at least one tool (or be None for all), got {names!r}"
        )
    return names


def _check_naming(prefix: str, name: str | None) -> None:
    """The prefix of the model's tool names, and the server's name in errors."""
    if prefix and not (_NAME.fullmatch(prefix) and len(prefix) <= 32):
        raise ConfigurationError(
            f"MCPTools: prefix {prefix!r} must be at most 32 letters, digits, '_' or '-'"
        )
    if name is not None and (not isinstance(name, str) or not name):
        raise ConfigurationError(f"MCPTools: name must be a non-empty string, got {name!r}")


def _check_url(url: Any, what: str) -> None:
    if not (isinstance(url, str) and url.startswith(("http://", "https://"))):
        raise ConfigurationError(
            f"MCPTools: {what} must be an http:// or https:// URL, got {url!r}"
        )
    try:
        host = httpx.URL(url).host
    except httpx.InvalidURL as exc:
        raise ConfigurationError(f"MCPTools: {what} is not a URL ({exc}): {url!r}") from None
    if not host:
        raise ConfigurationError(f"MCPTools: {what} has no host: {url!r}")


def _clip(text: str, limit: int = _ERROR_TEXT) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + "..."


@functools.cache
def _kit_version() -> str:
    try:
        return importlib.metadata.version("durable-agents")
    except Exception:  # vendored without its metadata (a Worker bundle)
        return "0"


# -- calls ------------------------------------------------------------------------------


class _Caller:
    """The handler of one server tool: `tools/call` with its server name, the answer mapped
    to a result or a `ToolFailure` (see the module docstring)."""

    def __init__(self, session: _Session, client: httpx.AsyncClient, server_name: str) -> None:
        self.session = session
        self.client = client
        self.server_name = server_name

    async def __call__(self, args: dict[str, Any], ctx: ToolContext[Any]) -> Any:
        params = {
            "name": self.server_name,
            "arguments": args,
            "_meta": {IDEMPOTENCY_KEY_META: ctx.idempotency_key},
        }
        # The run loop words the result around these messages: "Tool 'x' failed: <it>",
        # or for an unknown outcome "... may or may not have taken effect: <it> ...".
        token = self.session.token
        try:
            return call_result(await self.session.request(self.client, "tools/call", params))
        except _RPCError as exc:
            if exc.code == -32602:
                raise ToolFailure(
                    redact(f"the MCP server refused its arguments: {exc.message}", token),
                    kind=ToolErrorKind.INVALID_ARGUMENTS,
                ) from None
            raise ToolFailure(redact(f"the MCP server answered {exc.problem}", token)) from None
        except (_Refused, _OpenFailed) as exc:
            raise ToolFailure(
                redact(f"the MCP server did not run it: {exc.problem}.", token)
            ) from exc
        except _Problem as exc:  # sent, and the answer is missing or unreadable
            raise ToolFailure(
                redact(f"the call reached the MCP server, but {exc.problem}.", token),
                outcome_unknown=True,
            ) from exc


# -- the JSON-RPC session -----------------------------------------------------------------


class _Problem(Exception):
    """The request was sent and its answer is missing, unreadable or not MCP's: the server
    may have processed it."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(problem)


class _Refused(_Problem):
    """The server refused the request with an HTTP status (3xx, 4xx): not processed."""

    def __init__(self, status: int, detail: str) -> None:
        self.status = status
        super().__init__(f"it answered HTTP {status}{f': {detail}' if detail else ''}")


class _ServerError(_Problem):
    """The server answered the request with an HTTP 5xx: it may have processed it."""

    def __init__(self, status: int, detail: str) -> None:
        self.status = status
        super().__init__(f"it answered HTTP {status}{f': {detail}' if detail else ''}")


class _Expired(_Problem):
    """A 404 to a request that carried the session's id: the server dropped the session."""


class _OpenFailed(_Problem):
    """Opening a session (again) failed, so the request that needed it was not sent."""

    def __init__(self, cause: Exception) -> None:
        self.cause = cause
        what = cause.problem if isinstance(cause, _Problem) else describe_exception(cause)
        super().__init__(f"no session could be opened ({what}), so the call was not sent")


class _RPCError(_Problem):
    """The server answered the request with a JSON-RPC error."""

    def __init__(self, code: int, message: str) -> None:
        self.code = code
        self.message = _clip(message)
        super().__init__(f"error {code}: {self.message}")


class _Session:
    """One MCP session with a server: `initialize` once, then requests, each with the
    session's id and protocol version."""

    def __init__(self, url: str, token: str | None, timeout: float) -> None:
        self.url = url
        self.token = token
        self.timeout = timeout
        self.session_id: str | None = None
        self.version: str | None = None  # None until initialized
        self._ids = itertools.count(1)

    async def list_tools(self, client: httpx.AsyncClient) -> list[Any]:
        """Every tool the server lists, following `nextCursor` (at most MAX_PAGES pages)."""
        tools: list[Any] = []
        params: dict[str, Any] = {}
        for _ in range(MAX_PAGES):
            page = await self.request(client, "tools/list", params)
            listed = page.get("tools")
            if not isinstance(listed, list):
                raise _Problem("its tools/list answer has no list of tools")
            tools += listed
            cursor = page.get("nextCursor")
            if cursor is None:
                return tools
            if not isinstance(cursor, str):
                raise _Problem("its tools/list answer has a nextCursor that is not a string")
            params = {"cursor": cursor}
        raise _Problem(f"it lists its tools in more than {MAX_PAGES} pages")

    async def request(
        self, client: httpx.AsyncClient, method: str, params: dict[str, Any]
    ) -> dict[str, Any]:
        """Send a request in the session (opening one first if need be); its result.

        A 404 for an expired session opens a new one and sends again, once.
        `_OpenFailed` when no session could be opened (the request was not sent).
        """
        if self.version is None:
            await self._reopen(client, None)
        sent_with = self.session_id
        try:
            return await self._post(client, method, params)
        except _Expired:
            await self._reopen(client, sent_with)
        try:
            return await self._post(client, method, params)
        except _Expired:
            raise _Refused(404, "the session expired again as soon as it was opened") from None

    async def _reopen(self, client: httpx.AsyncClient, expired: str | None) -> None:
        if self.version is not None and self.session_id != expired:
            return  # another call opened a new session meanwhile
        try:
            await self._initialize(client)
        except (_Problem, httpx.HTTPError) as exc:
            raise _OpenFailed(exc) from exc

    async def _initialize(self, client: httpx.AsyncClient) -> None:
        params = {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "durable-agents", "version": _kit_version()},
        }
        headers = _headers(self.token, None, None)
        result, session_id = await self._exchange(client, headers, "initialize", params)
        version = result.get("protocolVersion")
        if version not in SUPPORTED_VERSIONS:
            raise _Problem(
                f"it speaks MCP {version!r}, not one of {', '.join(SUPPORTED_VERSIONS)} "
                "(the revisions with the streamable HTTP transport)"
            )
        headers = _headers(self.token, session_id, version)
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        request = client.build_request(
            "POST", self.url, content=_encode(note), headers=headers, timeout=self.timeout
        )
        response = await client.send(request, stream=True)
        try:
            if response.status_code >= 300:
                raise _Refused(response.status_code, await _detail(response))
        finally:
            await response.aclose()
        # Set last: calls in flight meanwhile keep sending with the session they had.
        self.session_id, self.version = session_id, version

    async def _post(
        self, client: httpx.AsyncClient, method: str, params: dict[str, Any]
    ) -> dict[str, Any]:
        headers = _headers(self.token, self.session_id, self.version)
        result, _ = await self._exchange(client, headers, method, params)
        return result

    async def _exchange(
        self, client: httpx.AsyncClient, headers: dict[str, str], method: str, params: Any
    ) -> tuple[dict[str, Any], str | None]:
        """POST one request; its result and the session id the answer named."""
        request_id = next(self._ids)
        body = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        request = client.build_request(
            "POST", self.url, content=_encode(body), headers=headers, timeout=self.timeout
        )
        response = await client.send(request, stream=True)
        try:
            status = response.status_code
            if status == 404 and "mcp-session-id" in headers:
                raise _Expired("the server dropped the session")
            if status >= 500:
                raise _ServerError(status, await _detail(response))
            if status >= 300:
                raise _Refused(status, await _detail(response))
            session_id = response.headers.get("mcp-session-id")
            kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind == "text/event-stream":
                # What follows up on the stream goes in the session the request went in
                # (or, for initialize, the one it opened), whatever happened since.
                stream = _Stream(request_id, headers, session_id)
                return await self._from_events(client, response, stream), session_id
            if kind != "application/json":
                raise _Problem(
                    f"it answered HTTP {status} with {kind or 'no content type'}, "
                    "not JSON or an event stream"
                )
            message = _decode(b"".join([c async for c in _limited(response)]), "its answer")
            return _result_of(message, request_id), session_id
        finally:
            await response.aclose()

    async def _from_events(
        self, client: httpx.AsyncClient, response: httpx.Response, stream: _Stream
    ) -> dict[str, Any]:
        """The result of the request from its event stream; the stream picked up again
        (`GET`, `Last-Event-ID`) when the server closes it before the answer."""
        result = await self._scan(client, response, stream)
        resumes = 0
        while result is None and stream.last_event_id is not None and resumes < MAX_RESUMES:
            resumes += 1
            await asyncio.sleep(min(0.05 * 2**resumes, 1.0))
            headers = {**stream.headers, "last-event-id": stream.last_event_id}
            headers["accept"] = "text/event-stream"
            del headers["content-type"]
            request = client.build_request("GET", self.url, headers=headers, timeout=self.timeout)
            again = await client.send(request, stream=True)
            try:
                kind = again.headers.get("content-type", "").split(";")[0].strip().lower()
                if again.status_code != 200 or kind != "text/event-stream":
                    raise _Problem(
                        f"its event stream ended before the answer, and picking it up again "
                        f"got HTTP {again.status_code} ({kind or 'no content type'})"
                    )
                result = await self._scan(client, again, stream)
            finally:
                await again.aclose()
        if result is None:
            raise _Problem("its event stream ended before the answer")
        return result

    async def _scan(
        self, client: httpx.AsyncClient, response: httpx.Response, stream: _Stream
    ) -> dict[str, Any] | None:
        """Read events until the answer to `stream.request_id`; None if the stream ends first.
        Notifications and answers to other requests are passed over; the server's own
        requests are answered."""
        events = cast(
            AsyncGenerator[SSEEvent, None], sse_events(sse_lines(_limited(response, stream)))
        )
        async with contextlib.aclosing(events):
            async for event in events:
                if event.id is not None:
                    stream.last_event_id = event.id
                if event.event != "message" or not event.data.strip():
                    continue  # e.g. a priming event: an id and no data
                message = _decode(event.data, "an event of its stream")
                if _answers(message, stream.request_id):
                    return _result_of(message, stream.request_id)
                asks = isinstance(message, dict) and isinstance(message.get("method"), str)
                if asks and "id" in message and stream.served < MAX_SERVER_REQUESTS:
                    stream.served += 1
                    await self._decline(client, message, stream.headers)
        return None

    async def _decline(
        self, client: httpx.AsyncClient, request: dict[str, Any], headers: dict[str, str]
    ) -> None:
        """Answer a request of the server's: `ping` with `{}`, anything else with -32601."""
        method = request["method"]
        answer: dict[str, Any] = {"jsonrpc": "2.0", "id": request["id"]}
        if method == "ping":
            answer["result"] = {}
        else:
            answer["error"] = {
                "code": -32601,
                "message": f"durable-agents does not serve {method[:100]!r}: an agent's tool "
                "call has no one to ask",
            }
        request_ = client.build_request(
            "POST", self.url, content=_encode(answer), headers=headers, timeout=self.timeout
        )
        with contextlib.suppress(httpx.HTTPError):  # the server's own timeout ends its wait
            response = await client.send(request_, stream=True)
            await response.aclose()


class _Stream:
    """What reading one answer's event stream(s) keeps track of."""

    def __init__(
        self, request_id: int, headers: dict[str, str], session_id: str | None = None
    ) -> None:
        self.request_id = request_id
        self.headers = dict(headers)  # those of the request, and the session it opened
        if session_id and "mcp-session-id" not in headers:
            self.headers["mcp-session-id"] = session_id
        self.last_event_id: str | None = None
        self.size = 0
        self.served = 0


def _headers(token: str | None, session_id: str | None, version: str | None) -> dict[str, str]:
    headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    if session_id:
        headers["mcp-session-id"] = session_id
    if version:
        headers["mcp-protocol-version"] = version
    return headers


def _encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _decode(text: str | bytes, what: str) -> Any:
    try:
        return _json.loads(text)
    except _json.JSONTooDeepError as exc:
        raise _Problem(f"{what} is {exc}") from None
    except ValueError:
        raise _Problem(f"{what} is not JSON") from None


def _answers(message: Any, request_id: int) -> bool:
    """Whether `message` is the JSON-RPC response to request `request_id` (an error without
    an id counts: the server could not read the request's)."""
    if not isinstance(message, dict) or "method" in message:
        return False
    key = message.get("id")
    if key is None:
        return "error" in message
    return type(key) is int and key == request_id and ("result" in message or "error" in message)


def _result_of(message: Any, request_id: int) -> dict[str, Any]:
    if not _answers(message, request_id) or message.get("jsonrpc") != "2.0":
        raise _Problem("its answer is not the JSON-RPC response to the request")
    if "error" in message:
        error = message["error"]
        if not (isinstance(error, dict) and type(error.get("code")) is int):
            raise _Problem("its answer has an error without a code")
        text = error.get("message")
        raise _RPCError(error["code"], text if isinstance(text, str) else "")
    result = message.get("result")
    if not isinstance(result, dict):
        raise _Problem("its answer's result is not an object")
    return result


async def _limited(response: httpx.Response, stream: _Stream | None = None) -> AsyncIterator[bytes]:
    """The body's chunks, at most MAX_ANSWER_BYTES of them in all (`stream` counts across the
    responses of one answer)."""
    counter = stream if stream is not None else _Stream(0, {})
    try:
        async for chunk in response.aiter_bytes():
            counter.size += len(chunk)
            if counter.size > MAX_ANSWER_BYTES:
                raise _Problem(f"its answer is over {MAX_ANSWER_BYTES:,} bytes and was not read")
            yield chunk
    except httpx.DecodingError as exc:  # e.g. JSON nested too deep (the kit's client refuses it)
        raise _Problem(f"its answer cannot be read ({exc})") from None


async def _detail(response: httpx.Response) -> str:
    """The start of an error answer's body, for a message."""
    head = b""
    with contextlib.suppress(httpx.HTTPError):
        async for chunk in response.aiter_bytes():
            head += chunk
            if len(head) >= _ERROR_TEXT:
                break
    return _clip(head.decode("utf-8", "replace"))
