"""The AI SDK's `WebSocketChatTransport` on a session's Durable Object: its frames, each
socket's state, and a turn's chunks for every socket of the session.

    GET /sessions/{name}/ws   the Worker checks the name (`upgrade_target`) and hands the
                              upgrade to the session's object, which accepts the socket with
                              the hibernation API (js_sockets.py): it may be evicted between
                              turns while its clients stay connected
    frames -> ChatSockets.on_frame    `send` runs a turn or decides tool approvals (as POST
                                      .../chat: `chat_request.py`), `abort` cancels it,
                                      `resume` replays the current reply, then follows
                                      the turn

What a socket has asked lives in its attachment (`SocketState`), never only in the
object's memory: a new instance after an eviction reads it back. Only a running turn's
pump (`TurnPump`) is memory, as the turn itself is. A chunk's `sequence` is its index in
the turn's UI message, the same for every socket: a client that comes back with its last
sequence gets exactly what it missed, from the pump's chunks. A reply's text goes out as
the model writes it, in pieces cut by the text alone (`ui_stream.text_pieces`), so the
same reply replayed from the stored messages (a pump that joins a turn started over
HTTP) is the same chunks. The guide: docs/chat-clients.md.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from ..events import MessageStored, RunEvent
from ..messages import Message, TextDelta
from ..stores.base import Store
from .auth import MASTER, authorize
from .bodies import body_of
from .chat_request import ChatAsk, ChatBody, read_chat
from .commands import SESSION_NAME, Command
from .config import ApiSettings
from .live import LiveSession, LiveTurn, decode_event, follow, stream_events
from .served_agents import ServedAgents, object_name
from .ui_stream import Chunk, UIMessageStream, replay, reply_message_id
from .wire import Reply, error_reply

__all__ = [
    "ChatSocket",
    "ChatSockets",
    "Serve",
    "SocketState",
    "TurnPump",
    "upgrade_target",
]

_SOCKET_PATH = re.compile(r"(?:/agents/(?P<agent>[^/]+))?/sessions/(?P<name>[^/]+)/ws")
_TAIL_WINDOW = 50  # stored messages read at a time, from the end, to find a turn's start


class ChatSocket(Protocol):
    """One accepted WebSocket, as the object sees it (js_sockets.py wraps workerd's)."""

    def send(self, text: str) -> None: ...

    def attachment(self) -> str | None: ...

    def attach(self, text: str) -> None: ...


@dataclass(slots=True)
class SocketState:
    """What a socket asked, kept in its attachment (a JSON string): the session it is of,
    whether a frame of it carried a valid token (an `abort` carries none), the request it
    follows (`request`, of the turn pump `turn`; a `send`'s turn's `key`), the last
    `sequence` it was sent, and how many frames it sent (`frames`: workerd delivered them
    to the hibernatable handler)."""

    name: str
    agent: str | None = None
    authorized: bool = False
    request: str | None = None
    kind: str | None = None  # "send", "resume" or "watch" (waits for the next turn)
    turn: str | None = None
    key: str | None = None  # the `send`'s turn's `turn_key`: what `abort` stops
    sequence: int = -1
    replaying: bool = False
    frames: int = 0

    @classmethod
    def of(cls, socket: ChatSocket) -> SocketState:
        return cls(**json.loads(socket.attachment() or "{}"))

    def keep(self, socket: ChatSocket) -> None:
        socket.attach(json.dumps(asdict(self)))

    def following(self, turn: str) -> bool:
        return self.request is not None and self.turn == turn and not self.replaying


def upgrade_target(
    path: str, headers: Mapping[str, str], served: ServedAgents | None
) -> tuple[str, str, str | None] | Reply | None:
    """For a `.../sessions/{name}/ws` path: (the session's object name, name, agent), or
    what to answer instead (a bad name, an agent not served, 426 without `Upgrade:
    websocket`); None for any other path. No token is asked here: browsers cannot set a
    handshake's headers, so each `send`/`resume` frame carries it (and so a refusal here
    names no served agent, as the API's 404 does for a caller with a token)."""
    found = _SOCKET_PATH.fullmatch(path)
    if found is None:
        return None
    agent, name = found.group("agent"), found.group("name")
    if served is not None and isinstance(served.address(path), Reply):
        return error_reply(404, "not-found", f"no chat socket at {path[:200]!r}")
    if served is None and agent is not None:
        return None
    if SESSION_NAME.fullmatch(name) is None:
        return error_reply(
            400, "invalid-session-name",
            "a session name is 1 to 64 characters from A-Z, a-z, 0-9, '_' and '-'",
        )  # fmt: skip
    if headers.get("upgrade", "").lower() != "websocket":
        return error_reply(426, "upgrade-required", f"{path} takes a WebSocket upgrade only")
    return object_name(agent, name), name, agent


def frame(kind: str, request_id: str, **fields: Any) -> str:
    """A server frame (`start`, `chunk`, `end`, `error`, `no-active`) of request `request_id`."""
    return json.dumps({"type": kind, "requestId": request_id, **fields}, ensure_ascii=False)


class TurnPump:
    """One running turn's UI message, chunk by chunk, to every socket that follows it.
    `stream`/`sent`/`position`: the encoder, every chunk made so far (a chunk's sequence
    is its index here: a resume is served from this list, exactly) and the last stored
    message they include; `first`: the position of the turn's user message, once seen;
    `done`: the turn ended (`sent` ends with its last chunks). A pump that began mid-turn
    (`mid_turn`: a turn started over HTTP) waits for its first follower's replay from
    the store (`adopt`) before it goes on with the live events; the reply it joined
    halfway comes whole when it is stored (`joined`: its deltas are skipped till then)."""

    def __init__(
        self,
        turn_id: str,
        sockets: Callable[[], Iterable[ChatSocket]],
        message_id: str | None = None,
        *,
        mid_turn: bool = False,
    ) -> None:
        self.id, self.sockets, self.mid_turn = turn_id, sockets, mid_turn
        self.stream = UIMessageStream(message_id)
        self.sent: list[Chunk] = []
        self.position = -1
        self.first: int | None = None
        self.joined = self.done = False
        self.ready = asyncio.Event()
        if not self.mid_turn:
            self.ready.set()

    def adopt(self, stream: UIMessageStream, chunks: list[Chunk], position: int) -> None:
        """Go on from a replay of the stored messages through `position`."""
        if not self.ready.is_set():
            self.stream, self.sent, self.position = stream, list(chunks), position
            self.joined = True
            self.ready.set()

    async def run(self, events: AsyncIterator[Any]) -> None:
        """Broadcast the turn's SSE `events` (live.py's wire) as chunks, then `end`."""
        try:
            await self.ready.wait()
            async for event in events:
                if event.event in ("done", "error"):
                    self.publish(self._ending(event.event, json.loads(event.data)))
                    break
                self.publish(self._chunks(decode_event(event)))
        finally:
            self.done = True
            self.finish()

    def _chunks(self, event: RunEvent | None) -> list[Chunk]:
        """The chunks of one live event: a stored message not sent yet, or a delta."""
        if isinstance(event, TextDelta):
            return [] if self.joined else self.stream.event(event)
        if not isinstance(event, MessageStored) or event.position <= self.position:
            return []
        self.position, self.joined = event.position, False
        if self.first is None and event.message.role == "user":
            self.first = event.position
        return self.stream.event(event)

    def _ending(self, kind: str, body: Any) -> list[Chunk]:
        if kind == "error" or not isinstance(body, dict) or "status" not in body:
            error = body.get("error", {}) if isinstance(body, dict) else {}
            return self.stream.error(str(error.get("message", "the turn failed")))
        error = body.get("error")
        text = error.get("message") if isinstance(error, dict) else None
        return self.stream.end(str(body["status"]), body.get("pending") or (), error=text)

    def publish(self, chunks: list[Chunk]) -> None:
        if not chunks:  # a delta short of a whole text piece: no socket's state to read
            return
        first = len(self.sent)
        self.sent += chunks
        for socket, state in self._followers():
            send_chunks(socket, state, chunks, first)

    def finish(self) -> None:
        for socket, state in self._followers():
            end(socket, state)

    def _followers(self) -> list[tuple[ChatSocket, SocketState]]:
        found = []
        for socket in self.sockets():
            state = SocketState.of(socket)
            if state.following(self.id):
                found.append((socket, state))
        return found


def send_chunks(socket: ChatSocket, state: SocketState, chunks: list[Chunk], first: int) -> None:
    """`chunks` (sequences `first`, `first + 1`, ...) to `socket`, those it does not have."""
    request = state.request or ""
    for sequence, chunk in enumerate(chunks, start=first):
        if sequence > state.sequence:
            _send(socket, frame("chunk", request, sequence=sequence, chunk=chunk))
            state.sequence = sequence
    state.keep(socket)


def end(socket: ChatSocket, state: SocketState) -> None:
    """The request's `end`: the socket follows nothing any more."""
    _send(socket, frame("end", state.request or ""))
    state.request = state.turn = state.kind = state.key = None
    state.keep(socket)


def _send(socket: ChatSocket, text: str) -> None:
    try:
        socket.send(text)
    except Exception as exc:  # a socket closing: its client resumes when it comes back
        print(f"durable-agents: a chat socket send failed: {exc}", file=sys.stderr)


Serve = Callable[[Command], Awaitable[Reply]]


class ChatSockets:
    """A session object's chat sockets. `serve(command)` is the object's own command path
    (turns go through its lock); `store`/`session_id` read the stored messages for a
    replay; `settings` the API's (tokens); `sockets()` every socket of the object
    (`ctx.getWebSockets()`); `keep_alive(task)` the object's `waitUntil`."""

    def __init__(
        self,
        *,
        serve: Serve,
        live: LiveSession,
        store: Callable[[], tuple[Store, str]],
        settings: Callable[[], ApiSettings],
        sockets: Callable[[], Iterable[ChatSocket]],
        keep_alive: Callable[[asyncio.Task[Any]], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.serve, self.live, self.store, self.settings = serve, live, store, settings
        self.sockets, self.keep_alive, self.clock = sockets, keep_alive, clock
        self.pumps: dict[str, TurnPump] = {}
        self.framed = False  # this instance was sent a frame
        self.sending: set[str] = set()  # turn keys of the `send`s being asked
        live.on_accept.append(self._accepted)
        self.tasks: set[asyncio.Task[Any]] = set()

    def opened(self, socket: ChatSocket, name: str, agent: str | None) -> None:
        """A socket just accepted for session `name` (of served agent `agent`)."""
        SocketState(name=name, agent=agent).keep(socket)

    async def on_frame(self, socket: ChatSocket, text: Any) -> None:
        """`webSocketMessage`: one client frame. Never raises: a bad frame is an `error`."""
        state = SocketState.of(socket)
        if state.frames and not self.framed:  # a new instance: the one it wrote to is gone
            print(
                f"durable-agents: a new instance of session {state.name!r}'s object took a "
                f"chat socket's frame (its attachment: {state.frames} frame(s) before)"
            )
        self.framed = True
        state.frames += 1
        state.keep(socket)
        try:
            data = json.loads(text if isinstance(text, str) else bytes(text).decode())
        except (ValueError, TypeError):
            data = None
        request_id = data.get("requestId") if isinstance(data, dict) else None
        if not isinstance(request_id, str):
            return  # nothing to answer to: the transport would not read it
        kind = data.get("type")
        if kind == "abort":
            self._abort(socket, state, request_id)
            return
        refused = self._refused(state, data)
        if refused is not None:
            state.keep(socket)
            _send(socket, frame("error", request_id, errorText=refused))
            return
        state.keep(socket)
        if kind == "send":
            self._start(socket, state, request_id, data)
        elif kind == "resume":
            body = data.get("body")
            await self._resume(socket, state, request_id, data.get("lastSequence"), body)
        else:
            _send(socket, frame("error", request_id, errorText=f"unknown frame type {kind!r}"))

    def _refused(self, state: SocketState, data: Mapping[str, Any]) -> str | None:
        """Why a `send`/`resume` frame is refused (its token, from its `headers`), or None.
        A frame without a token is taken from a socket that showed a valid one before."""
        headers = data.get("headers")
        token = None
        if isinstance(headers, dict):
            token = next((v for k, v in headers.items() if k.lower() == "authorization"), None)
        if token is None and state.authorized:
            return None
        grant = authorize(token if isinstance(token, str) else None, self.settings(), self.clock())
        if isinstance(grant, Reply):
            state.authorized = False
            return f"unauthorized: {grant.body['error']['message']}"
        if grant is not MASTER and grant != object_name(state.agent, state.name):
            state.authorized = False
            return f"forbidden: the token grants session {grant!r} only"
        state.authorized = True
        return None

    def _abort(self, socket: ChatSocket, state: SocketState, request_id: str) -> None:
        """`abort`: a `send`'s own turn is cancelled (as POST .../cancel does, at its next
        step boundary), also while it waits behind another socket's turn, which goes on; a
        `resume` only stops following."""
        if state.request != request_id:
            return
        if state.kind == "send" and state.authorized and state.key is not None:
            self.live.stop(state.key, "aborted by the chat client")
        state.request = state.turn = state.kind = state.key = None
        state.keep(socket)

    def _start(
        self, socket: ChatSocket, state: SocketState, request_id: str, data: Mapping[str, Any]
    ) -> None:
        """`send`: what its newest message asks, read as POST .../chat reads it
        (`read_chat`): a user message's turn, keyed by the message's id (a resend runs no
        second one), or the client's tool approval responses, each decided, the last one
        going on with the turn."""
        body = body_of(ChatBody, data)
        asked = body if isinstance(body, Reply) else read_chat(body)
        if isinstance(asked, Reply):
            _send(socket, frame("error", request_id, errorText=_why(asked)))
            return
        state.request, state.kind, state.turn, state.sequence = request_id, "send", None, -1
        state.key = asked.commands[-1].turn_key()
        state.keep(socket)
        self.sending.update(k for c in asked.commands if (k := c.turn_key()) is not None)
        where = {"name": state.name, "agent": state.agent}
        self._spawn(self._send_turn(socket, request_id, asked, where))

    async def _send_turn(
        self,
        socket: ChatSocket,
        request_id: str,
        asked: ChatAsk,
        where: Mapping[str, Any],
    ) -> None:
        """What the `send` asked, through the object's own path (for session `where`); the
        last command's turn to every follower, as UI message `asked.message_id`."""
        try:
            reply = await asked.send(lambda c: self.serve(c.model_copy(update=where)))
        finally:
            for command in asked.commands:
                key = command.turn_key()
                if key is not None:  # an `abort` that came before it was accepted has hit it
                    self.live.forget(key)
                    self.sending.discard(key)
        state = SocketState.of(socket)
        if reply.stream is None:  # refused (a digest mismatch, a call waiting, ...)
            if state.request == request_id:
                _send(socket, frame("error", request_id, errorText=_why(reply)))
                state.request = state.kind = None
                state.keep(socket)
            return
        pump = self._pump(request_id, asked.message_id)
        if state.request == request_id:  # not aborted meanwhile
            state.turn = pump.id
            state.keep(socket)
            _send(socket, frame("start", request_id))
        await pump.run(stream_events(reply.stream))

    async def _resume(
        self, socket: ChatSocket, state: SocketState, request_id: str, last: Any, body: Any
    ) -> None:
        """`resume`: the current reply from after `last` (the sequence the client holds;
        none: all of it; all of it too when the frame's `body.messageId` names another
        reply than the running one), then the running turn. When no turn runs:
        `no-active`, or, with `body.waitForTurn`, the next turn of the session, whoever
        starts it (the socket waits in its attachment: `watch`)."""
        body = body if isinstance(body, dict) else {}
        pump = next((p for p in reversed(self.pumps.values()) if not p.done), None)
        turn = self.live.current
        if pump is None and turn is not None:
            pump = self._pump(f"follow-{request_id}", mid_turn=True)
            self._spawn(pump.run(stream_events(follow(turn.follow(), after=-1))))
        if pump is None:
            if body.get("waitForTurn") is True:
                state.request, state.kind, state.turn = request_id, "watch", None
                state.sequence = -1
                state.keep(socket)
            else:
                _send(socket, frame("no-active", request_id))
            return
        state.request, state.kind, state.turn, state.replaying = request_id, "resume", pump.id, True
        state.sequence = last if isinstance(last, int) and last >= 0 else -1
        state.keep(socket)
        _send(socket, frame("start", request_id))
        if not pump.ready.is_set():  # a pump that began mid-turn: its first replay
            pump.adopt(*await self._replay(pump))
            self._take_watchers(pump)
        state = SocketState.of(socket)
        state.replaying = False
        if body.get("messageId", pump.stream.message_id) != pump.stream.message_id:
            state.sequence = -1  # the client's sequence counts another reply's chunks
        send_chunks(socket, state, pump.sent, 0)
        if pump.done:  # it ended while the store was read: `sent` holds its last chunks
            end(socket, state)

    def _take_watchers(self, pump: TurnPump) -> None:
        """The sockets waiting for the next turn (`watch`) follow `pump`'s from its start."""
        for socket in self.sockets():
            state = SocketState.of(socket)
            if state.kind == "watch" and state.request is not None:
                state.kind, state.turn, state.sequence = "resume", pump.id, -1
                _send(socket, frame("start", state.request))
                send_chunks(socket, state, pump.sent, 0)

    def _accepted(self, turn: LiveTurn) -> None:
        """A turn the object accepted (`LiveSession.accept`): if a socket waits for the next
        turn and no socket's `send` asked for this one (its pump comes with its answer),
        a pump follows it from its start."""
        if turn.key in self.sending:
            return
        if not any(SocketState.of(s).kind == "watch" for s in self.sockets()):
            return
        asked, _, key = (turn.key or "").partition(":")
        message_id = reply_message_id(key) if asked == "message" else None
        pump = self._pump(f"turn-{id(turn)}", message_id)
        self._spawn(pump.run(stream_events(follow(turn.follow(), after=-1))))

    async def _replay(self, pump: TurnPump) -> tuple[UIMessageStream, list[Chunk], int]:
        """The turn's UI message so far from the stored messages, for a pump that began
        mid-turn (what is stored after the read waits in its queue: `run` skips what the
        replay holds)."""
        messages, first = await self._current_reply(pump.first)
        stream, chunks = replay(messages, first)
        return stream, chunks, first + len(messages) - 1

    async def _current_reply(self, first: int | None) -> tuple[list[Message], int]:
        """The stored messages from the turn's user message (at `first`; None: the newest
        user message) on, and its position."""
        store, session_id = self.store()
        if first is not None:
            return await store.load_messages(session_id, start=first), first
        info = await store.get_session(session_id)
        count = 0 if info is None else info.message_count
        start, messages = count, []
        while start > 0:
            start = max(0, start - _TAIL_WINDOW)
            messages = await store.load_messages(session_id, start=start, limit=count - start)
            users = [i for i, m in enumerate(messages) if m.role == "user"]
            if users:
                return messages[users[-1] :], start + users[-1]
        return messages, start

    def _pump(
        self, turn_id: str, message_id: str | None = None, *, mid_turn: bool = False
    ) -> TurnPump:
        """A pump for a turn from its start (its reply's `message_id`, if known), or for a
        turn running already (`mid_turn`: it goes on from a replay); a socket waiting for
        the next turn follows it (a `mid_turn` one once its replay is in)."""
        for done in [k for k, p in self.pumps.items() if p.done]:
            del self.pumps[done]
        pump = self.pumps[turn_id] = TurnPump(turn_id, self.sockets, message_id, mid_turn=mid_turn)
        if not mid_turn:
            self._take_watchers(pump)
        return pump

    def _spawn(self, work: Awaitable[Any]) -> None:
        """Frames come one `webSocketMessage` each: a turn runs as a task of its own."""
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        if self.keep_alive is not None:
            self.keep_alive(task)


def _why(refusal: Reply) -> str:
    """A refusal's `errorText`: its code, then what to do ("approval-digest-mismatch: ...")."""
    error = refusal.body.get("error") if isinstance(refusal.body, dict) else None
    error = error if isinstance(error, dict) else {}
    return f"{error.get('code', 'error')}: {error.get('message', 'refused')}"
