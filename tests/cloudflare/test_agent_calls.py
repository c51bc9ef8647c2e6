"""Agent tools between session objects (`agent_calls.ObjectAgents`): the parent object's
turn sends the child's object one command (the call's idempotency key as its request
key, the child's depth), and the child's object runs the turn and answers with it.
Here each object is `serve_session` on the fake D1, the send between them a function
call; over HTTP on scripts/dev, with SIGKILL: test_dev_server_agent_tools.py."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest
from pydantic import BaseModel

from durable_agents import (
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
from durable_agents.cloudflare.served_agents import object_name
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
        self.refunded: list[str] = []
        self.live: dict[str, LiveSession] = {}
        self.sent: list[tuple[str, str, Command]] = []

        @tool
        async def refund(args: RefundArgs, ctx: ToolContext) -> str:
            """Refund an order."""
            self.refunded.append(args.order)
            return f"refunded {args.order}"

        self.child = Agent("refunds", "You refund orders.", [refund])
        self.parent = Agent(
            "support", "You help.", [agent_tool("refunds", description="Refunds orders.")]
        )
        self.runner = ObjectAgents(["refunds"], self.send)

    def object_id(self, name: str) -> str:
        """A Durable Object's id: 64 hex digits, one per object name."""
        return hashlib.sha256(name.encode()).hexdigest()

    async def serve(
        self, agent: Agent, name: str, command: Command, llm: Any, budget: Any = None
    ) -> Reply:
        return await serve_session(
            command, session_id=self.object_id(name), store=self.store, env={},
            live=self.live.setdefault(name, LiveSession()), agent=agent,
            make_deps=lambda env, http: None, llm=llm, agents=self.runner, budget=budget,
        )  # fmt: skip

    async def send(self, agent: str, name: str, command: Command) -> Reply:
        self.sent.append((agent, name, command))
        command = command.model_copy(update={"name": name, "agent": agent})
        return await self.serve(
            self.child, object_name(agent, name), command, FunctionLLM(child_model)
        )


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
