"""Streaming turns over the Worker's API on CPython (durable_agents.cloudflare.app, live.py):
server-sent events for a turn, `GET .../events` replaying from a position then following the
running turn, a client that leaves while the turn goes on, and `POST .../cancel`.

The same code runs in the Worker; test_dev_server_streaming_turns.py drives it over HTTP in
the local runtime.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import BaseModel
from tests.support.app_calls import read_all

from durable_agents import (
    Agent,
    LLMResponse,
    Message,
    TextDelta,
    ToolCall,
    ToolContext,
    ToolSpec,
    tool,
)
from durable_agents.cloudflare import d1_store
from durable_agents.cloudflare.app import (
    SSE_HEADERS,
    Command,
    LiveSession,
    Reply,
    handle_request,
    serve_session,
)
from durable_agents.stores.d1 import D1Store
from durable_agents.testing.fake_d1 import FakeD1Database

TOKEN = "s3cret-token"
ENV = {"API_TOKEN": TOKEN}
SSE = {"authorization": f"Bearer {TOKEN}", "accept": "text/event-stream"}
JSON = {"authorization": f"Bearer {TOKEN}"}
SESSION_ID = "cd" * 32


class NoteArgs(BaseModel):
    text: str


NOTES: list[str] = []


@tool
async def send_note(args: NoteArgs, ctx: ToolContext) -> str:
    """Send a note (a side effect)."""
    NOTES.append(args.text)
    return "sent"


AGENT = Agent("streamer", "You send notes.", [send_note])


class Model:
    """Sends one note per turn, then replies; streams its text word by word. While
    `hold` is set, each call waits for `release` after its first word."""

    def __init__(self) -> None:
        self.hold = False
        self.release = asyncio.Event()
        self.first_word = asyncio.Event()

    def answer(self, messages: list[Message]) -> LLMResponse:
        if messages[-1].role == "tool":
            return LLMResponse("The note is sent, all done.")
        call = ToolCall("", "send_note", {"text": messages[-1].content})
        return LLMResponse("Sending your note now.", [call])

    async def chat(self, messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        return self.answer(messages)

    async def stream(
        self, messages: list[Message], tools: list[ToolSpec]
    ) -> AsyncIterator[TextDelta | LLMResponse]:
        response = self.answer(messages)
        first, *rest = response.text.split(" ")
        yield TextDelta(first)
        self.first_word.set()
        if self.hold:
            await self.release.wait()
        for word in rest:
            yield TextDelta(" " + word)
        yield response


class Object:
    """Stands in for the session's Durable Object: one LiveSession, commands as JSON."""

    def __init__(self, store: D1Store, model: Model) -> None:
        self.store, self.model, self.live = store, model, LiveSession()

    async def dispatch(self, name: str, command: Command) -> Reply:
        return await serve_session(
            Command.from_json(command.to_json()), session_id=SESSION_ID, store=self.store,
            env=ENV, live=self.live, agent=AGENT, make_deps=lambda env, http: None,
            llm=self.model,
        )  # fmt: skip

    async def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
        query: str = "",
    ) -> Reply:  # fmt: skip
        raw = b"" if body is None else json.dumps(body).encode()
        return await handle_request(
            method, path, SSE if headers is None else headers, raw, env=ENV,
            dispatch=self.dispatch, query=query,
        )  # fmt: skip


@pytest.fixture
async def store() -> D1Store:
    NOTES.clear()
    store = d1_store(FakeD1Database())
    await store.create_tables()
    return store


async def test_a_streamed_turn_sends_deltas_each_message_by_position_then_done(
    store: D1Store,
) -> None:
    obj = Object(store, Model())
    reply = await obj.request("POST", "/sessions/a/messages", {"message": "hello"})
    assert (reply.status, dict(reply.headers)) == (200, SSE_HEADERS)
    events = await read_all(reply)

    kinds = [e[0] for e in events]
    assert kinds[-1] == "done"
    assert "".join(d["text"] for k, _, d in events if k == "delta") == (
        "Sending your note now.The note is sent, all done."
    )
    messages = [(i, d) for k, i, d in events if k == "message"]
    history = await store.load_messages(SESSION_ID)
    assert [int(i) for i, _ in messages] == list(range(len(history))) == [0, 1, 2, 3]
    assert [d for _, d in messages] == [m.to_dict() for m in history]
    assert all(i is None for k, i, _ in events if k != "message")  # deltas carry no id

    plain = await Object(store, Model()).request(
        "POST", "/sessions/a/messages", {"message": "again"}, headers=JSON
    )
    done = events[-1][2]
    assert set(done) == set(plain.body)  # the same JSON as the answer without streaming
    assert (done["status"], done["response"]) == ("complete", "The note is sent, all done.")


