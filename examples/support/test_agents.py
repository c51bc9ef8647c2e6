"""The support example on CPython: the desk hands a question to the researcher and a
refund to the refunds agent (examples/refunds/agent.py, its payments API on an
httpx.MockTransport), each in a session of its own; the refund waits for a person's
approval, listed and decided from the desk's session, then runs once. `check_agent` runs
the desk with the two modules it calls, at every crash point of the three agents' writes.

The mechanism over HTTP, killed with SIGKILL: tests/cloudflare/test_dev_server_agent_tools.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from durable_agents import LocalAgent, approve, pending_approvals, run
from durable_agents.agent_tools import child_session_name
from durable_agents.cloudflare.agent_module import AgentModule
from durable_agents.stores import Store, sqlite_store
from durable_agents.testing import check_agent
from examples.support.agents import refunds, researcher, support

ENV = {"PAYMENTS_API_URL": "http://payments.test/v1"}


@pytest.fixture
async def store(tmp_path: Path) -> Any:
    async with sqlite_store(tmp_path / "support.db") as opened:
        yield opened


def payments(refunded: list[dict[str, Any]]) -> httpx.AsyncClient:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json={"id": "A-1", "amount_cents": 4999,
                                              "currency": "usd", "status": "paid"})  # fmt: skip
        body = json.loads(request.content)
        refunded.append({**body, "key": request.headers["idempotency-key"]})
        return httpx.Response(200, json={"id": "re_1", "order_id": body["order_id"],
                                          "amount_cents": body["amount_cents"],
                                          "status": "succeeded"})  # fmt: skip

    return httpx.AsyncClient(transport=httpx.MockTransport(handle))


def agents(http: httpx.AsyncClient) -> dict[str, LocalAgent]:
    """The agents the desk calls, as the Worker serves them: each module's own model."""
    return {
        "refunds": LocalAgent(
            refunds.AGENT, llm=refunds.make_llm({}), deps=refunds.make_deps(ENV, http)
        ),
        "researcher": LocalAgent(researcher.AGENT, llm=researcher.make_llm({})),
    }


def test_the_three_modules_are_agent_modules() -> None:
    for module in (support, refunds, researcher):
        AgentModule.load(module)


async def test_a_question_goes_to_the_researcher(store: Store) -> None:
    async with payments([]) as http:
        result = await run(
            support.AGENT, llm=support.make_llm({}), message="What is your refunds policy?",
            session_id="t1", store=store, agents=agents(http),
        )  # fmt: skip
    assert result.status == "complete"
    assert result.response == (
        "The researcher agent says: Orders can be refunded in full within 30 days of delivery."
    )
    (call,) = (await store.load_messages("t1"))[1].tool_calls
    child = await store.load_messages(child_session_name("t1", call.id))
    assert [m.role for m in child] == ["user", "assistant", "tool", "assistant"]


async def test_a_refund_waits_for_its_approval_from_the_desk_then_runs_once(store: Store) -> None:
    refunded: list[dict[str, Any]] = []
    async with payments(refunded) as http:

        async def desk(message: str | None) -> Any:
            return await run(
                support.AGENT, llm=support.make_llm({}), message=message, session_id="t2",
                store=store, agents=agents(http),
            )  # fmt: skip

        waiting = await desk("Please refund order A-1")
        assert waiting.status == "awaiting_approval"
        (pending,) = await pending_approvals(store, "t2")  # the refunds agent's, from the desk
        assert pending.tool_name == "issue_refund"
        assert pending.session is not None  # tagged: the child session holding the call
        assert [p.tool_call_id for p in waiting.pending] == [pending.tool_call_id]
        assert refunded == []
        await approve(store, "t2", pending.tool_call_id, digest=pending.digest, approved=True)
        done = await desk(None)
    assert done.status == "complete"
    assert done.response == "The refunds agent says: Refunded 49.99 on order A-1 (refund re_1)."
    assert len(refunded) == 1
    assert refunded[0]["order_id"] == "A-1"
    assert refunded[0]["amount_cents"] == 4999
    child = await store.load_messages(pending.session)
    assert child[-1].content == "Refunded 49.99 on order A-1 (refund re_1)."


def test_check_agent_runs_the_desk_with_the_agents_it_calls() -> None:
    # The modules as scripts/check passes them: each set up as the checked one (its dev
    # stub answering PAYMENTS_API_URL), the refund approved and denied from the desk's
    # session (one turn, no edits: kept fast; scripts/check runs every sweep).
    agents = {"refunds": refunds, "researcher": researcher}
    report = check_agent(support, config=None, turns=1, decide="both", agents=agents)
    assert report.agents == ("refunds", "researcher")
    assert report.child_crash_points > 0
    counts = report.tools["refunds.issue_refund"]
    assert counts.completed > 0
    assert counts.approved > 0
    assert counts.denied > 0
