"""A real MCP server for tests/test_mcp.py, written with the official MCP Python SDK (2.x).

    python tests/support/mcp_server.py [--port P]

Serves one set of note tools over streamable HTTP on 127.0.0.1, on several
endpoints, one per way the SDK serves them:

    /json              stateful (session ids), answers application/json
    /sse               stateful, answers text/event-stream
    /stateless-json    no sessions, application/json
    /stateless-sse     no sessions, text/event-stream
    /auth              as /json, behind a bearer token (MCP_TEST_TOKEN); 401 without it
    /resumable         as /sse, with an event store: a tool may close its stream
                       early and the client picks the answer up with Last-Event-ID

It prints `listening <port>` once it accepts connections (port 0, the
default, picks a free one). Settings come from the environment:

    MCP_TEST_CALLS     a file: every call a tool receives is appended to it as a
                       JSON line {"tool", "arguments", "key", "session", "endpoint"}
                       (`key`: the idempotency key the client sent in `_meta`)
    MCP_TEST_RELEASE   a file the `slow_*` tools wait for (at most 60 s)
    MCP_TEST_TOKEN     the token /auth wants

Every endpoint has its own SDK server (so its own sessions); the notes
themselves are shared by all, in this process's memory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import socket
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INVALID_PARAMS,
    ImageContent,
    JSONRPCMessage,
    ResourceLink,
    TextContent,
    ToolAnnotations,
)
from pydantic import BaseModel

IDEMPOTENCY_KEY = "io.github.durable-agents/idempotency-key"
NOTES: dict[int, str] = {1: "buy milk", 2: "call Ada"}
NEXT_ID = itertools.count(3)

READ_ONLY = ToolAnnotations(read_only_hint=True)
ADDITIVE = ToolAnnotations(read_only_hint=False, destructive_hint=False)
DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True)
IDEMPOTENT = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True)


class Choice(BaseModel):
    note_id: int


class NoteStats(BaseModel):
    count: int
    longest: str


def record(ctx: Context, tool: str, **arguments: Any) -> None:
    """Append the call to MCP_TEST_CALLS (one JSON line, written whole)."""
    path = os.environ.get("MCP_TEST_CALLS")
    if not path:
        return
    params = ctx.request_context.params or {}
    meta = params.get("_meta") or {}
    headers = ctx.headers or {}
    line = {
        "tool": tool,
        "arguments": arguments,
        "key": meta.get(IDEMPOTENCY_KEY) if isinstance(meta, dict) else None,
        "session": headers.get("mcp-session-id"),
        "endpoint": ctx.request_context.request.url.path if ctx.request_context.request else None,
    }
    with open(path, "a") as calls:
        calls.write(json.dumps(line) + "\n")


def released() -> bool:
    path = os.environ.get("MCP_TEST_RELEASE", "")
    return bool(path) and os.path.exists(path)


async def wait_for_release() -> None:
    deadline = time.monotonic() + 60
    while not released():
        if time.monotonic() > deadline:
            raise ToolError("the release file never appeared")
        await asyncio.sleep(0.01)


def make_server(name: str) -> MCPServer:
    server = MCPServer(name, log_level="WARNING")

    @server.tool(annotations=READ_ONLY, structured_output=False)
    def list_notes(ctx: Context) -> str:
        """List the notes, one a line."""
        record(ctx, "list_notes")
        return "\n".join(f"{k}: {v}" for k, v in sorted(NOTES.items()))

    @server.tool(annotations=ADDITIVE, structured_output=False)
    def add_note(text: str, ctx: Context) -> str:
        """Add a note."""
        record(ctx, "add_note", text=text)
        note_id = next(NEXT_ID)
        NOTES[note_id] = text
        return f"added note {note_id}"

    @server.tool(annotations=DESTRUCTIVE, structured_output=False)
    def delete_note(note_id: int, ctx: Context) -> str:
        """Delete a note for good."""
        record(ctx, "delete_note", note_id=note_id)
        NOTES.pop(note_id, None)
        return f"deleted note {note_id}"

    @server.tool(structured_output=False)
    def touch_note(note_id: int, ctx: Context) -> str:
        """Mark a note as seen (no annotations: the spec's defaults, a destructive write)."""
        record(ctx, "touch_note", note_id=note_id)
        return f"touched note {note_id}"

    @server.tool(annotations=IDEMPOTENT, structured_output=False)
    def rename_note(note_id: int, text: str, ctx: Context) -> str:
        """Rename a note; an unknown note is a JSON-RPC error -32602 (invalid params)."""
        record(ctx, "rename_note", note_id=note_id, text=text)
        if note_id not in NOTES:
            raise MCPError(INVALID_PARAMS, f"there is no note {note_id}")
        NOTES[note_id] = text
        return f"renamed note {note_id}"

    @server.tool(annotations=DESTRUCTIVE, structured_output=False)
    async def slow_delete(note_id: int, ctx: Context) -> str:
        """Delete a note, slowly: waits for MCP_TEST_RELEASE first."""
        record(ctx, "slow_delete", note_id=note_id)
        await wait_for_release()
        NOTES.pop(note_id, None)
        return f"deleted note {note_id}"

    @server.tool(annotations=READ_ONLY, structured_output=False)
    async def slow_read(ctx: Context) -> str:
        """Read the notes, slowly: waits for MCP_TEST_RELEASE first."""
        record(ctx, "slow_read")
        await wait_for_release()
        return f"{len(NOTES)} notes"

    @server.tool(annotations=READ_ONLY, structured_output=False)
    def broken_notes(ctx: Context) -> str:
        """Always fails (an isError result)."""
        record(ctx, "broken_notes")
        raise ToolError("the notes database is offline")

    @server.tool(annotations=READ_ONLY)
    def note_stats(ctx: Context) -> NoteStats:
        """How many notes there are (structured output)."""
        record(ctx, "note_stats")
        return NoteStats(count=len(NOTES), longest=max(NOTES.values(), key=len, default=""))

    @server.tool(name="notes.search", annotations=READ_ONLY, structured_output=False)
    def search(query: str, ctx: Context) -> str:
        """Find notes containing a word (a name with a dot)."""
        record(ctx, "notes.search", query=query)
        return "\n".join(v for v in NOTES.values() if query in v)

    @server.tool(annotations=READ_ONLY, structured_output=False)
    def note_chart(ctx: Context) -> list[Any]:
        """A chart of the notes: an image and a link (content that is not text)."""
        record(ctx, "note_chart")
        return [
            TextContent(type="text", text="the chart"),
            ImageContent(type="image", data="iVBORw0KGgo=" * 1000, mime_type="image/png"),
            ResourceLink(type="resource_link", uri="notes://chart", name="chart"),
        ]

    @server.tool(annotations=READ_ONLY, structured_output=False)
    async def chatty_notes(ctx: Context) -> str:
        """Logs and reports progress before it answers (notifications on an SSE stream)."""
        record(ctx, "chatty_notes")
        for step in range(3):
            await ctx.info(f"working {step}")
            await ctx.report_progress(step, 3)
        return "done talking"

    @server.tool(annotations=READ_ONLY, structured_output=False)
    async def ask_client(ctx: Context) -> str:
        """Asks the client a question (a request from the server) before it answers."""
        record(ctx, "ask_client")
        try:
            answer = await ctx.elicit("Which note?", Choice)
        except Exception as exc:
            return f"the client did not answer: {exc}"
        return f"the client said {answer.action}"

    @server.tool(annotations=ADDITIVE, structured_output=False)
    async def polled_note(text: str, ctx: Context) -> str:
        """Adds a note, closing its SSE stream first (/resumable: the client resumes)."""
        record(ctx, "polled_note", text=text)
        await ctx.close_sse_stream()
        await asyncio.sleep(0.2)
        note_id = next(NEXT_ID)
        NOTES[note_id] = text
        return f"added note {note_id} while you were away"

    return server


class MemoryEventStore(EventStore):
    """Events kept in memory, replayed after a Last-Event-ID (what /resumable needs)."""

    def __init__(self) -> None:
        self.events: list[tuple[StreamId, EventId, JSONRPCMessage | None]] = []

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        event_id = str(len(self.events) + 1)
        self.events.append((stream_id, event_id, message))
        return event_id

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        found = [i for i, (_, e, _) in enumerate(self.events) if e == last_event_id]
        if not found:
            return None
        stream_id = self.events[found[0]][0]
        for sid, event_id, message in self.events[found[0] + 1 :]:
            if sid == stream_id and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream_id


ENDPOINTS: dict[str, dict[str, Any]] = {
    "/json": {"json_response": True},
    "/sse": {},
    "/stateless-json": {"json_response": True, "stateless_http": True},
    "/stateless-sse": {"stateless_http": True},
    "/auth": {"json_response": True},
    "/resumable": {"event_store": "memory", "retry_interval": 50},
}


class App:
    """One ASGI app for every endpoint: routes by path, runs each SDK server's session
    manager for the app's lifespan, and asks /auth for its bearer token."""

    def __init__(self) -> None:
        self.apps: dict[str, Any] = {}
        self.servers: list[MCPServer] = []
        for path, options in ENDPOINTS.items():
            server = make_server(f"notes{path.replace('/', '-')}")
            if options.get("event_store") == "memory":
                options = {**options, "event_store": MemoryEventStore()}
            self.apps[path] = server.streamable_http_app(streamable_http_path=path, **options)
            self.servers.append(server)

    @contextlib.asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for server in self.servers:
                await stack.enter_async_context(server.session_manager.run())
            yield

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self.serve_lifespan(receive, send)
            return
        path = scope.get("path", "")
        app = self.apps.get(path)
        if app is None:
            await self.answer(send, 404, b"no such endpoint")
            return
        if path == "/auth":
            headers = dict(scope.get("headers") or [])
            wanted = f"Bearer {os.environ.get('MCP_TEST_TOKEN', '')}".encode()
            if headers.get(b"authorization") != wanted:
                await self.answer(send, 401, b'{"error": "invalid_token"}')
                return
        await app(scope, receive, send)

    async def serve_lifespan(self, receive: Any, send: Any) -> None:
        message = await receive()
        assert message["type"] == "lifespan.startup"
        async with self.lifespan():
            await send({"type": "lifespan.startup.complete"})
            message = await receive()
        await send({"type": "lifespan.shutdown.complete"})

    @staticmethod
    async def answer(send: Any, status: int, body: bytes) -> None:
        headers = [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def bind(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


async def serve(port: int) -> None:
    sock = bind(port)
    config = uvicorn.Config(App(), log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
            return
        await asyncio.sleep(0.01)
    print(f"listening {sock.getsockname()[1]}", flush=True)
    await task


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    sys.exit(asyncio.run(serve(parser.parse_args().port)))
