"""Agent tools between session objects (`agent_calls.ObjectAgents`): the parent object's
turn sends the child's object one command (the call's idempotency key as its request
key, the child's depth), and the child's object runs the turn and answers with it,
streamed when the parent is watched: the child's events on the parent's stream, tagged,
and replayed by the parent's GET .../events mid-call. Here each object is
`serve_session` on the fake D1, the send between them a function call; over HTTP on
scripts/dev, with SIGKILL: test_dev_server_agent_tools.py."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from pydantic import BaseModel

from durable_agents import (
    LLM,
    Agent,
    CancelToken,
    LLMResponse,
    Message,
    ToolCall,
    ToolContext,
    ToolSpec,
    Usage,
    agent_tool,
    idempotency_key,
    tool,
)
from durable_agents.agent_tools import AgentTurn, child_session_name
from durable_agents.budget import InvocationBudget
from durable_agents.cloudflare import d1_store
from durable_agents.cloudflare.agent_calls import ObjectAgents
from durable_agents.cloudflare.app import Command, LiveSession, Reply, serve_session
from durable_agents.cloudflare.bodies import MessageBody, body_of
from durable_agents.cloudflare.js_streams import js_chunks
from durable_agents.cloudflare.live import decode_event, sse, stream_events
from durable_agents.cloudflare.served_agents import object_name
from durable_agents.events import ChildEvent, MessageStored, RunEvent, TextDelta
from durable_agents.llm import FunctionLLM
from durable_agents.messages import tool_error
from durable_agents.stores import Store
from durable_agents.testing import ScriptedLLM
from durable_agents.testing.fake_d1 import FakeD1Database

CHILD_USAGE = Usage(7, 3)


class RefundArgs(BaseModel):
    order: str


def child_model(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
    last = messages[-1]
    if last.role == "user":
        call = ToolCall("call_r", "refund", {"order": last.content.rsplit(" ", 1)[-1]})
        return LLMResponse(tool_calls=[call], usage=CHILD_USAGE)
    return LLMResponse(text=f"done: {last.content}", usage=CHILD_USAGE)


class Objects:
    """A parent object ("support") and the objects of its children ("refunds"), each
    `serve_session` on one D1 with a LiveSession of its own, as workerd keeps them."""

    def __init__(self, store: Store) -> None:
        self.store = store
        # Each object's own store (SESSION_STORE = "durable-object"), when a test sets it:
        # no object can read another's sessions, as in a Durable Object's own storage.
        self.own_stores: dict[str, Store] | None = None
        self.refunded: list[str] = []
        self.live: dict[str, LiveSession] = {}
        self.sent: list[tuple[str, str, Command]] = []
        self.hold: asyncio.Event | None = None  # set: the refund waits for it
        self.refunding = asyncio.Event()

        @tool
        async def refund(args: RefundArgs, ctx: ToolContext) -> str:
            """Refund an order."""
            self.refunding.set()
            if self.hold is not None:
                await self.hold.wait()
            self.refunded.append(args.order)
            return f"refunded {args.order}"

        self.child = Agent("refunds", "You refund orders.", [refund])
        self.parent = Agent(
            "support", "You help.", [agent_tool("refunds", description="Refunds orders.")]
        )
        self.runner = ObjectAgents(["refunds"], self.send)
        # the agents children's commands reach: each with a new model for each command
        self.children: dict[str, tuple[Agent, Callable[[], LLM]]] = {
            "refunds": (self.child, lambda: FunctionLLM(child_model))
        }

    def object_id(self, name: str) -> str:
        """A Durable Object's id: 64 hex digits, one per object name."""
        return hashlib.sha256(name.encode()).hexdigest()

    async def serve(
        self, agent: Agent, name: str, command: Command, llm: Any, budget: Any = None
    ) -> Reply:
        store = self.store
        if self.own_stores is not None:
            if name not in self.own_stores:
                self.own_stores[name] = d1_store(FakeD1Database())
                await self.own_stores[name].create_tables()
            store = self.own_stores[name]
        return await serve_session(
            command, session_id=self.object_id(name), store=store, env={},
            live=self.live.setdefault(name, LiveSession()), agent=agent,
            make_deps=lambda env, http: None, llm=llm, agents=self.runner, budget=budget,
        )  # fmt: skip

    async def send(self, agent: str, name: str, command: Command) -> Reply:
        self.sent.append((agent, name, command))
        command = command.model_copy(update={"name": name, "agent": agent})
        child, llm = self.children[agent]
        return await self.serve(child, object_name(agent, name), command, llm())


