"""The reads of a session, in pages, a chunk at a time: history, the timeline, the events
replay and the calls waiting for a decision.

Both sides are here: the Worker's parsing of a read's query (`page_query`,
`after_position`) and the object's handlers for the read commands. No read holds a
long session in memory or keeps its object busy for long; the limits are the
constants below, and docs/http-api.md#routes says what each read answers.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal, TypeVar

from ..agent_tools import AgentToolHandler, child_session_name
from ..approvals import LastStep, PendingApproval, approval_states, waiting_below, waiting_in
from ..events import ChildEvent
from ..messages import Message, ToolCall
from ..stores.base import Store
from .agent_calls import ChildObjects, ObjectAgents
from .commands import (
    HISTORY_LIMIT,
    MAX_HISTORY_LIMIT,
    MAX_VIEW_LIMIT,
    VIEW_LIMIT,
    Events,
    History,
    ListApprovals,
    View,
)
from .live import child_sse, follow, message_event, sse
from .object_context import ObjectContext, handles
from .wire import HTML_HEADERS, SSE_HEADERS, Reply, error_reply, no_session

__all__ = [
    "EVENTS_CHUNK",
    "EVENTS_READS",
    "FIRST_CHUNK",
    "MAX_CHUNK",
    "PAGE_BYTES",
    "REPLAY_PAUSE_S",
    "REPLAY_SLICE",
    "SSE_PIECE_BYTES",
    "VIEW_PAGE_BYTES",
    "after_position",
    "history",
    "last_step",
    "list_approvals",
    "page_query",
    "replay_events",
    "view",
]

# A page of GET /sessions/{name} or GET .../view stops before the message that would
# take its JSON past these bytes (a page holds one message at least).
PAGE_BYTES, VIEW_PAGE_BYTES = 2_000_000, 1_000_000
# /events replays the stored messages EVENTS_CHUNK a read, or more for a long history:
# in at most EVENTS_READS reads (D1 counts each query: 50 per request on the free plan).
EVENTS_CHUNK, EVENTS_READS = 200, 40
FIRST_CHUNK, MAX_CHUNK = 50, 200  # rows a page reads at once: the first read, the most
SSE_PIECE_BYTES = 256 * 1024  # replayed events are sent in pieces of about this size
# A replay shares its isolate's one loop (with every session in `wrangler dev`): it
# lets other requests in every REPLAY_SLICE messages, and pauses before each read
# after its first, so a long one slows others less (3 replays of 20,000 messages at
# once under scripts/dev: another session's turn took 2 s without the pause, 0.6-1 s
# with it; 0.2 s alone).
REPLAY_SLICE, REPLAY_PAUSE_S = 50, 0.02
_LIMITS = {"history": (HISTORY_LIMIT, MAX_HISTORY_LIMIT), "view": (VIEW_LIMIT, MAX_VIEW_LIMIT)}

T = TypeVar("T")


# --- the Worker's side: a read's query ---


def page_query(
    query: str, action: Literal["history", "view"]
) -> tuple[int | None, int | None, int | None] | Reply:
    """(after, before, limit) of a paged read, each None if not given: `?after=N`, `?limit=L`
    and, for the view, `?before=N` (other parameters are ignored, as the listing does)."""
    params = urllib.parse.parse_qs(query)
    names = ("after", "before", "limit") if action == "view" else ("after", "limit")
    values: dict[str, int | None] = {"after": None, "before": None, "limit": None}
    for key in names:
        raw = (params.get(key) or [""])[-1]
        if raw == "":
            continue
        if not raw.isascii() or not raw.isdigit() or len(raw) > 15:
            what = "a whole number" if key == "limit" else "a message position: a whole number >= 0"
            return error_reply(400, "invalid-request", f"{key} must be {what}")
        values[key] = int(raw)
    most = _LIMITS[action][1]
    if values["limit"] is not None and not 1 <= values["limit"] <= most:
        return error_reply(
            400, "invalid-request",
            f"limit must be a whole number 1 to {most} (default {_LIMITS[action][0]})",
        )  # fmt: skip
    if values["after"] is not None and values["before"] is not None:
        return error_reply(400, "invalid-request", "give after or before, not both")
    return values["after"], values["before"], values["limit"]


def after_position(last_event_id: str | None, query: str) -> int | Reply | None:
    """The position to replay after: `Last-Event-ID`, else `?after=`, else None (all)."""
    raw = last_event_id
    if raw is None:
        values = urllib.parse.parse_qs(query).get("after")
        raw = values[-1] if values else None
    if raw is None or raw == "":
        return None
    if not raw.isascii() or not raw.isdigit() or len(raw) > 15:
        return error_reply(
            400,
            "invalid-request",
            "Last-Event-ID (or ?after=) must be a message position: a whole number >= 0",
        )
    return int(raw)


# --- the object's side ---


@handles(ListApprovals)
async def list_approvals(command: ListApprovals, ctx: ObjectContext) -> Reply:
    """GET .../approvals: the calls of the last step waiting for a decision."""
    info = await ctx.store.get_session(ctx.session_id)
    if info is None or info.message_count == 0:
        return no_session(ctx.session_id)
    _, pending = await last_step(ctx.store, ctx.session_id, info.message_count, _below(ctx))
    return Reply(200, {"session_id": ctx.session_id, "pending": [p.to_dict() for p in pending]})


@handles(History)
async def history(command: History, ctx: ObjectContext) -> Reply:
    """GET /sessions/{name}: one page of the stored messages, each with its position, and
    `next`, the `after` of the page that follows (null on the last one)."""
    store, session_id = ctx.store, ctx.session_id
    start = 0 if command.after is None else command.after + 1
    page, more = await _read_forward(
        lambda at, n: store.load_messages(session_id, start=at, limit=n),
        start, command.limit or HISTORY_LIMIT, PAGE_BYTES, _message_bytes,
    )  # fmt: skip
    info = await store.get_session(session_id)
    if info is None or info.message_count == 0:
        return no_session(session_id)
    body = {
        "session_id": session_id,
        "messages": [{"position": p, **m.to_dict()} for p, m in page],
        "next": page[-1][0] if more and page else None,
        "message_count": max(info.message_count, page[-1][0] + 1 if page else 0),
    }
    return Reply(200, body)


@handles(View)
async def view(command: View, ctx: ObjectContext) -> Reply:
    """GET .../view: one page of the session's timeline, an HTML page a person reads: the
    latest messages, or those after `command.after` or before `command.before`, with
    links to the pages around it."""
    from ..session_links import agent_tool_agents, find_links
    from ..timeline import TimelinePage, render_timeline

    store, session_id = ctx.store, ctx.session_id
    info = await store.get_session(session_id)
    if info is None or info.message_count == 0:
        return no_session(session_id)
    count, limit = info.message_count, command.limit or VIEW_LIMIT
    rows, more, first = await _view_rows(command, store, session_id, count, limit)
    last = first
    if rows:
        first, last = rows[0][0], rows[-1][0]
        more = more or last + 1 < count
    following = await _results_after(store, session_id, rows, last) if rows and more else []
    # A child or parent session the store here holds (D1's one database; a Durable
    # Object's own storage holds none but its own): linked, by the served agents' URLs.
    shown = [m for _, (_, m) in rows]
    served = ctx.agents.served_agent if isinstance(ctx.agents, ObjectAgents) else None
    links = await find_links(
        store, session_id, shown, agents=agent_tool_agents(ctx.agent), served_agent=served
    )
    page = render_timeline(
        name=command.name or info.name or session_id,
        session_id=session_id,
        agent=info.agent_name,
        entries=[entry for _, entry in rows],
        approvals=await store.load_approvals(session_id),
        page=TimelinePage(first, _view_links(rows, first, last, limit, more), following),
        session=info,
        links=links,
    )
    return Reply(200, None, HTML_HEADERS, text=page)


async def _view_rows(
    command: View, store: Store, session_id: str, count: int, limit: int
) -> tuple[list[tuple[int, tuple[int, Message]]], bool, int]:
    """The timeline entries of the page `command` asks for, whether more follow it, and
    where the page starts when it is empty."""

    def load(at: int, n: int) -> Awaitable[list[tuple[int, Message]]]:
        return store.load_timeline(session_id, start=at, limit=n)

    def size(entry: tuple[int, Message]) -> int:
        return _message_bytes(entry[1])

    if command.after is not None:
        start = command.after + 1
        rows, more = await _read_forward(load, start, limit, VIEW_PAGE_BYTES, size)
        return rows, more, start
    end = count if command.before is None else min(command.before, count)
    return await _read_backward(load, end, limit, VIEW_PAGE_BYTES, size), False, end


def _view_links(rows: list[Any], first: int, last: int, limit: int, more: bool) -> dict[str, str]:
    """The links of a timeline page to the pages around it."""
    shown = f"&limit={limit}"
    links: dict[str, str] = {}
    if rows and first > 0:
        links["first"] = f"?before={min(limit, first)}{shown}"
        links["older"] = f"?before={first}{shown}"
    if rows and more:
        links["newer"] = f"?after={last}{shown}"
    if more or not rows:
        links["latest"] = f"?limit={limit}"
    return links


async def _results_after(
    store: Store, session_id: str, rows: list[tuple[int, tuple[int, Message]]], last: int
) -> list[tuple[int, Message]]:
    """The results of the page's last calls, stored after it (so the page shows them)."""
    asked = {c.id for _, (_, m) in rows for c in m.tool_calls}
    asked -= {m.tool_call_id for _, (_, m) in rows if m.role == "tool"}
    if not asked:
        return []
    after = await store.load_messages(session_id, start=last + 1, limit=len(asked) + 2)
    return [(last + 1 + i, m) for i, m in enumerate(after)]


