"""The chat sockets' frames on CPython (chat_socket.py), with fake sockets whose attachment
is a JSON string as workerd's: a `send` runs a turn whose chunks every following socket
gets with its own request id and sequence; `resume` replays the current reply from the
store from after the client's last sequence, then follows; `abort` cancels; tokens ride
on the frames; what a socket asked survives a new `ChatSockets` (an evicted object).

On workerd with the AI SDK's own client: test_dev_server_chat_ws.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from durable_agents import Agent, LLMResponse, Message, ToolCall, ToolContext, ToolSpec, tool
from durable_agents.cloudflare import d1_store
from durable_agents.cloudflare.app import ApiSettings, Command, LiveSession, Reply, serve_session
from durable_agents.cloudflare.chat_socket import ChatSockets, SocketState, upgrade_target
from durable_agents.cloudflare.commands import SendMessage
from durable_agents.cloudflare.served_agents import ServedAgents
from durable_agents.cloudflare.tokens import mint_session_token
from durable_agents.cloudflare.ui_stream import replay
from durable_agents.stores.d1 import D1Store
from durable_agents.testing.fake_d1 import FakeD1Database

TOKEN = "s3cret-token"
SECRET = "chat-socket-session-token-secret-0123456789"
ENV = {"API_TOKEN": TOKEN, "SESSION_TOKEN_SECRET": SECRET}
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SESSION_ID = "ab" * 32


class Model:
    """One note per turn, then a reply; while `hold` is set, the note's tool waits for
    `release` (after setting `waiting`)."""

    def __init__(self) -> None:
        self.hold = False
        self.release = asyncio.Event()
        self.waiting = asyncio.Event()

    async def chat(self, messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        if messages[-1].role == "tool":
            return LLMResponse("The note is sent.")
        return LLMResponse("Sending it.", [ToolCall("", "send_note", {"text": "hi"})])


@tool
async def send_note(args: dict[str, str], ctx: ToolContext[Model]) -> str:
    """Send a note (a side effect)."""
    if ctx.deps.hold:
        ctx.deps.waiting.set()
        await ctx.deps.release.wait()
    return "sent"


AGENT = Agent("chat", "You send notes.", [send_note], deps_type=Model)


class FakeSocket:
    """A hibernatable socket: the frames it was sent, its attachment (a string)."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.kept: str | None = None

    def send(self, text: str) -> None:
        self.sent.append(json.loads(text))

    def attachment(self) -> str | None:
        return self.kept

    def attach(self, text: str) -> None:
        self.kept = text

    def chunks(self, request: str) -> list[dict[str, Any]]:
        return [f for f in self.sent if f["requestId"] == request and f["type"] == "chunk"]

    def kinds(self, request: str) -> list[str]:
        return [f["type"] for f in self.sent if f["requestId"] == request]


class Object:
    """The session object's side: its LiveSession, store, sockets and `ChatSockets`."""

    def __init__(self, store: D1Store, model: Model) -> None:
        self.store, self.model, self.live = store, model, LiveSession()
        self.sockets: list[FakeSocket] = []
        self.chat = self.new_chat()

    def new_chat(self) -> ChatSockets:
        return ChatSockets(
            serve=self.serve,
            live=self.live,
            store=lambda: (self.store, SESSION_ID),
            settings=lambda: ApiSettings.from_env(ENV),
            sockets=lambda: list(self.sockets),
            clock=lambda: 1_000_000.0,
        )

    async def serve(self, command: Command) -> Reply:
        return await serve_session(
            command, session_id=SESSION_ID, store=self.store, env=ENV, live=self.live,
            agent=AGENT, make_deps=lambda env, http: self.model, llm=self.model,
        )  # fmt: skip

    def socket(self, name: str = "s") -> FakeSocket:
        socket = FakeSocket()
        self.sockets.append(socket)
        self.chat.opened(socket, name, None)
        return socket

    async def settle(self) -> None:
        while self.chat.tasks:
            await asyncio.wait(list(self.chat.tasks))


def send(request: str, text: str = "note hi", key: str | None = None, **fields: Any) -> str:
    user = {
        "id": key or f"key-{request}",
        "role": "user",
        "parts": [{"type": "text", "text": text}],
    }
    frame = {
        "type": "send", "requestId": request, "id": "s", "trigger": "submit-message",
        "messages": [user], "headers": AUTH, "body": {}, **fields,
    }  # fmt: skip
    return json.dumps(frame)


