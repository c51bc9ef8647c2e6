"""The approval endpoints of the Worker's HTTP API, both halves on CPython: the Worker's
`handle_request` validates and builds the command, which crosses as JSON (as between
the Worker and the Durable Object) to `serve_session` on the D1 store (fake binding)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from durable_agents import Agent, LLMResponse, ToolCall, ToolContext, approval_digest, tool
from durable_agents.cloudflare import d1_store
from durable_agents.cloudflare.app import (
    Command,
    LiveSession,
    Reply,
    handle_request,
    serve_session,
)
from durable_agents.stores.d1 import D1Store
from durable_agents.testing import FunctionLLM
from durable_agents.testing.fake_d1 import FakeD1Database

TOKEN = "t0ken"
ENV = {"API_TOKEN": TOKEN}
SID = "cd" * 32


class Refund(BaseModel):
    order_id: str
    amount_cents: int


REFUNDS: list[str] = []


@tool(requires_approval=True)
async def issue_refund(args: Refund, ctx: ToolContext) -> dict[str, Any]:
    """Refund an order."""
    REFUNDS.append(ctx.tool_call_id)
    return {"refunded": args.amount_cents}


AGENT = Agent("refunds", "Refund.", [issue_refund])


def model(messages: list[Any], tools: Any) -> LLMResponse:
    last = messages[-1]
    if last.role == "user":
        n = len(messages)
        return LLMResponse(
            tool_calls=[
                ToolCall(f"r{n}a", "issue_refund", {"order_id": "A", "amount_cents": 100}),
                ToolCall(f"r{n}b", "issue_refund", {"order_id": "B", "amount_cents": 200}),
            ]
        )
    return LLMResponse(
        text="results: " + " | ".join(m.content for m in messages if m.role == "tool")
    )


class Session:
    """One session's 'Durable Object' on a fake D1, reached through the Worker's routing."""

    def __init__(self, store: D1Store) -> None:
        self.store = store
        self.live = LiveSession()

    async def dispatch(self, name: str, command: Command) -> Reply:
        crossed = Command.from_json(command.to_json())  # as it crosses to the object
        return await serve_session(
            crossed, session_id=SID, store=self.store, env=ENV, live=self.live, agent=AGENT,
            make_deps=lambda env, http: None, llm=FunctionLLM(model),
            http_client=httpx.AsyncClient(),
        )  # fmt: skip

    async def call(self, method: str, path: str, body: Any = None) -> Reply:
        raw = b"" if body is None else json.dumps(body).encode()
        return await handle_request(
            method, path, {"authorization": f"Bearer {TOKEN}"}, raw, env=ENV,
            dispatch=self.dispatch,
        )  # fmt: skip


@pytest.fixture
async def session() -> Session:
    REFUNDS.clear()
    store = d1_store(FakeD1Database())
    await store.create_tables()
    return Session(store)


async def test_approve_one_deny_the_other_then_the_turn_goes_on(session: Session) -> None:
    started = await session.call("POST", "/sessions/x/messages", {"message": "refund both"})
    assert started.status == 200
    assert started.body["status"] == "awaiting_approval"
    first, second = started.body["pending"]
    assert first["tool_name"] == "issue_refund"
    assert first["arguments"] == {"order_id": "A", "amount_cents": 100}
    assert first["digest"] == approval_digest(SID, first["tool_call_id"], "issue_refund",
                                              first["arguments"])  # fmt: skip
    listed = await session.call("GET", "/sessions/x/approvals")
    assert listed.body == {"session_id": SID, "pending": [first, second]}

    one = await session.call(
        "POST", f"/sessions/x/approvals/{first['tool_call_id']}",
        {"approved": True, "digest": first["digest"], "reason": "ann: ok"},
    )  # fmt: skip
    assert one.status == 200
    assert one.body == {"session_id": SID, "status": "awaiting_approval", "pending": [second]}
    assert REFUNDS == []  # nothing runs until the step is decided

    two = await session.call(
        "POST", f"/sessions/x/approvals/{second['tool_call_id']}",
        {"approved": False, "digest": second["digest"], "reason": "too much"},
    )  # fmt: skip
    assert two.status == 200, two.body
    assert two.body["status"] == "complete"
    assert [first["tool_call_id"]] == REFUNDS
    assert '"kind": "tool-denied"' in two.body["response"]
    assert '"reason": "too much"' in two.body["response"]
    assert (await session.call("GET", "/sessions/x/approvals")).body["pending"] == []


async def test_refusals_carry_their_codes_and_decide_nothing(session: Session) -> None:
    started = await session.call("POST", "/sessions/x/messages", {"message": "refund both"})
    first = started.body["pending"][0]
    call = first["tool_call_id"]
    wrong = await session.call(
        "POST", f"/sessions/x/approvals/{call}", {"approved": True, "digest": "0" * 64}
    )
    assert (wrong.status, wrong.body["error"]["code"]) == (409, "approval-digest-mismatch")
    unknown = await session.call(
        "POST", "/sessions/x/approvals/nope", {"approved": True, "digest": first["digest"]}
    )
    assert (unknown.status, unknown.body["error"]["code"]) == (404, "approval-not-found")
    blocked = await session.call("POST", "/sessions/x/messages", {"message": "something else"})
    assert (blocked.status, blocked.body["error"]["code"]) == (409, "approval-pending")
    ok = await session.call(
        "POST", f"/sessions/x/approvals/{call}", {"approved": True, "digest": first["digest"]}
    )
    assert ok.status == 200
    again = await session.call(
        "POST", f"/sessions/x/approvals/{call}", {"approved": False, "digest": first["digest"]}
    )
    assert (again.status, again.body["error"]["code"]) == (409, "approval-already-decided")
    assert REFUNDS == []
    resumed = await session.call("POST", "/sessions/x/resume")
    assert resumed.body["status"] == "awaiting_approval"  # the second still waits


async def test_an_approval_with_edited_arguments_stores_the_edit(session: Session) -> None:
    started = await session.call("POST", "/sessions/x/messages", {"message": "refund both"})
    first, second = started.body["pending"]
    call = first["tool_call_id"]
    edit = {"order_id": "A", "amount_cents": 40}
    one = await session.call(
        "POST", f"/sessions/x/approvals/{call}",
        {"approved": True, "digest": first["digest"], "reason": "ann: less", "arguments": edit},
    )  # fmt: skip
    assert one.status == 200, one.body
    assert one.body == {"session_id": SID, "status": "awaiting_approval", "pending": [second]}
    approved = (await session.store.load_approvals(SID))[-1]
    assert (approved.tool_call_id, approved.event, approved.reason) == (call, "approved",
                                                                        "ann: less")  # fmt: skip
    assert approved.arguments == edit
    assert approved.digest == first["digest"]
    assert approved.arguments_digest == approval_digest(SID, call, "issue_refund", edit)
    assert REFUNDS == []


async def test_an_edit_that_breaks_the_schema_is_422_and_decides_nothing(
    session: Session,
) -> None:
    started = await session.call("POST", "/sessions/x/messages", {"message": "refund both"})
    first = started.body["pending"][0]
    call = first["tool_call_id"]
    bad = await session.call(
        "POST", f"/sessions/x/approvals/{call}",
        {"approved": True, "digest": first["digest"],
         "arguments": {"order_id": "A", "amount_cents": "all of it"}},
    )  # fmt: skip
    assert (bad.status, bad.body["error"]["code"]) == (422, "invalid-arguments"), bad.body
    assert "amount_cents" in bad.body["error"]["problems"]
    assert "issue_refund's input schema" in bad.body["error"]["message"]
    assert [e.event for e in await session.store.load_approvals(SID)] == ["requested"] * 2
    assert (await session.call("GET", "/sessions/x/approvals")).body["pending"] == started.body[
        "pending"
    ]
    # The call's own digest still decides it, with a fitting edit.
    ok = await session.call(
        "POST", f"/sessions/x/approvals/{call}",
        {"approved": True, "digest": first["digest"],
         "arguments": {"order_id": "A", "amount_cents": 1}},
    )  # fmt: skip
    assert ok.status == 200, ok.body


async def test_an_edit_as_deep_as_a_body_may_nest_crosses_to_the_object(
    session: Session,
) -> None:
    started = await session.call("POST", "/sessions/x/messages", {"message": "refund both"})
    first = started.body["pending"][0]
    deep: dict[str, Any] = {}
    level = deep
    for _ in range(125):  # 126 levels, in {"arguments": {"deep": ...}}: 128, the body's limit
        level["n"] = {}
        level = level["n"]
    edit = {"order_id": "A", "amount_cents": 5, "deep": deep}  # the model ignores "deep"
    body = {"approved": True, "digest": first["digest"], "arguments": edit}
    # As the Durable Object gets it, inside the command: a level deeper than the body.
    decision = {"tool_call_id": first["tool_call_id"], **body}
    crossed = Command.from_json(Command("approve", decision=decision).to_json())
    assert crossed.decision.model_dump(exclude_none=True) == decision  # type: ignore[attr-defined]
    ok = await session.call("POST", f"/sessions/x/approvals/{first['tool_call_id']}", body)
    assert ok.status == 200, ok.body
    assert (await session.store.load_approvals(SID))[-1].arguments == edit
    too_deep = await session.call(
        "POST", f"/sessions/x/approvals/{first['tool_call_id']}",
        {**body, "arguments": {**edit, "deep": {"n": deep}}},
    )  # fmt: skip
    assert (too_deep.status, too_deep.body["error"]["code"]) == (400, "invalid-json")


def test_a_command_carries_an_edit_only_as_an_approvals_object() -> None:
    decision = {"tool_call_id": "c1", "approved": True, "digest": "a" * 64, "arguments": {}}
    crossed = Command.from_json(Command("approve", decision=decision).to_json())
    assert crossed.decision.model_dump(exclude_none=True) == decision  # type: ignore[attr-defined]
    for refused in ({**decision, "approved": False}, {**decision, "arguments": [1]}):
        with pytest.raises(ValueError, match="not a command"):
            Command.from_json(Command("approve", decision=refused).to_json())


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("/sessions/x/approvals/c1", {"approved": "yes", "digest": "a" * 64}, 422, "invalid-body"),
        ("/sessions/x/approvals/c1", {"approved": True, "digest": "A" * 64}, 422, "invalid-body"),
        ("/sessions/x/approvals/c1", {"approved": True}, 422, "invalid-body"),
        ("/sessions/x/approvals/c1", {"approved": True, "digest": "a" * 64, "x": 1}, 422,
         "invalid-body"),
        ("/sessions/x/approvals/c1", {"approved": True, "digest": "a" * 64, "reason": 5}, 422,
         "invalid-body"),
        ("/sessions/x/approvals/c1", {"approved": True, "digest": "a" * 64, "arguments": [1]},
         422, "invalid-body"),
        ("/sessions/x/approvals/c1", {"approved": True, "digest": "a" * 64, "arguments": "{}"},
         422, "invalid-body"),
        ("/sessions/x/approvals/c1", {"approved": False, "digest": "a" * 64, "arguments": {}},
         422, "invalid-body"),
        ("/sessions/x/approvals/c%2F1", {"approved": True, "digest": "a" * 64}, 400,
         "invalid-request"),
        ("/sessions/x/messages/c1", {"message": "x"}, 404, "not-found"),
    ],
)  # fmt: skip
async def test_malformed_decisions_never_reach_the_session(
    path: str, body: Any, status: int, code: str
) -> None:
    reached: list[Command] = []

    async def dispatch(name: str, command: Command) -> Reply:
        reached.append(command)
        return Reply(200, {})

    reply = await handle_request(
        "POST", path, {"authorization": f"Bearer {TOKEN}"}, json.dumps(body).encode(), env=ENV,
        dispatch=dispatch,
    )  # fmt: skip
    assert (reply.status, reply.body["error"]["code"]) == (status, code)
    assert reached == []


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [("POST", "/sessions/x/approvals", "GET"), ("GET", "/sessions/x/approvals/c1", "POST")],
)
async def test_the_approval_endpoints_answer_their_method_only(
    method: str, path: str, allowed: str
) -> None:
    reply = await handle_request(
        method, path, {"authorization": f"Bearer {TOKEN}"}, b"", env=ENV,
        dispatch=lambda n, c: None,  # type: ignore[arg-type,return-value]
    )  # fmt: skip
    assert (reply.status, reply.headers.get("Allow")) == (405, allowed)