@handles(Events)
async def replay_events(command: Events, ctx: ObjectContext) -> Reply:
    """GET .../events: the stored messages after `command.after`, then the running turn live
    (also a new session's first turn, before anything of it is stored). The replay reads
    the history a chunk at a time as the client takes it: never all of it at once. While
    the last step's agent-tool calls have no result, their child sessions' stored messages
    follow the session's own, as `child` events. `command.follow=False`: the messages
    stored when asked, and nothing after them."""
    store, session_id = ctx.store, ctx.session_id
    turn = ctx.live.current if command.follow else None
    queue = turn.follow() if turn is not None else None  # first: nothing stored later is missed
    try:
        info = await store.get_session(session_id)
        count = 0 if info is None else info.message_count
        if count == 0 and queue is None:
            return no_session(session_id)
        idle = None
        if queue is None and command.follow:
            idle = await _idle_state(session_id, store, count, _below(ctx))
    except BaseException:
        if turn is not None and queue is not None:
            turn.unfollow(queue)
        raise
    after = -1 if command.after is None else command.after

    async def replay() -> AsyncIterator[bytes]:
        last = after
        try:
            # No turn running: the messages stored when asked, as `idle` describes them.
            # A turn running: every stored one, then its events (those replayed skipped).
            stop = count if queue is None else None
            async for piece, position in _replayed(store, session_id, after, stop, count):
                yield piece
                last = position
            async for event in _children_replayed(ctx, count):
                yield event
            if queue is None:
                if idle is not None:
                    yield sse("done", idle)
                return
            async for chunk in follow(queue, last):
                yield chunk
        finally:
            if turn is not None and queue is not None:
                turn.unfollow(queue)

    return Reply(200, None, SSE_HEADERS, stream=replay())