def resume(request: str, last: int | None = None, headers: dict[str, str] = AUTH) -> str:
    frame = {"type": "resume", "requestId": request, "id": "s", "headers": headers, "body": {}}
    if last is not None:
        frame["lastSequence"] = last
    return json.dumps(frame)


@pytest.fixture
async def store() -> D1Store:
    store = d1_store(FakeD1Database())
    await store.create_tables()
    return store


async def test_a_send_runs_a_turn_and_its_chunks_are_numbered_from_zero(store: D1Store) -> None:
    obj = Object(store, Model())
    socket = obj.socket()
    await obj.chat.on_frame(socket, send("r1"))
    await obj.settle()
    assert socket.kinds("r1")[0] == "start"
    assert socket.kinds("r1")[-1] == "end"
    chunks = socket.chunks("r1")
    assert [c["sequence"] for c in chunks] == list(range(len(chunks)))
    types = [c["chunk"]["type"] for c in chunks]
    assert chunks[0]["chunk"] == {"type": "start", "messageId": "reply-key-r1"}
    assert "tool-input-available" in types
    assert "tool-output-available" in types
    assert chunks[-1]["chunk"] == {"type": "finish", "finishReason": "stop"}
    history = await store.load_messages(SESSION_ID)
    assert history[0].content == "note hi"
    assert await store.find_request(SESSION_ID, "key-r1") is not None  # the message id keys it
    state = SocketState.of(socket)
    assert (state.request, state.frames, state.authorized) == (None, 1, True)


async def test_every_following_socket_gets_the_turn_and_a_resume_by_sequence_misses_nothing(
    store: D1Store,
) -> None:
    model = Model()
    model.hold = True
    obj = Object(store, model)
    sender, follower, late = obj.socket(), obj.socket(), obj.socket()
    await obj.chat.on_frame(sender, send("r1"))
    await model.waiting.wait()  # the tool runs, held
    await obj.chat.on_frame(follower, resume("f1"))
    had = len(sender.chunks("r1"))
    await obj.chat.on_frame(late, resume("l1", last=had - 3))
    assert [c["sequence"] for c in late.chunks("l1")] == [had - 2, had - 1]
    model.release.set()
    await obj.settle()
    whole = [c["chunk"] for c in sender.chunks("r1")]
    assert [c["chunk"] for c in follower.chunks("f1")] == whole
    assert [c["sequence"] for c in follower.chunks("f1")] == list(range(len(whole)))
    assert [c["sequence"] for c in late.chunks("l1")] == list(range(had - 2, len(whole)))
    assert [c["chunk"] for c in late.chunks("l1")] == whole[had - 2 :]
    for socket, request in ((sender, "r1"), (follower, "f1"), (late, "l1")):
        assert socket.kinds(request)[0] == "start"
        assert socket.kinds(request)[-1] == "end"


async def test_a_resume_follows_a_turn_started_over_http_from_the_store(store: D1Store) -> None:
    model = Model()
    model.hold = True
    obj = Object(store, model)
    posted = asyncio.ensure_future(obj.serve(SendMessage(message="note hi", request_key="k")))
    await model.waiting.wait()  # no socket started it: no pump yet
    socket = obj.socket()
    await obj.chat.on_frame(socket, resume("f"))
    replayed = len(socket.chunks("f"))
    assert socket.chunks("f")[0]["chunk"] == {"type": "start", "messageId": "reply-k"}
    model.release.set()
    await posted
    await obj.settle()
    chunks = socket.chunks("f")
    assert len(chunks) > replayed
    assert [c["sequence"] for c in chunks] == list(range(len(chunks)))
    assert socket.kinds("f")[-1] == "end"
    stored = await store.load_messages(SESSION_ID)
    _, again = replay(stored)
    finish = {"type": "finish-step"}, {"type": "finish", "finishReason": "stop"}
    assert [c["chunk"] for c in chunks] == [*again, *finish]  # the whole message, once


async def test_a_resume_with_no_turn_running_is_no_active(store: D1Store) -> None:
    obj = Object(store, Model())
    socket = obj.socket()
    await obj.chat.on_frame(socket, resume("q"))
    assert socket.sent == [{"type": "no-active", "requestId": "q"}]


