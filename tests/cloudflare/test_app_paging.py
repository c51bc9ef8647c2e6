"""Reads in pages (issue 20, item 3) over the Worker's API on CPython (fake D1): `GET
/sessions/{name}?after=&limit=` chains through every position once, `GET .../view` opens at
the latest page and links the others, `GET .../events` replays a long history a chunk at a
time, and no read loads a whole session. test_dev_server_operating.py does the same over
HTTP in the local runtime."""

from __future__ import annotations

import asyncio
import html
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from tests.support.app_calls import parse, read_all  # the SSE of a Reply, parsed

from durable_agents import Agent, LLMResponse, Message, TextDelta, ToolCall, ToolSpec, Usage
from durable_agents.cloudflare import app, d1_store
from durable_agents.cloudflare import reads as paging
from durable_agents.cloudflare.app import Command, LiveSession, Reply, handle_request
from durable_agents.cloudflare.commands import HISTORY_LIMIT
from durable_agents.cloudflare.tokens import mint_session_token
from durable_agents.stores import memory_store
from durable_agents.stores.base import ApprovalChange, Store
from durable_agents.stores.d1 import D1Store
from durable_agents.testing.conformance import ticking_clock
from durable_agents.testing.fake_d1 import FakeD1Database

TOKEN = "master-token"
SECRET = "0123456789abcdef0123456789abcdef-secret"
ENV = {"API_TOKEN": TOKEN, "SESSION_TOKEN_SECRET": SECRET}
NOW = 1_800_000_000.0


def turn(n: int) -> list[Message]:
    """One turn of five messages: the question, a step of two calls, their results, the reply."""
    calls = [ToolCall(f"t{n}a", "lookup", {"q": n}), ToolCall(f"t{n}b", "lookup", {"q": -n})]
    return [
        Message.user(f"question {n}"),
        Message.assistant(f"looking {n} up", calls, usage=Usage(10, 1)),
        *(Message.tool_result(c, json.dumps({"answer": n})) for c in calls),
        Message.assistant(f"answer {n}", usage=Usage(20, 2)),
    ]


def conversation(turns: int) -> list[Message]:
    return [m for n in range(turns) for m in turn(n)]