async def _replayed(
    store: Store, session_id: str, after: int, stop: int | None, count: int
) -> AsyncIterator[tuple[bytes, int]]:
    """The `message` events of the stored messages after `after` (to `stop`, see `_stored`),
    in pieces of about SSE_PIECE_BYTES, each with the position of its last message."""
    piece: list[bytes] = []
    size, position = 0, after
    async for position, message in _stored(store, session_id, after + 1, stop, count):
        event = message_event(position, message.to_dict())
        piece.append(event)
        size += len(event)
        if size >= SSE_PIECE_BYTES:
            yield b"".join(piece), position
            piece, size = [], 0
        if (position - after) % REPLAY_SLICE == 0:
            await asyncio.sleep(0)  # a long replay must not hold the loop
    if piece:
        yield b"".join(piece), position


async def _children_replayed(ctx: ObjectContext, count: int) -> AsyncIterator[bytes]:
    """The `child` events of the stored messages of the child sessions of the last step's
    agent-tool calls that have no result yet (of the session's first `count` messages),
    each asked of the child's object (`ObjectAgents.stored_events`). A client may have
    some already: a child's `session` and `id` tell which."""
    runner = ctx.agents
    if not isinstance(runner, ObjectAgents) or count == 0:
        return
    _, calls = await _last_calls(ctx.store, ctx.session_id, count)
    handlers = {t.name: t.handler for t in ctx.agent.tools}
    for call in calls:
        handler = handlers.get(call.name)
        if not isinstance(handler, AgentToolHandler):
            continue
        name = child_session_name(ctx.session_id, call.id)
        async for event in runner.stored_events(handler.agent, name):
            data = child_sse(ChildEvent(handler.agent, name, call.id, event))
            if data is not None:
                yield data