def parent_llm() -> ScriptedLLM:
    return ScriptedLLM(
        [
            LLMResponse(tool_calls=[ToolCall("call_p", "refunds", {"message": "refund 42"})]),
            LLMResponse(text="Refunded."),
        ]
    )


@pytest.fixture
async def objects() -> Objects:
    store = d1_store(FakeD1Database())
    await store.create_tables()
    return Objects(store)


async def test_the_child_turn_runs_in_its_own_object_once_with_the_calls_key(
    objects: Objects,
) -> None:
    budget = InvocationBudget(50, 50)  # the parent's invocation's
    reply = await objects.serve(
        objects.parent, "p", Command("message", "refund my order"), parent_llm(), budget
    )
    assert reply.status == 200, reply.body
    assert reply.body["status"] == "complete"
    parent_id = objects.object_id("p")
    child = child_session_name(parent_id, "call_p")
    ((agent, name, command),) = objects.sent
    assert (agent, name) == ("refunds", child)
    assert command.request_key == idempotency_key(parent_id, "call_p")
    assert command.depth == 1
    assert budget.used_subrequests == 1  # the fetch to the child's object
    assert objects.refunded == ["42"]
    history = await objects.store.load_messages(parent_id)
    (result,) = [m for m in history if m.role == "tool"]
    assert result.content == "done: refunded 42"
    assert result.usage == Usage(14, 6)  # the child session's two LLM calls

    # The call sent again (a parent resumed after a crash): the same turn, read back.
    turn = AgentTurn(
        "refunds", child, "refund 42", command.request_key or "", 1, parent_id, "call_p"
    )
    outcome = await objects.runner.run_turn(turn)
    assert (outcome.status, outcome.answer) == ("complete", "done: refunded 42")
    assert outcome.usage == Usage(14, 6)
    assert objects.refunded == ["42"]


async def test_a_reply_that_is_no_turn_result_is_a_typed_error(objects: Objects) -> None:
    async def refuse(agent: str, name: str, command: Command) -> Reply:
        return Reply(500, {"error": {"code": "agent-not-loaded", "message": "refunds.py broke"}})

    objects.runner = ObjectAgents(["refunds"], refuse)
    reply = await objects.serve(objects.parent, "p", Command("message", "refund it"), parent_llm())
    assert reply.body["status"] == "complete"
    history = await objects.store.load_messages(objects.object_id("p"))
    (result,) = [m for m in history if m.role == "tool"]
    error = tool_error(result.content)
    assert error is not None
    assert error["kind"] == "agent-failed"
    assert "refunds.py broke" in error["error"]


async def test_a_deferred_child_is_asked_to_go_on_until_it_ends(objects: Objects) -> None:
    replies = [
        Reply(202, {"status": "deferred", "response": "", "session_id": "c"}),
        Reply(200, {"status": "complete", "response": "done", "session_id": "c",
                    "session_usage": {"input_tokens": 5, "output_tokens": 1}}),
    ]  # fmt: skip
    sent: list[Command] = []

    async def send(agent: str, name: str, command: Command) -> Reply:
        sent.append(command)
        return replies.pop(0)

    runner = ObjectAgents(["refunds"], send)
    outcome = await runner.run_turn(AgentTurn("refunds", "c", "m", "k", 1, "p", "call"))
    assert [c.action for c in sent] == ["message", "resume"]
    assert all(c.depth == 1 for c in sent)
    assert (outcome.status, outcome.answer, outcome.usage) == ("complete", "done", Usage(5, 1))


async def test_cancelling_the_parent_sends_the_child_cancel() -> None:
    sent: list[str] = []
    release = asyncio.Event()

    async def send(agent: str, name: str, command: Command) -> Reply:
        sent.append(command.action)
        if command.action == "cancel":
            release.set()
            return Reply(200, {"status": "cancelled", "response": "", "session_id": "c"})
        await release.wait()
        return Reply(200, {"status": "cancelled", "response": "", "session_id": "c"})

    token = CancelToken()
    runner = ObjectAgents(["refunds"], send)
    turn = AgentTurn("refunds", "c", "m", "k", 1, "p", "call", cancel=token)
    running = asyncio.ensure_future(runner.run_turn(turn))
    await asyncio.sleep(0)
    token.cancel("stop")
    outcome = await running
    assert sent == ["message", "cancel"]
    assert outcome.status == "cancelled"