async def test_abort_cancels_the_running_turn(store: D1Store) -> None:
    model = Model()
    model.hold = True
    obj = Object(store, model)
    sender, follower = obj.socket(), obj.socket()
    await obj.chat.on_frame(sender, send("r1"))
    await model.waiting.wait()
    await obj.chat.on_frame(follower, resume("f1"))
    await obj.chat.on_frame(sender, json.dumps({"type": "abort", "requestId": "r1"}))
    assert SocketState.of(sender).request is None  # the client closed its stream itself
    await asyncio.sleep(0)
    model.release.set()
    await obj.settle()
    assert follower.chunks("f1")[-1]["chunk"] == {"type": "finish", "finishReason": "interrupted"}
    assert sender.kinds("r1")[-1] != "end"


async def test_tokens_ride_on_the_frames(store: D1Store) -> None:
    obj = Object(store, Model())
    socket = obj.socket("mine")
    await obj.chat.on_frame(socket, resume("a", headers={}))
    await obj.chat.on_frame(socket, resume("b", headers={"authorization": "Bearer nope"}))
    other = mint_session_token(SECRET, "other", expires_at=2_000_000)
    await obj.chat.on_frame(socket, resume("c", headers={"authorization": f"Bearer {other}"}))
    errors = [f["errorText"] for f in socket.sent]
    assert errors[0].startswith("unauthorized: missing")
    assert errors[1].startswith("unauthorized:")
    assert errors[2] == "forbidden: the token grants session 'other' only"
    mine = mint_session_token(SECRET, "mine", expires_at=2_000_000)
    await obj.chat.on_frame(socket, resume("d", headers={"authorization": f"Bearer {mine}"}))
    await obj.chat.on_frame(socket, resume("e", headers={}))  # shown once: the socket is in
    assert [f["type"] for f in socket.sent[3:]] == ["no-active", "no-active"]


async def test_what_a_socket_asked_survives_an_evicted_object(store: D1Store) -> None:
    obj = Object(store, Model())
    socket = obj.socket()
    await obj.chat.on_frame(socket, resume("a"))
    obj.chat = obj.new_chat()  # a new instance: nothing in memory, the attachment kept
    await obj.chat.on_frame(socket, resume("b", headers={}))
    assert socket.kinds("b") == ["no-active"]
    assert SocketState.of(socket).frames == 2


async def test_frames_it_cannot_serve_are_errors(store: D1Store) -> None:
    obj = Object(store, Model())
    socket = obj.socket()
    await obj.chat.on_frame(socket, "not json")
    await obj.chat.on_frame(socket, send("r", trigger="regenerate-message"))
    await obj.chat.on_frame(socket, send("e", text=""))
    await obj.chat.on_frame(socket, json.dumps({"type": "what", "requestId": "w", "headers": AUTH}))
    approving = json.loads(send("a"))
    approving["messages"].append({"id": "m", "role": "assistant", "parts": []})
    await obj.chat.on_frame(socket, json.dumps(approving))
    await obj.chat.on_frame(socket, send("k", key="\u00e9"))
    assert [f["requestId"] for f in socket.sent] == ["r", "e", "w", "a", "k"]
    assert all(f["type"] == "error" for f in socket.sent)
    assert "append-only" in socket.sent[0]["errorText"]
    assert socket.sent[1]["errorText"] == "the newest user message has no text part"
    assert "a tool approval is decided over HTTP" in socket.sent[3]["errorText"]
    assert "printable ASCII" in socket.sent[4]["errorText"]
    assert await store.load_messages(SESSION_ID) == []


def test_the_upgrade_is_checked_before_the_object() -> None:
    up = {"upgrade": "websocket"}
    assert upgrade_target("/sessions/a-1/ws", up, None) == ("a-1", "a-1", None)
    assert upgrade_target("/sessions/a-1/events", up, None) is None
    bad = upgrade_target("/sessions/a.1/ws", up, None)
    assert isinstance(bad, Reply)
    assert bad.status == 400
    plain = upgrade_target("/sessions/a/ws", {}, None)
    assert isinstance(plain, Reply)
    assert (plain.status, plain.body["error"]["code"]) == (426, "upgrade-required")


def test_a_served_agents_socket_goes_to_its_object() -> None:
    up = {"upgrade": "websocket"}
    served = ServedAgents(named={"refunds": None}, default=None)  # type: ignore[dict-item]
    assert upgrade_target("/agents/refunds/sessions/x/ws", up, served) == (
        "refunds:x", "x", "refunds",
    )  # fmt: skip
    assert upgrade_target("/sessions/ws", up, served) is None  # session "ws"'s history
    unknown = upgrade_target("/agents/secret/sessions/x/ws", up, served)
    assert isinstance(unknown, Reply)
    assert unknown.status == 404
    assert "refunds" not in unknown.body["error"]["message"]  # no token: no agent named