class Reads:
    """A store that records the messages each read asks for: (what, start, limit)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.reads: list[tuple[str, int, int | None]] = []

    async def load_messages(
        self, session_id: str, *, start: int = 0, limit: int | None = None
    ) -> list[Message]:
        self.reads.append(("messages", start, limit))
        return await self.inner.load_messages(session_id, start=start, limit=limit)

    async def load_timeline(
        self, session_id: str, *, start: int = 0, limit: int | None = None
    ) -> list[tuple[int, Message]]:
        self.reads.append(("timeline", start, limit))
        return await self.inner.load_timeline(session_id, start=start, limit=limit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class Model:
    """Answers at once; while `hold` is set, each call waits for `release` first."""

    def __init__(self) -> None:
        self.hold = False
        self.release = asyncio.Event()
        self.started = asyncio.Event()

    async def chat(self, messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        self.started.set()
        if self.hold:
            await self.release.wait()
        return LLMResponse(f"heard {messages[-1].content}", usage=Usage(1, 1))

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec]
    ) -> AsyncIterator[TextDelta | LLMResponse]:
        yield await self.chat(messages, tools)


class Worker:
    """The Worker and its Durable Objects in one process; session `name` is `id-<name>`."""

    def __init__(self, store: Any) -> None:
        self.store, self.model, self.lives = Reads(store), Model(), {}  # type: ignore[var-annotated]

    async def dispatch(self, name: str, command: Command) -> Reply:
        return await app.serve_session(
            Command.from_json(command.to_json()), session_id=f"id-{name}", store=self.store,
            env=ENV, live=self.lives.setdefault(name, LiveSession()), agent=AGENT,
            make_deps=lambda env, http: None, llm=self.model,
        )  # fmt: skip

    async def __call__(
        self, method: str, path: str, query: str = "", *, bearer: str = TOKEN,
        headers: dict[str, str] | None = None, body: Any = None,
    ) -> Reply:  # fmt: skip
        raw = b"" if body is None else json.dumps(body).encode()
        return await handle_request(
            method, path, {"authorization": f"Bearer {bearer}", **(headers or {})}, raw,
            env=ENV, dispatch=self.dispatch, query=query, clock=lambda: NOW,
        )  # fmt: skip

    async def seed(self, name: str, messages: list[Message], *, at: int = 0) -> None:
        for start in range(0, len(messages), 50):
            chunk = messages[start : start + 50]
            await self.store.inner.append_messages_atomic(
                f"id-{name}", at + start, chunk, agent_name="pager", session_name=name
            )


AGENT = Agent("pager", "You answer.", [])  # no tools: the sessions are written by the tests


@pytest.fixture
async def store() -> D1Store:
    store = d1_store(FakeD1Database(), clock=ticking_clock(start=NOW, step=0.001))
    await store.create_tables()
    return store


async def pages(worker: Worker, name: str, limit: int | None = None) -> list[dict[str, Any]]:
    """Every page of the session, following `next`."""
    got: list[dict[str, Any]] = []
    after = None
    while True:
        query = "&".join(
            ([f"after={after}"] if after is not None else [])
            + ([f"limit={limit}"] if limit is not None else [])
        )
        reply = await worker("GET", f"/sessions/{name}", query)
        assert reply.status == 200, reply.body
        got.append(reply.body)
        after = reply.body["next"]
        if after is None:
            return got


# --- GET /sessions/{name} -------------------------------------------------------------------


@pytest.mark.parametrize("limit", [None, 1, 7, 200, 457, 1000])
async def test_next_chains_the_pages_through_every_position_once(
    store: D1Store, limit: int | None
) -> None:
    worker = Worker(store)
    stored = conversation(92)[:457]  # ends mid-turn: a page may end anywhere
    await worker.seed("long", stored)
    got = await pages(worker, "long", limit)
    size = limit or HISTORY_LIMIT
    assert [len(p["messages"]) for p in got[:-1]] == [size] * (len(got) - 1)
    assert 1 <= len(got[-1]["messages"]) <= size
    positions = [m["position"] for p in got for m in p["messages"]]
    assert positions == list(range(457))  # each once, in order
    for page in got[:-1]:
        assert page["next"] == page["messages"][-1]["position"]
    assert all(p["message_count"] == 457 and p["session_id"] == "id-long" for p in got)
    # Each message is the stored one, with its position first.
    listed = [m for p in got for m in p["messages"]]
    assert listed == [{"position": i, **m.to_dict()} for i, m in enumerate(stored)]
    assert next(iter(listed[3])) == "position"
    # No read asked for more than a page and one more (is there a next page?).
    assert all(n is not None and n <= size + 1 for _, _, n in worker.store.reads)


async def test_after_past_the_end_is_an_empty_last_page(store: D1Store) -> None:
    worker = Worker(store)
    await worker.seed("s", conversation(2))
    for after in (9, 10, 10**14):
        reply = await worker("GET", "/sessions/s", f"after={after}")
        assert (reply.status, reply.body) == (
            200, {"session_id": "id-s", "messages": [], "next": None, "message_count": 10},
        )  # fmt: skip
    last = await worker("GET", "/sessions/s", "after=8&limit=1")
    assert [m["position"] for m in last.body["messages"]] == [9]
    assert last.body["next"] is None
    exact = await worker("GET", "/sessions/s", "limit=10")
    assert (len(exact.body["messages"]), exact.body["next"]) == (10, None)
    one_short = await worker("GET", "/sessions/s", "limit=9")
    assert one_short.body["next"] == 8


async def test_an_unknown_session_is_a_404_however_it_is_asked(store: D1Store) -> None:
    worker = Worker(store)
    await worker.seed("other", conversation(1))
    for path, query in [
        ("/sessions/none", ""), ("/sessions/none", "after=3&limit=5"),
        ("/sessions/none/view", ""), ("/sessions/none/view", "before=4"),
        ("/sessions/none/view", "after=0&limit=1"), ("/sessions/none/approvals", ""),
    ]:  # fmt: skip
        reply = await worker("GET", path, query)
        assert (reply.status, reply.body["error"]["code"]) == (404, "session-not-found"), path
    events = await worker("GET", "/sessions/none/events", "after=2")
    assert (events.status, events.stream) == (404, None)


@pytest.mark.parametrize(
    ("path", "query"),
    [
        ("/sessions/s", "limit=0"),
        ("/sessions/s", "limit=1001"),
        ("/sessions/s", "limit=-1"),
        ("/sessions/s", "limit=1.5"),
        ("/sessions/s", "limit=x"),
        ("/sessions/s", "limit=%D9%A1"),  # an Arabic-Indic one: isdigit(), not ASCII
        ("/sessions/s", "after=-1"),
        ("/sessions/s", "after=1e3"),
        ("/sessions/s", "after=" + "9" * 16),
        ("/sessions/s", "after=%203"),
        ("/sessions/s/view", "limit=501"),
        ("/sessions/s/view", "before=-2"),
        ("/sessions/s/view", "after=1&before=5"),
    ],
)
async def test_a_bad_page_parameter_is_a_400_that_reaches_no_object(
    store: D1Store, path: str, query: str
) -> None:
    worker = Worker(store)
    await worker.seed("s", conversation(1))
    reply = await worker("GET", path, query)
    assert (reply.status, reply.body["error"]["code"]) == (400, "invalid-request")
    assert worker.store.reads == []


async def test_limits_at_their_bounds_and_empty_values_are_taken(store: D1Store) -> None:
    worker = Worker(store)
    await worker.seed("s", conversation(250))  # 1,250 messages
    most = await worker("GET", "/sessions/s", "limit=1000")
    assert (len(most.body["messages"]), most.body["next"]) == (1000, 999)
    default = await worker("GET", "/sessions/s", "after=&limit=&before=3&other=x")
    assert len(default.body["messages"]) == HISTORY_LIMIT  # `before` is the view's
    assert default.body["messages"][0]["position"] == 0
    view = await worker("GET", "/sessions/s/view", "limit=500")
    assert len(articles(view)) == 500


async def test_a_page_stops_before_its_bytes_run_over(
    store: D1Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(paging, "PAGE_BYTES", 50_000)
    worker = Worker(store)
    big = [Message.user("x" * 9_000), Message.assistant("y" * 12_000)] * 20
    big.insert(7, Message.user("z" * 80_000))  # over the budget alone: a page of its own
    await worker.seed("big", big)
    got = await pages(worker, "big", 1000)
    assert [m["position"] for p in got for m in p["messages"]] == list(range(41))
    for page in got:
        size = len(json.dumps(page["messages"], ensure_ascii=False).encode())
        assert size <= 50_000 or len(page["messages"]) == 1, size
    assert [len(p["messages"]) for p in got if p["messages"][0]["position"] == 7] == [1]


async def test_a_session_token_pages_its_own_session_only(store: D1Store) -> None:
    worker = Worker(store)
    await worker.seed("mine", conversation(50))
    await worker.seed("theirs", conversation(2))
    scoped = mint_session_token(SECRET, "mine", expires_at=int(NOW) + 60)
    page = await worker("GET", "/sessions/mine", "after=99&limit=3", bearer=scoped)
    assert [m["position"] for m in page.body["messages"]] == [100, 101, 102]
    view = await worker("GET", "/sessions/mine/view", "before=10&limit=5", bearer=scoped)
    assert articles(view) == [5, 6, 7, 8, 9]
    for path in ("/sessions/theirs", "/sessions/theirs/view"):
        denied = await worker("GET", path, "after=1&limit=3", bearer=scoped)
        assert (denied.status, denied.body["error"]["code"]) == (403, "forbidden")


# --- GET /sessions/{name}/view ---------------------------------------------------------------


def articles(reply: Reply) -> list[int]:
    assert reply.status == 200, reply.body
    assert reply.text is not None
    return [int(p) for p in re.findall(r'<article id="m(\d+)"[^>]* data-position="\1"', reply.text)]


def links(reply: Reply) -> dict[str, str]:
    """The top nav's links by class: first, older, newer, latest (the query, without '?')."""
    assert reply.text is not None
    (nav,) = re.findall(r'<nav class="pages pages-top".*?</nav>', reply.text)
    found = re.findall(r'<a class="(\w+)"[^>]* href="\?([^"]*)"', nav)
    return {key: html.unescape(query) for key, query in found}


