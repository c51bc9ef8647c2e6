"""workerd's WebSockets for `chat_socket.py` (Pyodide only; imports `js`/`workers` lazily).

`forward_upgrade` hands a client's upgrade from the Worker to the session's Durable
Object; `accept` is the object's side: a `WebSocketPair` whose server end is accepted
with the hibernation API (`ctx.acceptWebSocket`, not `accept()`: the object may be
evicted while the socket stays open, and workerd wakes it for the next frame), answered
with a 101 that carries the client end. `JsSocket` is one such socket as
`chat_socket.ChatSocket`: its attachment is a JSON string (a Python dict is no
structured-clonable JS value).
"""

from __future__ import annotations

import contextlib
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from .chat_socket import ChatSockets, Serve, SocketState
from .config import ApiSettings, session_stores
from .js_streams import js_response
from .live import LiveSession
from .wire import Reply

__all__ = [
    "JsSocket", "SocketHandlers", "accept", "closed", "forward_upgrade", "is_upgrade",
    "object_chat",
]  # fmt: skip


async def forward_upgrade(env: Any, target: tuple[str, str, str | None] | Reply) -> Any:
    """The answer to a WebSocket upgrade (`chat_socket.upgrade_target`'s `target`): the
    session object's 101 with the client's end, passed back as it is; or a refusal."""
    if isinstance(target, Reply):
        return js_response(target)
    object_name, name, agent = target
    query = urlencode({"name": name, **({} if agent is None else {"agent": agent})})
    stub = env.SESSIONS.getByName(object_name)
    return await stub.fetch(
        f"https://session.internal/ws?{query}", headers={"upgrade": "websocket"}
    )


def is_upgrade(request: Any) -> bool:
    """Whether `request` (a `workers.Request`) asks for a WebSocket."""
    return str(request.js_object.headers.get("upgrade") or "").lower() == "websocket"


def object_chat(
    ctx: Any, env: Any, live: LiveSession, serve: Serve, keep_alive: Any
) -> ChatSockets:
    """A session object's `ChatSockets` over workerd's: its store and settings from
    `env`, its sockets `ctx.getWebSockets()` (those it accepted, across hibernation)."""
    return ChatSockets(
        serve=serve,
        live=live,
        store=lambda: (session_stores(env, ctx.storage)[0], str(ctx.id.toString())),
        settings=lambda: ApiSettings.from_env(env),
        sockets=lambda: [JsSocket(ws) for ws in ctx.getWebSockets()],
        keep_alive=keep_alive,
    )


def accept(ctx: Any, chat: ChatSockets, request: Any) -> Any:
    """Accept the upgrade `request` that `forward_upgrade` sent: the 101 to answer it with."""
    import js  # type: ignore[import-not-found, unused-ignore]
    from workers import Response  # type: ignore[import-not-found, unused-ignore]

    client, server = js.WebSocketPair.new().object_values()
    ctx.acceptWebSocket(server)
    params = parse_qs(urlsplit(str(request.url)).query)
    agent = params.get("agent")
    chat.opened(JsSocket(server), params["name"][0], agent[0] if agent else None)
    return Response(None, status=101, web_socket=client)


def closed(ws: Any, code: int, reason: str) -> None:
    """`webSocketClose`/`webSocketError`: close our end too, and say how many frames the
    socket sent (its attachment counts them: workerd delivered each to the object)."""
    frames = SocketState.of(JsSocket(ws)).frames
    print(f"durable-agents: a chat socket closed ({code}) after {frames} frame(s)")
    with contextlib.suppress(Exception):  # already closed
        ws.close(1000 if code in (1005, 1006) else code, reason[:120])


class SocketHandlers:
    """The hibernatable-socket handlers workerd calls on a session object (`src/entry.py`'s
    `AgentSession` inherits them), for the sockets `accept` accepted: its `chat` gets each
    frame, even after an eviction (a new instance; the socket's attachment is kept)."""

    chat: ChatSockets

    async def webSocketMessage(self, ws: Any, message: Any) -> None:
        await self.chat.on_frame(JsSocket(ws), message)

    async def webSocketClose(self, ws: Any, code: int, reason: str, clean: bool) -> None:
        closed(ws, code, reason)

    async def webSocketError(self, ws: Any, error: Any) -> None:
        closed(ws, 1011, str(error))


class JsSocket:
    """A workerd WebSocket as `chat_socket.ChatSocket`."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws

    def send(self, text: str) -> None:
        self.ws.send(text)

    def attachment(self) -> str | None:
        value = self.ws.deserializeAttachment()
        return value if isinstance(value, str) else None

    def attach(self, text: str) -> None:
        self.ws.serializeAttachment(text)