async def _stored(
    store: Store, session_id: str, start: int, stop: int | None, count: int
) -> AsyncIterator[tuple[int, Message]]:
    """(position, message) of the stored messages from `start` to `stop` (None: to the end,
    as long as a read comes back full), EVENTS_CHUNK or more a read: `count` (the session's
    size when asked) is read in at most about EVENTS_READS reads."""
    position, reads = start, EVENTS_READS
    while stop is None or position < stop:
        size = max(EVENTS_CHUNK, -(-(count - position) // max(reads, 1)))
        if stop is not None:
            size = min(size, stop - position)
        if reads < EVENTS_READS:
            await asyncio.sleep(REPLAY_PAUSE_S)  # room for the isolate's other requests
        chunk = await store.load_messages(session_id, start=position, limit=size)
        reads -= 1
        for message in chunk:
            yield position, message
            position += 1
        if len(chunk) < size:
            return


Below = Callable[[LastStep], Awaitable[dict[str, list[PendingApproval]]]]
"""What waits below a step's calls that ran an agent tool's child turn, by call."""


def _below(ctx: ObjectContext) -> Below | None:
    """How the object finds what waits in its calls' child sessions: by asking their
    objects (`ChildObjects`), where it reaches them; else in its store."""
    children = ChildObjects.of(ctx.agents, ctx.agent)
    return None if children is None else children.waiting


async def last_step(
    store: Store, session_id: str, count: int, below: Below | None = None
) -> tuple[Message | None, list[Any]]:
    """The session's last message and the calls waiting for a decision (`pending_approvals`),
    found from the end of its `count` messages (`_last_calls`): the last step's own, then,
    below those of its calls that ran an agent tool's child turn, the calls waiting in the
    child's session (and its children's), tagged with their session (`below`; default:
    looked up in `store`, `approvals.waiting_below`)."""
    last, calls = await _last_calls(store, session_id, count)
    if not calls:
        return last, []
    step = LastStep(session_id, calls, approval_states(await store.load_approvals(session_id)))
    below_calls = await (below(step) if below is not None else waiting_below(store, step))
    return last, waiting_in(step, below_calls)


async def _last_calls(
    store: Store, session_id: str, count: int
) -> tuple[Message | None, list[ToolCall]]:
    """The session's last message and its last assistant message's calls that have no
    result after it, found from the end of its `count` messages: read backwards a few
    messages at a time, never all of them."""
    answered: set[str] = set()
    last: Message | None = None
    end, size = count, 8
    while end > 0:
        start = max(0, end - size)
        chunk = await store.load_messages(session_id, start=start, limit=end - start)
        if not chunk:
            break
        last = last or chunk[-1]
        for message in reversed(chunk):
            if message.role == "assistant":
                return last, [c for c in message.tool_calls if c.id not in answered]
            if message.role == "tool" and message.tool_call_id is not None:
                answered.add(message.tool_call_id)
        end, size = start, min(size * 4, MAX_CHUNK)
    return last, []


async def _idle_state(
    session_id: str, store: Store, count: int, below: Below | None
) -> dict[str, Any]:
    """What `done` says when no turn runs: how the last turn was left."""
    body: dict[str, Any] = {"session_id": session_id, "running": False, "response": ""}
    last, pending = await last_step(store, session_id, count, below)
    if last is not None and last.is_final_reply:
        body.update(status="complete", response=last.content)
    elif pending:
        body.update(status="awaiting_approval", pending=[p.to_dict() for p in pending])
    else:
        body["status"] = "interrupted"  # a crash, a cancel or a failed LLM call: POST .../resume
    return body


def _message_bytes(message: Message) -> int:
    """How many bytes `message` takes in a page's JSON."""
    return len(json.dumps(message.to_dict(), ensure_ascii=False).encode())


def _next_chunk(used: int, taken: int, budget: int) -> int:
    """How many rows to read next: about what is left of `budget` by the sizes so far."""
    average = max(used // max(taken, 1), 1)
    return max(1, min(MAX_CHUNK, (budget - used) // average + 1))


async def _read_forward(
    load: Callable[[int, int], Awaitable[list[T]]], start: int, limit: int, budget: int,
    size: Callable[[T], int],
) -> tuple[list[tuple[int, T]], bool]:  # fmt: skip
    """Up to `limit` (position, item) from position `start` on, read a chunk at a time
    (`load(start, n)`), stopping before the item that takes their `size` past `budget`
    (the first is always taken); and whether more follow."""
    page: list[tuple[int, T]] = []
    used, position, chunk = 0, start, FIRST_CHUNK
    while True:
        want = min(chunk, limit + 1 - len(page))  # one more than the page: is there a next?
        got = await load(position, want)
        for item in got:
            weight = size(item)
            if len(page) == limit or (page and used + weight > budget):
                return page, True
            page.append((position, item))
            used, position = used + weight, position + 1
        if len(got) < want:
            return page, False
        chunk = _next_chunk(used, len(page), budget)


async def _read_backward(
    load: Callable[[int, int], Awaitable[list[T]]], end: int, limit: int, budget: int,
    size: Callable[[T], int],
) -> list[tuple[int, T]]:  # fmt: skip
    """Up to `limit` (position, item) before position `end`, the latest kept: read a chunk
    at a time backwards, stopping before the item that takes their `size` past `budget`
    (the last is always taken)."""
    page: list[tuple[int, T]] = []  # latest first
    used, position, chunk = 0, end, FIRST_CHUNK
    floor = max(0, end - limit)
    while position > floor:
        start = max(floor, position - chunk)
        got = await load(start, position - start)
        for offset in range(len(got) - 1, -1, -1):
            weight = size(got[offset])
            if page and used + weight > budget:
                return page[::-1]
            page.append((start + offset, got[offset]))
            used += weight
        position, chunk = start, _next_chunk(used, len(page), budget)
    return page[::-1]