async def test_the_view_opens_at_the_latest_page_and_links_the_others(store: D1Store) -> None:
    worker = Worker(store)
    await worker.seed("long", conversation(50))  # 250 messages
    latest = await worker("GET", "/sessions/long/view")
    assert articles(latest) == list(range(150, 250))
    assert "Messages #150 to #249 of 250" in (latest.text or "")
    assert links(latest) == {"first": "before=100&limit=100", "older": "before=150&limit=100"}
    assert 'data-kind="all-clear">Nothing on this page needs attention' in (latest.text or "")

    # Older and older to the first page: every position once.
    seen, reply = articles(latest), latest
    while "older" in links(reply):
        reply = await worker("GET", "/sessions/long/view", links(reply)["older"])
        seen = articles(reply) + seen
    assert seen == list(range(250))
    assert articles(reply) == list(range(50))
    assert links(reply) == {"newer": "after=49&limit=100", "latest": "limit=100"}
    first = await worker("GET", "/sessions/long/view", links(latest)["first"])
    assert articles(first) == list(range(100))

    # Newer from the first page, with another limit: forward to the end.
    seen, reply = [], await worker("GET", "/sessions/long/view", "before=30&limit=30")
    while True:
        seen += articles(reply)
        if "newer" not in links(reply):
            break
        reply = await worker("GET", "/sessions/long/view", links(reply)["newer"])
    assert seen == list(range(250))
    assert links(reply) == {"first": "before=30&limit=30", "older": "before=240&limit=30"}

    # Past the end: no messages, a way back.
    empty = await worker("GET", "/sessions/long/view", "after=400")
    assert articles(empty) == []
    assert "No messages here" in (empty.text or "")
    assert links(empty) == {"latest": "limit=100"}
    # A page reads what it shows, a chunk at a time, never the whole session.
    assert all(n is not None and n <= paging.MAX_CHUNK for what, _, n in worker.store.reads)


