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
            return LLMResponse(FINAL)
        return LLMResponse("Sending it.", [ToolCall("", "send_note", {"text": "hi"})])


@tool
async def send_note(args: dict[str, str], ctx: ToolContext[Model]) -> str:
    """Send a note (a side effect)."""
    if ctx.deps.hold:
        ctx.deps.waiting.set()
        await ctx.deps.release.wait()
    return "sent"


AGENT = Agent("chat", "You send notes.", [send_note], deps_type=Model)


class RefundModel(Model):
    """Asked anything, refunds order 42 (a call that waits for a person); shown its result,
    says so. `refunded` counts the refunds that ran."""

    def __init__(self) -> None:
        super().__init__()
        self.refunded: list[str] = []

    async def chat(self, messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        if messages[-1].role == "tool":
            return LLMResponse(f"refund answered: {messages[-1].content}")
        return LLMResponse(tool_calls=[ToolCall("", "refund", {"order": "42"})])


@tool(requires_approval=True)
async def refund(args: dict[str, str], ctx: ToolContext[RefundModel]) -> str:
    """Refund an order (a side effect a person approves first)."""
    if ctx.deps.hold:
        ctx.deps.waiting.set()
        await ctx.deps.release.wait()
    ctx.deps.refunded.append(args["order"])
    return "refunded"


REFUNDS = Agent("refunds", "You refund orders.", [refund], deps_type=RefundModel)

FINAL = "The note is sent: it went to the whole team, and everyone has it now."


class StreamingModel(Model):
    """`Model`, its final reply written as deltas; while `hold_text` is set, it waits for
    `go_on` halfway through them (after setting `writing`)."""

    def __init__(self) -> None:
        super().__init__()
        self.hold_text = False
        self.writing = asyncio.Event()
        self.go_on = asyncio.Event()

    async def stream(self, messages: list[Message], tools: list[ToolSpec]) -> Any:
        response = await self.chat(messages, tools)
        text = response.text
        for index in range(0, len(text), 5):
            if index == 35 and self.hold_text:
                self.writing.set()
                await self.go_on.wait()
            yield TextDelta(text[index : index + 5])
        yield response


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

    def __init__(self, store: D1Store, model: Model, agent: Agent[Any] = AGENT) -> None:
        self.store, self.model, self.live, self.agent = store, model, LiveSession(), agent
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
            agent=self.agent, make_deps=lambda env, http: self.model, llm=self.model,
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


def resume(
    request: str, last: int | None = None, headers: dict[str, str] = AUTH, **body: Any
) -> str:
    frame = {"type": "resume", "requestId": request, "id": "s", "headers": headers, "body": body}
    if last is not None:
        frame["lastSequence"] = last
    return json.dumps(frame)


def answer(request: str, asked: list[dict[str, Any]], approved: bool, **approval: Any) -> str:
    """What `addToolApprovalResponse` leaves for the resubmit: the asked assistant message
    (its `start` chunk's id), its tool part `approval-responded` with the answer."""
    approval_id = next(c["approvalId"] for c in asked if c["type"] == "tool-approval-request")
    call_id = next(c["toolCallId"] for c in asked if c["type"] == "tool-approval-request")
    part = {
        "type": "tool-refund", "toolCallId": call_id, "state": "approval-responded",
        "input": {"order": "42"},
        "approval": {"id": approval_id, "approved": approved, "reason": "ann: ok", **approval},
    }  # fmt: skip
    message = {"id": asked[0]["messageId"], "role": "assistant", "parts": [part]}
    frame = {
        "type": "send", "requestId": request, "id": "s", "trigger": "submit-message",
        "messages": [message], "headers": AUTH, "body": {},
    }  # fmt: skip
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


async def test_a_reply_streams_in_text_pieces_and_a_resume_mid_reply_gets_the_rest(
    store: D1Store,
) -> None:
    model = StreamingModel()
    model.hold_text = True
    obj = Object(store, model)
    sender, late = obj.socket(), obj.socket()
    await obj.chat.on_frame(sender, send("r1"))
    await model.writing.wait()  # the final reply is half written
    had = sender.chunks("r1")
    assert had[-1]["chunk"]["type"] == "text-delta"  # pieces of it went out already
    await obj.chat.on_frame(late, resume("l1", last=had[-2]["sequence"]))
    assert [c["sequence"] for c in late.chunks("l1")] == [had[-1]["sequence"]]
    model.go_on.set()
    await obj.settle()
    whole = [c["chunk"] for c in sender.chunks("r1")]
    assert [c["chunk"] for c in late.chunks("l1")] == whole[len(had) - 1 :]
    pieces = [c["delta"] for c in whole if c["type"] == "text-delta"]
    assert len(pieces) > 2
    assert "".join(pieces) == "Sending it." + FINAL
    # The live chunks are the stored reply's replay, one for one (after its `finish`).
    _, stored = replay(await store.load_messages(SESSION_ID))
    assert whole[: len(stored)] == stored
    finish = [{"type": "finish-step"}, {"type": "finish", "finishReason": "stop"}]
    assert whole[len(stored) :] == finish


@pytest.mark.parametrize("accepted", [True, False], ids=["accepted", "being-asked"])
async def test_abort_of_a_send_waiting_behind_another_turn_stops_only_its_own(
    store: D1Store, accepted: bool
) -> None:
    model = Model()
    model.hold = True
    obj = Object(store, model)
    first, second = obj.socket(), obj.socket()
    await obj.chat.on_frame(first, send("r1"))
    await model.waiting.wait()  # r1's note is being sent, held
    await obj.chat.on_frame(second, send("r2", text="note again"))
    while accepted and not obj.live.waiting:  # noqa: ASYNC110 (the object's own state)
        await asyncio.sleep(0)  # r2's turn is accepted, waiting for the lock
    await obj.chat.on_frame(second, json.dumps({"type": "abort", "requestId": "r2"}))
    model.release.set()
    await obj.settle()
    assert first.chunks("r1")[-1]["chunk"] == {"type": "finish", "finishReason": "stop"}
    assert first.kinds("r1")[-1] == "end"
    history = await store.load_messages(SESSION_ID)
    assert [m.content for m in history if m.role == "tool"] == ["sent"]  # r2 sent no note
    assert history[-1].role != "tool"


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


async def test_an_idle_socket_waiting_for_the_next_turn_gets_it_whoever_starts_it(
    store: D1Store,
) -> None:
    obj = Object(store, StreamingModel())
    sender, idle = obj.socket(), obj.socket()
    await obj.chat.on_frame(idle, resume("w1", waitForTurn=True))
    assert idle.sent == []  # nothing runs: it waits, in its attachment
    assert SocketState.of(idle).kind == "watch"
    await obj.chat.on_frame(sender, send("r1"))
    await obj.settle()
    whole = [c["chunk"] for c in sender.chunks("r1")]
    assert [c["chunk"] for c in idle.chunks("w1")] == whole  # the other tab's turn, whole
    assert idle.kinds("w1")[0] == "start"
    assert idle.kinds("w1")[-1] == "end"
    # Waiting again, then a new instance of the object (an eviction), then a turn
    # started over HTTP: the socket gets it from its start too.
    await obj.chat.on_frame(idle, resume("w2", waitForTurn=True))
    obj.live = LiveSession()
    obj.chat = obj.new_chat()
    await obj.serve(SendMessage(message="note hi", request_key="http-1"))
    await obj.settle()
    chunks = [c["chunk"] for c in idle.chunks("w2")]
    assert chunks[0] == {"type": "start", "messageId": "reply-http-1"}
    stored = await store.load_messages(SESSION_ID)
    _, again = replay(stored)
    finish = [{"type": "finish-step"}, {"type": "finish", "finishReason": "stop"}]
    assert chunks == [*again, *finish]
    assert [c["sequence"] for c in idle.chunks("w2")] == list(range(len(chunks)))
    assert SocketState.of(idle).kind is None


async def test_a_resume_naming_another_reply_gets_the_running_one_whole(store: D1Store) -> None:
    model = Model()
    model.hold = True
    obj = Object(store, model)
    sender, back = obj.socket(), obj.socket()
    await obj.chat.on_frame(sender, send("r1"))
    await model.waiting.wait()
    had = len(sender.chunks("r1"))
    # A client back from a turn that ended meanwhile: its sequence counts that turn's.
    await obj.chat.on_frame(back, resume("b1", last=had - 1, messageId="reply-an-older-turn"))
    assert [c["sequence"] for c in back.chunks("b1")] == list(range(had))
    await obj.chat.on_frame(back, resume("b2", last=had - 2, messageId="reply-key-r1"))
    assert [c["sequence"] for c in back.chunks("b2")] == [had - 1]
    model.release.set()
    await obj.settle()


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


async def test_what_a_socket_asked_survives_an_evicted_object(
    store: D1Store, capsys: pytest.CaptureFixture[str]
) -> None:
    obj = Object(store, Model())
    socket = obj.socket()
    await obj.chat.on_frame(socket, resume("a"))
    assert "new instance" not in capsys.readouterr().out
    obj.chat = obj.new_chat()  # a new instance: nothing in memory, the attachment kept
    await obj.chat.on_frame(socket, resume("b", headers={}))
    assert socket.kinds("b") == ["no-active"]
    assert SocketState.of(socket).frames == 2
    said = capsys.readouterr().out  # the dev server's log says so (and the workerd test reads it)
    assert "a new instance of session 's''s object took a chat socket's frame" in said


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
    assert socket.sent[0]["errorText"].startswith("regenerate-not-supported: ")
    assert socket.sent[1]["errorText"] == "invalid-body: the newest user message has no text part"
    assert "tool approval responses" in socket.sent[3]["errorText"]
    assert "printable ASCII" in socket.sent[4]["errorText"]
    assert await store.load_messages(SESSION_ID) == []


async def asked_for_approval(obj: Object, socket: FakeSocket) -> list[dict[str, Any]]:
    await obj.chat.on_frame(socket, send("r1", "refund order 42"))
    await obj.settle()
    asked = [c["chunk"] for c in socket.chunks("r1")]
    assert asked[-1] == {"type": "finish", "finishReason": "tool-calls"}
    return asked


async def test_an_approval_response_over_the_socket_runs_the_call_once(store: D1Store) -> None:
    model = RefundModel()
    obj = Object(store, model, REFUNDS)
    sender, follower = obj.socket(), obj.socket()
    asked = await asked_for_approval(obj, sender)
    assert not model.refunded
    model.hold = True
    await obj.chat.on_frame(sender, answer("r2", asked, approved=True))
    await model.waiting.wait()  # the approved refund runs, held
    await obj.chat.on_frame(follower, resume("f2"))  # another tab follows the turn going on
    model.release.set()
    await obj.settle()
    assert model.refunded == ["42"]
    chunks = sender.chunks("r2")
    assert [c["sequence"] for c in chunks] == list(range(len(chunks)))
    went_on = [c["chunk"] for c in chunks]
    assert went_on[0] == {"type": "start", "messageId": asked[0]["messageId"]}  # the same message
    assert {"type": "tool-output-available", "toolCallId": asked[3]["toolCallId"],
            "output": "refunded"} in went_on  # fmt: skip
    assert went_on[-1] == {"type": "finish", "finishReason": "stop"}
    # the other tab had nothing of the reply: it gets all of it, from the store, then the rest
    followed = [c["chunk"] for c in follower.chunks("f2")]
    assert [c["sequence"] for c in follower.chunks("f2")] == list(range(len(followed)))
    assert followed[0] == went_on[0]
    assert followed[-4:] == went_on[-4:]  # the reply's text, `finish`
    for socket, request in ((sender, "r2"), (follower, "f2")):
        assert (socket.kinds(request)[0], socket.kinds(request)[-1]) == ("start", "end")
    again = json.loads(answer("r3", asked, approved=True))
    await obj.chat.on_frame(sender, json.dumps(again))
    await obj.settle()
    (refused,) = [f for f in sender.sent if f["requestId"] == "r3"]
    assert refused["type"] == "error"
    assert refused["errorText"].startswith("approval-already-decided: ")
    assert model.refunded == ["42"]


async def test_a_denial_over_the_socket_runs_nothing(store: D1Store) -> None:
    model = RefundModel()
    obj = Object(store, model, REFUNDS)
    socket = obj.socket()
    asked = await asked_for_approval(obj, socket)
    await obj.chat.on_frame(socket, answer("r2", asked, approved=False))
    await obj.settle()
    went_on = [c["chunk"] for c in socket.chunks("r2")]
    assert {"type": "tool-output-denied", "toolCallId": asked[3]["toolCallId"]} in went_on
    assert went_on[-1] == {"type": "finish", "finishReason": "stop"}
    assert not model.refunded


async def test_a_refused_decision_is_an_error_frame_naming_why(store: D1Store) -> None:
    model = RefundModel()
    obj = Object(store, model, REFUNDS)
    socket = obj.socket()
    asked = await asked_for_approval(obj, socket)
    wrong = [
        {**c, "approvalId": f"{c['toolCallId']}:{'0' * 64}"}  # not the call's digest
        if c["type"] == "tool-approval-request" else c
        for c in asked
    ]  # fmt: skip
    await obj.chat.on_frame(socket, answer("r2", wrong, approved=True))
    await obj.settle()
    assert socket.kinds("r2") == ["error"]
    (refused,) = [f for f in socket.sent if f["requestId"] == "r2"]
    assert refused["errorText"].startswith("approval-digest-mismatch: ")
    assert SocketState.of(socket).request is None
    assert not model.refunded


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