def test_a_depth_comes_from_a_parent_object_never_from_a_clients_body() -> None:
    refused = body_of(MessageBody, {"message": "hi", "depth": 1})
    assert isinstance(refused, Reply)
    assert refused.status == 422
    with pytest.raises(ValueError, match="not a command"):
        Command.from_json('{"action": "message", "message": "hi", "depth": 0}')
    assert Command.from_json('{"action": "message", "message": "hi", "depth": 2}').depth == 2


async def events_of(reply: Reply) -> list[tuple[str, Any, str | None]]:
    """A streamed reply's events, read to its end: (event, data, id); a `child` event
    carries no `id:` line (its id is the last one before it, as SSE keeps it)."""
    assert reply.stream is not None, reply.body
    async with asyncio.timeout(10):
        body = b"".join([chunk async for chunk in reply.stream])
    assert b"event: child\nid:" not in body

    async def whole() -> AsyncIterator[bytes]:
        yield body

    return [(e.event, json.loads(e.data), e.id) async for e in stream_events(whole())]


async def read_back(kind: str, data: Any) -> RunEvent | None:
    """The event that the SSE event `kind` with `data` stands for, read back."""

    async def one() -> AsyncIterator[bytes]:
        yield sse(kind, data)

    (event,) = [e async for e in stream_events(one())]
    return decode_event(event)


def of_child(events: list[tuple[str, Any, str | None]], name: str) -> list[dict[str, Any]]:
    """The data of the `child` events of the child session `name`, in order."""
    return [data for kind, data, _ in events if kind == "child" and data["session"] == name]


async def test_a_streamed_parent_carries_the_childs_events_tagged_before_its_result(
    objects: Objects,
) -> None:
    reply = await objects.serve(
        objects.parent, "p", Command("message", "refund my order", stream=True), parent_llm()
    )
    events = await events_of(reply)
    assert events[-1][0] == "done"
    assert events[-1][1]["status"] == "complete"
    child = child_session_name(objects.object_id("p"), "call_p")
    tagged = of_child(events, child)
    assert {(d["agent"], d["tool_call_id"]) for d in tagged} == {("refunds", "call_p")}
    messages = [(d["id"], d["data"]["role"]) for d in tagged if d["event"] == "message"]
    assert messages == [(0, "user"), (1, "assistant"), (2, "tool"), (3, "assistant")]
    deltas = "".join(d["data"]["text"] for d in tagged if d["event"] == "delta")
    assert deltas == "done: refunded 42"
    assert tagged[-1]["data"]["content"] == "done: refunded 42"
    # Every child event comes after the parent's call and before the call's result, its
    # SSE id still the parent's last position (a reconnect's Last-Event-ID names those).
    order = [(kind, event_id) for kind, _, event_id in events if kind in ("message", "child")]
    first, last = order.index(("child", "1")), len(order) - order[::-1].index(("child", "1"))
    assert order[:first] == [("message", "0"), ("message", "1")]
    assert order[last:] == [("message", "2"), ("message", "3")]
    # Decoded, each is the child's own event again, tagged.
    decoded = await read_back("child", tagged[1])
    assert isinstance(decoded, ChildEvent)
    assert (decoded.agent, decoded.session_name, decoded.tool_call_id) == (
        "refunds",
        child,
        "call_p",
    )
    assert isinstance(decoded.event, MessageStored)
    assert decoded.event.position == 1
    assert decoded.event.message.tool_calls[0].name == "refund"
    assert objects.refunded == ["42"]
    ((_, _, command),) = objects.sent
    assert command.stream