async def test_a_step_split_by_a_page_links_across_and_flags_nothing_wrongly(
    store: D1Store,
) -> None:
    worker = Worker(store)
    messages = conversation(2)  # 0-4, 5-9: the second step's call at 6, its results 7 and 8
    await worker.seed("split", messages)
    # Turn 3 waits for an approval: its call at 11 has no result.
    waiting = ToolCall("w1", "refund", {"order": 7})
    await worker.seed("split", [Message.user("refund 7"), Message.assistant("", [waiting])], at=10)
    await store.append_messages_atomic(
        "id-split", 12, [], approvals=[ApprovalChange("w1", "requested", "ab" * 32, "refund")]
    )
    early = await worker("GET", "/sessions/split/view", "before=7&limit=4")  # 3 to 6
    assert articles(early) == [3, 4, 5, 6]
    text = early.text or ""
    assert text.count('class="result-link" href="?after=6&amp;limit=4#m7"') == 1
    assert "result: #7 (next page)" in text
    assert 'data-kind="no-result"' not in text
    assert 'data-kind="pending-approval"' not in text
    assert 'data-turn="' not in text  # turn numbers are not known on a later page
    assert "Continued from the page before" in text
    assert "Turn from #5" in text
    late = await worker("GET", "/sessions/split/view", "after=6&limit=4")  # 7 to 10
    assert articles(late) == [7, 8, 9, 10]
    assert 'answers a call on <a href="?before=7&amp;limit=4">an earlier page</a>' in (
        late.text or ""
    )
    latest = await worker("GET", "/sessions/split/view", "limit=4")  # 8 to 11: the wait shows
    assert articles(latest) == [8, 9, 10, 11]
    assert 'data-kind="pending-approval"' in (latest.text or "")
    assert "Needs attention on this page (1)" in (latest.text or "")
    whole = await worker("GET", "/sessions/split/view")
    assert 'data-turn="3"' in (whole.text or "")  # from position 0: numbered
    assert "<dt>Turns</dt><dd>3</dd>" in (whole.text or "")
    assert links(whole) == {}


