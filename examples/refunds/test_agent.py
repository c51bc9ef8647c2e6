"""The refund example on CPython: a whole turn against a payments API on an
httpx.MockTransport (the refund waits for a person's approval, then runs once;
denied, it never runs and the model sees `tool-denied`), a crash right after
the refund then a resume (one refund, a durability error), its setting, its
dev stub, and the module served through the Worker's API (`serve_session`,
approval included) on the fake D1.

Over HTTP in the local runtime, killed with SIGKILL mid-refund:
tests/cloudflare/test_dev_server_agents.py (`scripts/dev --agent
examples/refunds/agent.py`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from durable_agents import (
    ConfigurationError,
    LLMResponse,
    Message,
    ToolCall,
    ToolDurabilityError,
    approve,
    run,
)
from durable_agents.cloudflare import d1_store
from durable_agents.cloudflare.agent_module import AgentModule
from durable_agents.cloudflare.app import Command, LiveSession, serve_session
from durable_agents.llm import TestLLM
from durable_agents.stores import sqlite_store
from durable_agents.testing import ScriptedLLM, SimulatedCrash, crash_on_write
from durable_agents.testing.fake_d1 import FakeD1Database
from examples.refunds import agent as refunds

ENV = {"PAYMENTS_API_URL": "http://payments.test/v1/"}


class Payments:
    """A payments API on an httpx.MockTransport: refunds are recorded with their headers."""

    def __init__(self) -> None:
        self.refunds: list[httpx.Request] = []
        self.lookups = 0

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method == "GET" and path.startswith("/v1/orders/"):
            self.lookups += 1
            order = {"id": path.rsplit("/", 1)[1], "amount_cents": 2500, "currency": "usd",
                     "status": "paid"}  # fmt: skip
            return httpx.Response(200, json=order)
        if request.method == "POST" and path == "/v1/refunds":
            self.refunds.append(request)
            body = json.loads(request.content)
            refund = {"id": f"re_{len(self.refunds)}", "order_id": body["order_id"],
                      "amount_cents": body["amount_cents"], "status": "succeeded"}  # fmt: skip
            return httpx.Response(200, json=refund)
        return httpx.Response(404)

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handle))


def refund_script() -> list[LLMResponse]:
    refund = {"order_id": "ord_1", "amount_cents": 2500, "reason": "damaged"}
    return [
        LLMResponse("Looking.", [ToolCall("c1", "lookup_order", {"order_id": "ord_1"})]),
        LLMResponse("Refunding.", [ToolCall("c2", "issue_refund", refund)]),
        LLMResponse("Refunded 25.00 USD on ord_1."),
    ]


def test_issue_refund_needs_approval_and_lookup_order_does_not() -> None:
    tools = {t.name: t for t in refunds.AGENT.tools}
    assert tools["issue_refund"].requires_approval
    assert not tools["lookup_order"].requires_approval


async def test_a_turn_waits_for_approval_then_refunds_once_with_its_key(tmp_path: Path) -> None:
    payments = Payments()
    store = sqlite_store(tmp_path / "refunds.db")
    llm = ScriptedLLM(refund_script())
    async with payments.client() as http:
        deps = refunds.make_deps(ENV, http)
        waiting = await run(refunds.AGENT, llm=llm, message="refund ord_1", session_id="s",
                            store=store, deps=deps)  # fmt: skip
        assert waiting.status == "awaiting_approval"
        (pending,) = waiting.pending
        assert (pending.tool_call_id, pending.tool_name) == ("c2", "issue_refund")
        assert pending.arguments == {"order_id": "ord_1", "amount_cents": 2500,
                                     "reason": "damaged"}  # fmt: skip
        assert (payments.lookups, payments.refunds) == (1, [])  # nothing refunded yet
        await approve(store, "s", "c2", digest=pending.digest, approved=True, reason="ann: ok")
        result = await run(refunds.AGENT, llm=llm, session_id="s", store=store, deps=deps)
    await store.close()
    assert result.status == "complete", result.error
    (refund,) = payments.refunds
    assert str(refund.url) == "http://payments.test/v1/refunds"
    assert json.loads(refund.content) == {"order_id": "ord_1", "amount_cents": 2500,
                                          "reason": "damaged"}  # fmt: skip
    assert refund.headers["idempotency-key"].startswith("da-")
    stored = json.loads(result.messages[-2].content)
    assert stored == {"id": "re_1", "order_id": "ord_1", "amount_cents": 2500,
                      "status": "succeeded"}  # fmt: skip


async def test_a_denied_refund_never_runs_and_the_model_sees_tool_denied(
    tmp_path: Path,
) -> None:
    payments = Payments()
    store = sqlite_store(tmp_path / "refunds.db")
    llm = ScriptedLLM([*refund_script()[:2], LLMResponse("The refund was not approved.")])
    async with payments.client() as http:
        deps = refunds.make_deps(ENV, http)
        waiting = await run(refunds.AGENT, llm=llm, message="refund ord_1", session_id="s",
                            store=store, deps=deps)  # fmt: skip
        (pending,) = waiting.pending
        await approve(store, "s", "c2", digest=pending.digest, approved=False,
                      reason="ann: not eligible")  # fmt: skip
        result = await run(refunds.AGENT, llm=llm, session_id="s", store=store, deps=deps)
    await store.close()
    assert result.status == "complete"
    assert payments.refunds == []
    denied = json.loads(result.messages[-2].content)
    assert (denied["kind"], denied["toolName"], denied["reason"]) == (
        "tool-denied", "issue_refund", "ann: not eligible")  # fmt: skip


async def test_a_crash_after_the_refund_then_resume_refunds_once(tmp_path: Path) -> None:
    """TestLLM calls both tools in one step: the lookup runs, the refund waits. Approved,
    the resume claims it (append #1), refunds, and dies before its result is stored
    (append #2): the next resume answers it with a durability error, no second refund."""
    payments = Payments()
    store = sqlite_store(tmp_path / "refunds.db")
    try:
        async with payments.client() as http:
            deps = refunds.make_deps(ENV, http)
            waiting = await run(refunds.AGENT, llm=TestLLM(), message="refund order 1",
                                session_id="s", store=store, deps=deps)  # fmt: skip
            (pending,) = waiting.pending
            await approve(store, "s", pending.tool_call_id, digest=pending.digest, approved=True)
            with pytest.raises(SimulatedCrash):
                await run(refunds.AGENT, llm=TestLLM(), session_id="s",
                          store=crash_on_write(store, 2), deps=deps)  # fmt: skip
            assert (len(payments.refunds), payments.lookups) == (1, 1)
            resumed = await run(refunds.AGENT, llm=TestLLM(), session_id="s", store=store,
                                deps=deps)  # fmt: skip
        history = await store.load_messages("s")
    finally:
        await store.close()
    assert resumed.status == "complete"
    assert (len(payments.refunds), payments.lookups) == (1, 1)
    errors = [e for m in history if (e := ToolDurabilityError.from_message(m))]
    assert [e.tool_name for e in errors] == ["issue_refund"]
    assert payments.refunds[0].headers["idempotency-key"].startswith("da-")


def test_make_deps_needs_the_payments_url() -> None:
    for env in ({}, {"PAYMENTS_API_URL": ""}):
        with pytest.raises(ConfigurationError, match="PAYMENTS_API_URL is not set"):
            refunds.make_deps(env, httpx.AsyncClient())
    assert refunds.make_deps(ENV, httpx.AsyncClient()).api_url == "http://payments.test/v1"


def test_the_dev_stub_refunds_once_per_idempotency_key() -> None:
    stub = refunds.DEV_STUBS["PAYMENTS_API_URL"]
    order = stub("GET", "/orders/stub-order-1", b"", {})
    assert order == (200, {"id": "stub-order-1", "amount_cents": 4999, "currency": "usd",
                           "status": "paid", "refunded_cents": 0})  # fmt: skip
    body = json.dumps({"order_id": "stub-order-1", "amount_cents": 1000, "reason": "x"}).encode()
    key = {"idempotency-key": "stub-test-refund-1"}
    status, first = stub("POST", "/refunds", body, key)
    assert (status, first["amount_cents"], first["status"]) == (200, 1000, "succeeded")
    assert stub("POST", "/refunds", body, key) == (200, first)
    assert stub("GET", "/orders/stub-order-1", b"", {})[1]["refunded_cents"] == 1000
    assert stub("POST", "/refunds", b'{"order_id": "o"}', {})[0] == 400
    assert stub("DELETE", "/orders/1", b"", {})[0] == 404


async def test_the_module_served_by_the_worker_api_with_its_dev_stub() -> None:
    served = AgentModule.load(refunds)
    assert served.has_own_llm  # offline: play_refunds; this test drives it with TestLLM

    def handle(request: httpx.Request) -> httpx.Response:
        rest = request.url.path.removeprefix("/__dev/PAYMENTS_API_URL")
        status, body = refunds.payments_stub(request.method, rest, request.content,
                                             request.headers)  # fmt: skip
        return httpx.Response(status, json=body)

    store = d1_store(FakeD1Database())
    await store.create_tables()
    env: dict[str, Any] = {"PAYMENTS_API_URL": "http://dev.test/__dev/PAYMENTS_API_URL"}
    async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as http:

        async def serve(command: Command) -> Any:
            return await serve_session(
                command, session_id="cd" * 32, store=store, env=env,
                live=LiveSession(), agent=served.agent, make_deps=served.make_deps,
                llm=TestLLM(), http_client=http,
            )  # fmt: skip

        waiting = await serve(Command("message", "refund it"))
        assert waiting.status == 200, waiting.body
        assert waiting.body["status"] == "awaiting_approval"
        (pending,) = waiting.body["pending"]
        assert pending["tool_name"] == "issue_refund"
        decision = {"tool_call_id": pending["tool_call_id"], "approved": True,
                    "digest": pending["digest"], "reason": "test"}  # fmt: skip
        reply = await serve(Command("approve", decision=decision))
    assert reply.status == 200, reply.body
    assert reply.body["status"] == "complete"
    results = {m.tool_name: m.content for m in await store.load_messages("cd" * 32) if m.tool_name}
    assert json.loads(results["issue_refund"])["status"] == "succeeded"


@pytest.mark.parametrize("approved", [True, False], ids=["approved", "denied"])
async def test_the_offline_model_looks_up_asks_to_refund_and_reports(
    tmp_path: Path, approved: bool
) -> None:
    payments = Payments()
    llm = refunds.make_llm({})  # LLM_PROVIDER unset: play_refunds
    store = sqlite_store(tmp_path / "refunds.db")
    async with payments.client() as http:
        deps = refunds.make_deps(ENV, http)
        waiting = await run(refunds.AGENT, llm=llm, message="Refund order A-1", session_id="s",
                            store=store, deps=deps)  # fmt: skip
        (pending,) = waiting.pending
        assert pending.arguments == {"order_id": "A-1", "amount_cents": 2500,
                                     "reason": "asked by the customer"}  # fmt: skip
        await approve(store, "s", pending.tool_call_id, digest=pending.digest,
                      approved=approved, reason="ann")  # fmt: skip
        done = await run(refunds.AGENT, llm=llm, session_id="s", store=store, deps=deps)
    await store.close()
    assert done.status == "complete"
    if approved:
        assert done.response == "Refunded 25.00 on order A-1 (refund re_1)."
        assert len(payments.refunds) == 1
    else:
        assert done.response == "The refund of order A-1 was denied (ann): nothing refunded."
        assert payments.refunds == []


def test_the_offline_model_reports_a_lost_refund_and_asks_for_an_order() -> None:
    lost = ToolDurabilityError("issue_refund", "c2").to_content()
    messages = [
        Message.user("refund order 9"),
        Message.assistant("", [ToolCall("c2", "issue_refund", {})]),
        Message.tool_result(ToolCall("c2", "issue_refund", {}), lost),
    ]
    reply = refunds.play_refunds(messages, [])
    assert "may have gone through" in reply.text
    assert "order 9" in reply.text
    assert not reply.tool_calls
    assert "refund order A-1" in refunds.play_refunds([Message.user("hello")], []).text