def relay_model(tool_name: str, who: str) -> Callable[[list[Message], list[ToolSpec]], LLMResponse]:
    """A model that hands the user's message to the tool `tool_name`, then answers
    "<who>: <its result>"."""

    def answer(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        last = messages[-1]
        if last.role == "user":
            return LLMResponse(tool_calls=[ToolCall(f"call_{who}", tool_name, {"message": "go"})])
        return LLMResponse(text=f"{who}: {last.content}")

    return answer


async def test_a_grandchilds_events_arrive_nested(objects: Objects) -> None:
    middle = Agent("orders", "You relay.", [agent_tool("refunds", description="Refunds.")])
    objects.children["orders"] = (middle, lambda: FunctionLLM(relay_model("refunds", "orders")))
    objects.runner = ObjectAgents(["orders", "refunds"], objects.send)
    parent = Agent("support", "You help.", [agent_tool("orders", description="Orders.")])
    llm = FunctionLLM(relay_model("orders", "support"))
    reply = await objects.serve(parent, "p", Command("message", "refund 7", stream=True), llm)
    events = await events_of(reply)
    assert events[-1][1]["response"] == "support: orders: done: refunded go"
    middle_name = child_session_name(objects.object_id("p"), "call_support")
    tagged = of_child(events, middle_name)
    nested = [d["data"] for d in tagged if d["event"] == "child"]
    grandchild = child_session_name(
        objects.object_id(object_name("orders", middle_name)), "call_orders"
    )
    assert {(d["agent"], d["session"], d["tool_call_id"]) for d in nested} == {
        ("refunds", grandchild, "call_orders")
    }
    roles = [d["data"]["role"] for d in nested if d["event"] == "message"]
    assert roles == ["user", "assistant", "tool", "assistant"]
    # the middle child's own messages around its child's: its call first, its result after
    kinds = [(d["event"], d.get("id")) for d in tagged if d["event"] != "delta"]
    assert kinds[:2] == [("message", 0), ("message", 1)]
    assert kinds[-2:] == [("message", 2), ("message", 3)]
    decoded = await read_back("child", tagged[kinds.index(("child", None))])
    assert isinstance(decoded, ChildEvent)
    assert isinstance(decoded.event, ChildEvent)
    assert decoded.event.session_name == grandchild


async def test_a_reconnect_mid_call_replays_the_childs_stored_messages(objects: Objects) -> None:
    objects.hold = asyncio.Event()
    turn = asyncio.ensure_future(
        objects.serve(objects.parent, "p", Command("message", "refund my order"), parent_llm())
    )
    async with asyncio.timeout(10):
        await objects.refunding.wait()  # the child's call is stored; its refund waits
    # The client had the parent's messages 0 and 1 (its call) when it lost its stream.
    reply = await objects.serve(objects.parent, "p", Command("events", after=1), None)
    replaying = asyncio.ensure_future(events_of(reply))
    await asyncio.sleep(0.05)
    objects.hold.set()
    events = await replaying
    assert (await turn).body["status"] == "complete"
    child = child_session_name(objects.object_id("p"), "call_p")
    tagged = [
        (d["id"], d["data"]["role"]) for d in of_child(events, child) if d["event"] == "message"
    ]
    # replayed from the child's object: its user message and call; then live: the rest
    assert tagged == [(0, "user"), (1, "assistant"), (2, "tool"), (3, "assistant")]
    parents = [event_id for kind, _, event_id in events if kind == "message"]
    assert parents == ["2", "3"]
    assert events[0][0] == "child"
    assert events[-1][0] == "done"
    assert [c.action for _, _, c in objects.sent] == ["message", "events"]
    assert objects.sent[1][2].follow is False


async def test_a_child_stream_that_breaks_off_loses_no_answer() -> None:
    sent: list[Command] = []

    async def broken() -> AsyncIterator[bytes]:
        yield sse("message", {"role": "user", "content": "m"}, 0)
        raise ConnectionError("the child's object was reset")

    async def send(agent: str, name: str, command: Command) -> Reply:
        sent.append(command)
        if command.stream:
            return Reply(200, None, stream=broken())
        return Reply(200, {"status": "complete", "response": "done", "session_id": "c"})

    seen: list[RunEvent] = []
    runner = ObjectAgents(["refunds"], send)
    turn = AgentTurn("refunds", "c", "m", "k", 1, "p", "call", on_event=seen.append)
    outcome = await runner.run_turn(turn)
    assert (outcome.status, outcome.answer) == ("complete", "done")
    assert [(c.action, c.stream, c.request_key) for c in sent] == [
        ("message", True, "k"),
        ("message", False, "k"),
    ]
    assert [type(e) for e in seen] == [MessageStored]


async def test_a_child_streams_error_event_is_a_typed_error() -> None:
    async def failing() -> AsyncIterator[bytes]:
        yield sse("delta", {"text": "hi"})
        yield sse("error", {"error": {"code": "store", "message": "D1 is down"}})

    async def send(agent: str, name: str, command: Command) -> Reply:
        return Reply(200, None, stream=failing())

    seen: list[RunEvent] = []
    runner = ObjectAgents(["refunds"], send)
    turn = AgentTurn("refunds", "c", "m", "k", 1, "p", "call", on_event=seen.append)
    outcome = await runner.run_turn(turn)
    assert outcome.status == "error"
    assert "D1 is down" in (outcome.error or "")
    assert seen == [TextDelta("hi")]


async def test_a_js_stream_is_read_as_bytes_and_cancelled_when_left() -> None:
    class Chunk:
        def __init__(self, data: bytes | None) -> None:
            self.done, self.value = data is None, data and Buffer(data)

    class Buffer:
        def __init__(self, data: bytes) -> None:
            self.data = data

        def to_bytes(self) -> bytes:
            return self.data

    class Reader:
        cancelled = False

        def __init__(self, chunks: list[bytes]) -> None:
            self.chunks = chunks

        async def read(self) -> Chunk:
            return Chunk(self.chunks.pop(0) if self.chunks else None)

        async def cancel(self) -> None:
            self.cancelled = True

    class Stream:
        def __init__(self, *chunks: bytes) -> None:
            self.reader = Reader(list(chunks))

        def getReader(self) -> Reader:
            return self.reader

    whole = Stream(b'event: delta\ndata: {"te', b'xt":"h\xc3', b'\xa9"}\n\n')
    read = [decode_event(e) async for e in stream_events(whole)]
    assert read == [TextDelta("h\u00e9")]
    assert not whole.reader.cancelled
    left = Stream(b"a", b"b")
    chunks = js_chunks(left)
    assert await anext(chunks) == b"a"
    await chunks.aclose()
    assert left.reader.cancelled


class PayoutArgs(BaseModel):
    order: str


@pytest.mark.parametrize("own_stores", [False, True], ids=["one-d1", "each-objects-own"])
async def test_a_childs_approval_is_listed_and_decided_through_the_parents_object(
    objects: Objects, own_stores: bool
) -> None:
    if own_stores:
        objects.own_stores = {}
    paid: list[str] = []

    @tool(requires_approval=True)
    async def payout(args: PayoutArgs, ctx: ToolContext) -> str:
        """Pay an order back."""
        paid.append(args.order)
        return f"paid {args.order}"

    def payouts_model(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        last = messages[-1]
        if last.role == "user":
            return LLMResponse(tool_calls=[ToolCall("call_pay", "payout", {"order": "7"})])
        return LLMResponse(text=f"payouts: {last.content}")

    objects.children["payouts"] = (
        Agent("payouts", "Pays.", [payout]),
        lambda: FunctionLLM(payouts_model),
    )
    objects.runner = ObjectAgents(["refunds", "payouts"], objects.send)
    parent = Agent("support", "You help.", [agent_tool("payouts", description="Pays orders.")])

    def parent_model(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
        if messages[-1].role == "tool":
            return LLMResponse(text=f"support: {messages[-1].content}")
        return LLMResponse(tool_calls=[ToolCall("call_p", "payouts", {"message": "pay 7"})])

    async def to_parent(command: Command) -> Reply:
        return await objects.serve(parent, "p", command, FunctionLLM(parent_model))

    asked = await to_parent(Command("message", "pay my order"))
    assert asked.body["status"] == "awaiting_approval", asked.body
    child = objects.object_id(
        object_name("payouts", child_session_name(objects.object_id("p"), "call_p"))
    )
    (pending,) = asked.body["pending"]
    assert (pending["tool_call_id"], pending["session"]) == ("call_pay", child)
    listed = await to_parent(Command("approvals"))
    assert listed.body["pending"] == [pending]

    wrong = {"tool_call_id": "call_pay", "approved": True, "digest": "0" * 64}
    refused = await to_parent(Command("approve", decision=wrong))
    assert (refused.status, refused.error_code) == (409, "approval-digest-mismatch")
    assert paid == []

    decision = {"tool_call_id": "call_pay", "approved": True, "digest": pending["digest"]}
    done = await to_parent(Command("approve", decision=decision))
    assert (done.body["status"], done.body["response"]) == ("complete", "support: payouts: paid 7")
    assert paid == ["7"]
    assert (await to_parent(Command("approvals"))).body["pending"] == []
