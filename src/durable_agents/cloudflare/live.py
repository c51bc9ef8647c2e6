"""What a session's Durable Object keeps in memory: its one running turn, and who watches it.

    LiveSession                      one per Durable Object (one per session)
      .lock                          one turn at a time
      .turn -> LiveTurn              the turn running now, if any
                 .follow()           a queue of its SSE events from now on
                 .cancel             its CancelToken (POST .../cancel)
                 .reply              its answer, once it ended

A turn runs as a task of its own, never as a part of the request that
started it: a client that disconnects stops only its own stream, the turn
goes on and is stored. Events are encoded once, as SSE (`sse()`), and
handed to every follower's queue; nothing here writes to the store.

Both directions of the wire format are here: `run()`'s events to SSE (`on_event`,
`child_event_data` for an agent tool's child's, tagged) and a turn's SSE back to
events (`decode_event`, `stream_events`), which a parent's object reads from its
child's (agent_calls.py). The format: docs/http-api.md#streaming.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeAlias

from .._http.sse import SSEEvent, sse_events, sse_lines
from .._json import repair_text
from .._timeouts import timeout
from ..events import CancelToken, ChildEvent, MessageStored, RunEvent
from ..messages import Message, TextDelta
from .js_streams import js_chunks
from .wire import Reply

__all__ = [
    "KEEP_ALIVE_S",
    "EventQueue",
    "LiveSession",
    "LiveTurn",
    "child_event_data",
    "child_sse",
    "decode_event",
    "follow",
    "sse",
    "stream_events",
]

# A comment line this often while nothing else is sent: proxies close idle streams.
KEEP_ALIVE_S = 15.0

EventQueue: TypeAlias = "asyncio.Queue[tuple[str, int | None, bytes]]"
"""A follower's queue: (kind, the message's position or None, the event's SSE bytes)."""


def sse(event: str, data: Any, event_id: int | None = None) -> bytes:
    """One server-sent event: `event:`, optional `id:`, one `data:` line of JSON."""
    head = f"event: {event}\n" + ("" if event_id is None else f"id: {event_id}\n")
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return (head + f"data: {repair_text(text)}\n\n").encode()


def message_event(position: int, message_dict: dict[str, Any]) -> bytes:
    return sse("message", message_dict, position)


def end_event(reply_status: int, body: Any) -> bytes:
    """A turn's last event: `done` with its result, or `error` when it has none
    (the body is then `{"error": {...}}`)."""
    is_result = isinstance(body, dict) and "status" in body
    return sse("done" if is_result or reply_status < 400 else "error", body)


def child_event_data(event: ChildEvent) -> dict[str, Any] | None:
    """The data of the `child` event that stands for `event`: the child's event as its own
    stream has it (`event`, `data`, and `id`, its position, for a message), tagged with
    the child's agent, session and the parent's call. None for what a child's stream does
    not carry (its `RunFinished`: the call's result says how the child ended)."""
    inner = event.event
    position: int | None = None
    data: dict[str, Any] | None
    if isinstance(inner, TextDelta):
        kind, data = "delta", {"text": inner.text}
    elif isinstance(inner, MessageStored):
        kind, data, position = "message", inner.message.to_dict(), inner.position
    elif isinstance(inner, ChildEvent):
        kind, data = "child", child_event_data(inner)
        if data is None:
            return None
    else:
        return None
    tagged: dict[str, Any] = {
        "agent": event.agent,
        "session": event.session_name,
        "tool_call_id": event.tool_call_id,
        "event": kind,
        "data": data,
    }
    if position is not None:
        tagged["id"] = position
    return tagged


def child_sse(event: ChildEvent) -> bytes | None:
    """`event` as a `child` SSE event; no `id:` line (a stream's ids are its session's
    positions, which a reconnect's Last-Event-ID names); None if no child event stands for it."""
    data = child_event_data(event)
    return None if data is None else sse("child", data)


def decode_event(event: SSEEvent) -> RunEvent | None:
    """The `run()` event a turn's SSE event stands for (`message`, `delta`, `child`, nested
    to any depth); None for the others (`done`, `error`) and for one it cannot read."""
    try:
        return _decoded(event.event, json.loads(event.data), event.id)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def _decoded(kind: str, data: Any, event_id: Any) -> RunEvent | None:
    """`decode_event` of parsed data: a `child` event's inner one is read the same way."""
    if kind == "delta":
        return TextDelta(str(data["text"]))
    if kind == "message":
        return MessageStored(int(event_id), Message.from_dict(data))
    if kind == "child":
        inner = _decoded(str(data["event"]), data["data"], data.get("id"))
        if inner is None:
            return None
        tags = (str(data["agent"]), str(data["session"]), str(data["tool_call_id"]))
        return ChildEvent(*tags, inner)
    return None


