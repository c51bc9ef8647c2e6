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
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, TypeAlias

from .._json import repair_text
from .._timeouts import timeout
from ..events import CancelToken, MessageStored, RunEvent
from ..messages import TextDelta
from .wire import Reply

__all__ = ["KEEP_ALIVE_S", "EventQueue", "LiveSession", "LiveTurn", "follow", "sse"]

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


class LiveTurn:
    """One turn while it runs: its events, fanned out to every follower."""

    def __init__(self) -> None:
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

    @property
    def current(self) -> LiveTurn | None:
        """The turn `/events` follows and `/cancel` stops: the running one, else the first
        accepted one (a request is a turn from the moment it is accepted, before its
        first write: a new session's first turn has nothing stored yet)."""
        return self.turn or (self.waiting[0] if self.waiting else None)


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