async def test_errors_known_at_once_are_statuses_not_streams(store: D1Store) -> None:
    obj = Object(store, Model())
    bad = await obj.request("POST", "/sessions/a/messages", {"message": ""})
    assert (bad.status, bad.stream) == (422, None)
    no_session = await obj.request("POST", "/sessions/a/resume")
    assert (no_session.status, no_session.body["error"]["code"]) == (404, "session-not-found")
    assert no_session.stream is None


async def test_a_client_that_leaves_does_not_stop_the_turn(store: D1Store) -> None:
    model = Model()
    model.hold = True
    obj = Object(store, model)
    reply = await obj.request("POST", "/sessions/a/messages", {"message": "hello"})
    assert reply.stream is not None
    first = await anext(reply.stream)
    assert first.startswith(b"event: delta")
    await reply.stream.aclose()  # the client is gone, mid-call
    model.release.set()
    await asyncio.gather(*obj.live.tasks)
    assert [m.role for m in await store.load_messages(SESSION_ID)] == [
        "user", "assistant", "tool", "assistant",
    ]  # fmt: skip
    assert NOTES == ["hello"]


async def test_events_replay_after_a_position_then_follow_the_turn_exactly_once(
    store: D1Store,
) -> None:
    model = Model()
    obj = Object(store, model)
    await read_all(await obj.request("POST", "/sessions/a/messages", {"message": "one"}))
    model.hold = True
    model.first_word.clear()
    turn = await obj.request("POST", "/sessions/a/messages", {"message": "two"})
    assert turn.stream is not None
    follower = asyncio.ensure_future(read_all(turn))
    await model.first_word.wait()  # turn two runs; its first LLM call is held

    again = await obj.request("GET", "/sessions/a/events", headers={**SSE, "last-event-id": "2"})
    replay = asyncio.ensure_future(read_all(again))
    await asyncio.sleep(0.01)
    model.release.set()
    events, original = await replay, await follower

    positions = [int(i) for k, i, _ in events if k == "message"]
    assert positions == list(range(3, 8))  # 3: the last of turn one; 4..7 turn two, once each
    assert events[-1][0] == "done"
    assert events[-1][2] == original[-1][2]
    assert any(k == "delta" for k, _, _ in events)  # live, after the replay


async def test_events_follow_a_new_sessions_first_turn_before_anything_is_stored(
    store: D1Store,
) -> None:
    model = Model()
    model.hold = True
    obj = Object(store, model)
    post = asyncio.ensure_future(
        obj.request("POST", "/sessions/a/messages", {"message": "first"}, headers=JSON)
    )
    await model.first_word.wait()  # the first LLM call is held: nothing is stored yet
    assert await store.load_messages(SESSION_ID) == []
    events = asyncio.ensure_future(read_all(await obj.request("GET", "/sessions/a/events")))
    await asyncio.sleep(0.01)
    model.release.set()
    got, reply = await events, await post
    assert [k for k, _, _ in got if k != "delta"] == ["message"] * 4 + ["done"]
    assert [int(i) for k, i, _ in got if k == "message"] == [0, 1, 2, 3]
    assert got[-1][2] == reply.body
    assert reply.body["status"] == "complete"


async def test_events_without_a_running_turn_replay_then_say_how_the_session_stands(
    store: D1Store,
) -> None:
    obj = Object(store, Model())
    await read_all(await obj.request("POST", "/sessions/a/messages", {"message": "one"}))
    events = await read_all(await obj.request("GET", "/sessions/a/events", query="after=1"))
    assert [int(i) for k, i, _ in events if k == "message"] == [2, 3]
    assert events[-1] == (
        "done", None,
        {"session_id": SESSION_ID, "running": False, "status": "complete",
         "response": "The note is sent, all done."},
    )  # fmt: skip
    everything = await read_all(await obj.request("GET", "/sessions/a/events"))
    assert [int(i) for k, i, _ in everything if k == "message"] == [0, 1, 2, 3]
    past_the_end = await read_all(await obj.request("GET", "/sessions/a/events", query="after=99"))
    assert [k for k, _, _ in past_the_end] == ["done"]