def stream_events(stream: Any) -> AsyncIterator[SSEEvent]:
    """The SSE events of a `Reply.stream`: in a Worker, another object's JS ReadableStream
    (it has `getReader`); on CPython, an async iterator of bytes."""
    chunks = js_chunks(stream) if hasattr(stream, "getReader") else stream
    return sse_events(sse_lines(chunks))


class LiveTurn:
    """One turn while it runs: its events, fanned out to every follower. `key`: what
    names it (its command's `turn_key`), if anything does."""

    def __init__(self, key: str | None = None) -> None:
        self.key = key
        self.cancel = CancelToken()
        self.followers: set[EventQueue] = set()
        self.ended = asyncio.Event()
        self.reply: Reply | None = None  # once ended

    def follow(self) -> EventQueue:
        """A queue of this turn's events from now on: (kind, position or None, SSE bytes)."""
        queue: EventQueue = asyncio.Queue()
        if self.reply is not None:
            queue.put_nowait(("end", None, end_event(self.reply.status, self.reply.body)))
        else:
            self.followers.add(queue)
        return queue

    def unfollow(self, queue: EventQueue) -> None:
        self.followers.discard(queue)

    def publish(self, kind: str, position: int | None, data: bytes) -> None:
        for queue in self.followers:
            queue.put_nowait((kind, position, data))

    def on_event(self, event: RunEvent) -> None:
        """`run()`'s `on_event`: never blocks, never raises."""
        if isinstance(event, TextDelta):
            self.publish("delta", None, sse("delta", {"text": event.text}))
        elif isinstance(event, MessageStored):
            self.publish(
                "message", event.position, message_event(event.position, event.message.to_dict())
            )
        elif isinstance(event, ChildEvent):
            data = child_sse(event)
            if data is not None:
                self.publish("child", None, data)

    def end(self, reply: Reply) -> None:
        """The turn is over: its `done` (or `error`) goes to every follower."""
        self.reply = reply
        self.publish("end", None, end_event(reply.status, reply.body))
        self.followers.clear()
        self.ended.set()


class LiveSession:
    """A session's in-memory state in its Durable Object (see the module docstring)."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.turn: LiveTurn | None = None  # the turn holding the lock
        self.waiting: list[LiveTurn] = []  # accepted turns waiting for the lock, in order
        self.tasks: set[asyncio.Task[Any]] = set()  # turns still running: kept referenced
        self.stopped: set[str] = set()  # keys of turns cancelled before they were accepted
        # Told of each turn as it is accepted (the chat sockets: a socket may wait for it).
        self.on_accept: list[Callable[[LiveTurn], None]] = []

    @property
    def current(self) -> LiveTurn | None:
        """The turn `/events` follows and `/cancel` stops: the running one, else the first
        accepted one (a request is a turn from the moment it is accepted, before its
        first write: a new session's first turn has nothing stored yet)."""
        return self.turn or (self.waiting[0] if self.waiting else None)

    def accept(self, turn: LiveTurn) -> None:
        """A turn is accepted: it waits for the lock (cancelled at once if `stop` named it)."""
        self.waiting.append(turn)
        if turn.key is not None and turn.key in self.stopped:
            self.stopped.discard(turn.key)
            turn.cancel.cancel("cancelled before it began")
        for listener in self.on_accept:
            listener(turn)

    def stop(self, key: str, reason: str) -> None:
        """Cancel the turn running or waiting whose `key` is `key`; if none is, the one
        with that key accepted next (a request on its way: `forget` the key once it is
        answered)."""
        turns = [self.turn, *self.waiting] if self.turn is not None else self.waiting
        turn = next((turn for turn in turns if turn.key == key), None)
        if turn is None:
            self.stopped.add(key)
        else:
            turn.cancel.cancel(reason)

    def forget(self, key: str) -> None:
        self.stopped.discard(key)


async def follow(
    queue: EventQueue,
    after: int,
    keep_alive: float = KEEP_ALIVE_S,
) -> AsyncIterator[bytes]:
    """A turn's events from `queue` until its end: messages at or before `after` (already
    sent) are skipped; a comment every `keep_alive` seconds while nothing comes."""
    while True:
        try:
            async with timeout(keep_alive):  # one per event: it must leave no JS timer behind
                kind, position, data = await queue.get()
        except TimeoutError:
            yield b": keep-alive\n\n"
            continue
        if kind == "message" and position is not None and position <= after:
            continue
        yield data
        if kind == "end":
            return
