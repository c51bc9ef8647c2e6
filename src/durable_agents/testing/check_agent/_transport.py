"""The `http` client a run's handlers and toolsets get during the check: every request
recorded with the handler run that sent it, then answered (`respond`, a dev stub, or
`200 {}`) or, for a toolset's server, forwarded for real (or answered by the dev stub
that stands in for it, `mcp_stub`). docs/testing.md
("`check_agent`: any agent at every crash point") says what goes where."""

from __future__ import annotations

import contextlib
import inspect
import io
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import httpx

from ..._http.json_guard import refuse_deep_json
from ...tools import Toolset
from ._jsonrpc import json_rpc, messages_in, meta_key
from ._report import RecordedRequest
from ._scenario import CURRENT, Invocation, Scenario, ServerCall, Stage

Responder = Callable[[httpx.Request], httpx.Response | Awaitable[httpx.Response]]
_LISTING_BYTES = 4_000_000  # of a server's tools/list answer, kept to read its annotations
# Headers of a forwarded request or answer that describe one hop, not the message.
_HOP_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "content-encoding"}
)


def is_under(url: str, base: str) -> bool:
    """Whether `url` is `base` or below it (a path under it, or it with a query)."""
    base = base.rstrip("/")
    return url.rstrip("/") == base or url.startswith((base + "/", base + "?"))