@pytest.mark.parametrize(
    "value",
    [
        "-1",
        "x",
        "1.5",
        "\u0661",  # an Arabic-Indic one: isdigit(), not ASCII
        "9" * 20,
        " 3",
    ],
)
async def test_a_position_that_is_not_one_is_a_400(store: D1Store, value: str) -> None:
    obj = Object(store, Model())
    by_header = await obj.request(
        "GET", "/sessions/a/events", headers={**SSE, "last-event-id": value}
    )
    assert (by_header.status, by_header.body["error"]["code"]) == (400, "invalid-request")
    by_query = await obj.request("GET", "/sessions/a/events", query=f"after={value}")
    assert by_query.status == 400


async def test_events_of_an_unknown_session_is_a_404(store: D1Store) -> None:
    reply = await Object(store, Model()).request("GET", "/sessions/nobody/events")
    assert (reply.status, reply.stream) == (404, None)


async def test_cancel_stops_the_turn_at_a_step_boundary_and_resume_finishes_it(
    store: D1Store,
) -> None:
    model = Model()
    model.hold = True
    obj = Object(store, model)
    turn = await obj.request("POST", "/sessions/a/messages", {"message": "hello"})
    follower = asyncio.ensure_future(read_all(turn))
    await model.first_word.wait()

    cancelled = await obj.request("POST", "/sessions/a/cancel", headers=JSON)
    assert (cancelled.status, cancelled.body["status"]) == (200, "cancelled")
    events = await follower
    assert events[-1][0] == "done"
    assert events[-1][2]["status"] == "cancelled"
    assert [m.role for m in await store.load_messages(SESSION_ID)] == ["user"]
    assert NOTES == []

    nothing = await obj.request("POST", "/sessions/a/cancel", headers=JSON)
    assert (nothing.status, nothing.body["error"]["code"]) == (409, "no-turn-running")
    idle = await read_all(await obj.request("GET", "/sessions/a/events"))
    assert idle[-1][2]["status"] == "interrupted"

    model.hold = False
    resumed = await obj.request("POST", "/sessions/a/resume", headers=JSON)
    assert (resumed.status, resumed.body["status"]) == (200, "complete")
    assert NOTES == ["hello"]


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
async def test_events_is_get_only_and_cancel_post_only(store: D1Store, method: str) -> None:
    obj = Object(store, Model())
    assert (await obj.request(method, "/sessions/a/events")).status == 405
    other = "GET" if method == "POST" else method
    assert (await obj.request(other, "/sessions/a/cancel", headers=JSON)).status == 405


def test_commands_carry_stream_and_after_and_refuse_odd_ones() -> None:
    for command in (
        Command("message", "hi", stream=True),
        Command("events", after=4),
        Command("events"),
        Command("cancel"),
        Command("resume", stream=True),
        Command("history", after=3, limit=1000),
        Command("view", before=0, limit=500),
        Command("view", after=7),
    ):
        assert Command.from_json(command.to_json()) == command
    for text in (
        '{"action": "events", "after": -1}',
        '{"action": "events", "after": true}',
        '{"action": "approvals", "after": 3}',
        '{"action": "events", "limit": 3}',
        '{"action": "history", "before": 3}',
        '{"action": "history", "limit": 1001}',
        '{"action": "history", "limit": 0}',
        '{"action": "view", "limit": 501}',
        '{"action": "view", "limit": true}',
        '{"action": "view", "after": 0, "before": 3}',
        '{"action": "history", "stream": true}',
        '{"action": "message", "message": "hi", "stream": "yes"}',
    ):
        with pytest.raises(ValueError, match="not a command"):
            Command.from_json(text)


async def test_the_chat_page_is_served_at_the_root_only_when_enabled(store: D1Store) -> None:
    page = await handle_request(
        "GET",
        "/",
        {},
        b"",
        env={**ENV, "CHAT_PAGE": "on"},
        dispatch=Object(store, Model()).dispatch,
    )
    assert page.status == 200
    assert page.headers["content-type"].startswith("text/html")
    assert page.text is not None
    assert "<html" in page.text.lower()
    off = await handle_request(
        "GET", "/", {}, b"", env=ENV, dispatch=Object(store, Model()).dispatch
    )
    assert off.status == 401  # no page: an API path like any other