# --- GET /sessions/{name}/events --------------------------------------------------------------


async def test_events_replay_a_long_history_a_chunk_at_a_time_each_position_once(
    store: D1Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(paging, "EVENTS_CHUNK", 60)
    worker = Worker(store)
    stored = conversation(90)  # 450 messages
    await worker.seed("long", stored)
    for after, first in ((None, 0), ("123", 124), ("449", 450)):
        worker.store.reads.clear()
        headers = {} if after is None else {"last-event-id": after}
        events = await read_all(await worker("GET", "/sessions/long/events", headers=headers))
        got = [(int(i or -1), d) for k, i, d in events if k == "message"]
        assert [p for p, _ in got] == list(range(first, 450))
        assert [d for _, d in got] == [m.to_dict() for m in stored[first:]]
        assert events[-1] == ("done", None, {
            "session_id": "id-long", "running": False, "status": "complete",
            "response": "answer 89"})  # fmt: skip
        replayed = [(s, n) for what, s, n in worker.store.reads if s >= first]
        assert all(n is not None and n <= 60 for _, n in replayed), replayed
        assert len(replayed) >= (450 - first) // 60


async def test_events_follow_a_turn_after_a_long_replay_exactly_once(store: D1Store) -> None:
    worker = Worker(store)
    await worker.seed("busy", conversation(100))  # 500 messages, more than one read
    worker.model.hold = True
    posted = asyncio.ensure_future(
        worker("POST", "/sessions/busy/messages", body={"message": "one more"})
    )
    await worker.model.started.wait()  # the turn runs; its LLM call is held
    reply = await worker("GET", "/sessions/busy/events", headers={"last-event-id": "7"})
    assert reply.stream is not None
    first = await anext(reply.stream)  # the replay has begun
    worker.model.release.set()
    rest = [chunk async for chunk in reply.stream]
    events = parse([first, *rest])
    assert [int(i or -1) for k, i, _ in events if k == "message"] == list(range(8, 502))
    assert events[-1][0] == "done"
    assert events[-1][2]["response"] == "heard one more"
    assert (await posted).status == 200


async def test_a_long_history_is_replayed_in_a_bounded_number_of_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(paging, "REPLAY_PAUSE_S", 0)
    store = memory_store()
    worker = Worker(store)
    await store.append_messages_atomic("id-huge", 0, conversation(4_001), session_name="huge")
    events = await read_all(await worker("GET", "/sessions/huge/events"))
    assert sum(1 for k, _, _ in events if k == "message") == 20_005
    reads = [r for r in worker.store.reads if r[0] == "messages"]
    # D1 counts every query (50 a request on the free plan): the replay takes 40 at most,
    # the end of the session (how the last turn was left) a few more.
    assert len(reads) <= paging.EVENTS_READS + 3, len(reads)
    assert all(n is not None for _, _, n in reads)


async def test_approvals_and_the_idle_state_read_only_the_end(store: D1Store) -> None:
    worker = Worker(store)
    await worker.seed("w", conversation(40))
    waiting = [ToolCall("w1", "refund", {"o": 1}), ToolCall("w2", "refund", {"o": 2})]
    await worker.seed("w", [Message.user("refund"), Message.assistant("", waiting)], at=200)
    await store.append_messages_atomic(
        "id-w", 202, [Message.tool_result(waiting[0], '"refunded"')],
        approvals=[ApprovalChange("w2", "requested", "cd" * 32, "refund")],
    )  # fmt: skip
    worker.store.reads.clear()
    pending = await worker("GET", "/sessions/w/approvals")
    assert [p["tool_call_id"] for p in pending.body["pending"]] == ["w2"]
    events = await read_all(await worker("GET", "/sessions/w/events", "after=202"))
    assert events == [("done", None, {
        "session_id": "id-w", "running": False, "response": "", "status": "awaiting_approval",
        "pending": pending.body["pending"]})]  # fmt: skip
    assert all(n is not None and n <= 8 for _, _, n in worker.store.reads), worker.store.reads