class _Relay(httpx.AsyncByteStream):
    """A forwarded answer's body, streamed on as it comes (an MCP server's event stream
    too), kept (up to a bound) when the check wants to read it once it is closed."""

    def __init__(
        self, response: httpx.Response, keep: Callable[[bytes], Awaitable[None]] | None = None
    ) -> None:
        self.response = response
        self.keep = keep
        self.seen: list[bytes] = []
        self.size = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.response.aiter_bytes():
            if self.keep is not None and self.size < _LISTING_BYTES:
                self.seen.append(chunk)
                self.size += len(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self.response.aclose()
        if self.keep is not None:
            keep, self.keep = self.keep, None
            await keep(b"".join(self.seen))


class CheckTransport:
    """Records, answers or forwards the requests of the scenario being played.

    `stubs`: a placeholder URL -> the agent's dev stub answering there; `servers`: a
    toolset's server URL -> that toolset (its requests go to `forward`, for real);
    `server_tools` fills with each listed tool's annotations, as its server says."""

    def __init__(
        self,
        stage: Stage,
        *,
        respond: Responder | None,
        stubs: Mapping[str, Callable[..., Any]],
        servers: Mapping[str, Toolset],
        forward: httpx.AsyncClient | None,
    ) -> None:
        self.stage = stage
        self.respond = respond
        self.stubs = dict(stubs)
        self.servers = dict(servers)
        self.forward = forward
        self.server_tools: dict[tuple[str, str], dict[str, Any]] = {}

    def client(self) -> httpx.AsyncClient:
        """The `http` a run's handlers and toolsets get: records, answers or forwards."""
        return httpx.AsyncClient(
            transport=httpx.MockTransport(self.answer),
            event_hooks={"response": [refuse_deep_json]},
        )

    async def answer(self, request: httpx.Request) -> httpx.Response:
        invocation = CURRENT.get()
        scenario = self.stage.of(invocation)  # a child agent's handler's: its session's
        url = str(request.url)
        server = next((base for base in self.servers if is_under(url, base)), None)
        scenario.requests.append(_recorded(scenario, invocation, request, server is not None))
        if server is not None and server in self.stubs:  # a dev stub as the server
            return await self._served_by_stub(request, server, invocation)
        if server is not None:
            return await self._forward(request, server, invocation)
        if self.respond is not None:
            answer = self.respond(request)
            return await answer if inspect.isawaitable(answer) else answer
        return await self._stubbed(request, url)

    async def _stubbed(self, request: httpx.Request, url: str) -> httpx.Response:
        """The agent's dev stub's answer at a placeholder URL, else `200 {}`."""
        for base, stub in self.stubs.items():
            if is_under(url, base):
                path = url[len(base) :] or "/"
                headers = {k.lower(): v for k, v in request.headers.items()}
                with contextlib.redirect_stdout(io.StringIO()):  # a dev server's log lines
                    reply = stub(request.method, path, request.content, headers)
                    status, body = await reply if inspect.isawaitable(reply) else reply
                if body is None:  # a stub's answer with no body (see agent_module)
                    return httpx.Response(status)
                return httpx.Response(status, json=body)
        return httpx.Response(200, json={})

    async def _served_by_stub(
        self, request: httpx.Request, server: str, invocation: Invocation | None
    ) -> httpx.Response:
        """A toolset's request answered by the dev stub standing in for its server
        (`mcp_stub`), counted and read as `_forward` does a real server's."""
        message = json_rpc(request.content)
        method = message.get("method") if message is not None else None
        response = await self._stubbed(request, str(request.url))
        _count_call(self.stage.of(invocation), server, method, message, invocation)
        if method == "tools/list" and response.status_code == 200:
            await self._read_listing(server, response.content)
        return response

    async def _forward(
        self, request: httpx.Request, server: str, invocation: Invocation | None
    ) -> httpx.Response:
        """Send `request` to the toolset's server for real; its answer, streamed back. A
        `tools/call` that reached it is counted; a `tools/list` answer is read for the
        tools' annotations (what the server itself says of them)."""
        assert self.forward is not None
        scenario = self.stage.of(invocation)
        message = json_rpc(request.content)
        method = message.get("method") if message is not None else None
        timeout = request.extensions.get("timeout")
        sent = self.forward.build_request(
            request.method,
            request.url,
            headers=[(k, v) for k, v in request.headers.multi_items() if k not in _HOP_HEADERS],
            content=request.content,
            timeout=httpx.Timeout(**timeout) if isinstance(timeout, dict) else 30.0,
        )
        try:
            response = await self.forward.send(sent, stream=True)
        except httpx.ConnectError:
            raise  # it never reached the server
        except httpx.TransportError:
            _count_call(scenario, server, method, message, invocation)
            raise
        _count_call(scenario, server, method, message, invocation)
        keep = None
        if method == "tools/list" and response.status_code == 200:
            keep = lambda body: self._read_listing(server, body)  # noqa: E731
        return httpx.Response(
            response.status_code,
            headers=[(k, v) for k, v in response.headers.multi_items() if k not in _HOP_HEADERS],
            stream=_Relay(response, keep),
            request=request,
        )

    async def _read_listing(self, server: str, body: bytes) -> None:
        for message in await messages_in(body):
            result = message.get("result")
            tools = result.get("tools") if isinstance(result, dict) else None
            for entry in tools if isinstance(tools, list) else ():
                if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                    hints = entry.get("annotations")
                    self.server_tools[(server, entry["name"])] = (
                        dict(hints) if isinstance(hints, dict) else {}
                    )


def _recorded(
    scenario: Scenario, invocation: Invocation | None, request: httpx.Request, forwarded: bool
) -> RecordedRequest:
    """`request` as recorded, with the handler run that sent it (if any)."""
    return RecordedRequest(
        scenario=scenario.name,
        turn=scenario.turn,
        tool_name=invocation.tool_name if invocation else None,
        tool_call_id=invocation.call_id if invocation else None,
        idempotency_key=invocation.key if invocation else None,
        invocation=invocation.run_number if invocation else None,
        method=request.method,
        url=str(request.url),
        headers=tuple((k.lower(), v) for k, v in request.headers.items()),
        body=request.content,
        forwarded=forwarded,
    )


def _count_call(
    scenario: Scenario,
    server: str,
    method: Any,
    message: dict[str, Any] | None,
    invocation: Invocation | None,
) -> None:
    """A `tools/call` that reached `server`, kept on the scenario."""
    if method != "tools/call" or message is None:
        return
    params = message.get("params")
    params = params if isinstance(params, dict) else {}
    scenario.server_calls.append(
        ServerCall(
            server=server,
            tool=str(params.get("name")),
            arguments=params.get("arguments"),
            key=meta_key(message),
            call_id=invocation.call_id if invocation else None,
            run_number=invocation.run_number if invocation else None,
        )
    )
