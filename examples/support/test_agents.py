"""The support example on CPython: the desk hands a question to the researcher and a
refund to the refunds agent (examples/refunds/agent.py, its payments API on an
httpx.MockTransport), each in a session of its own; the refund waits for a person's
approval, listed and decided from the desk's session, then runs once.

The mechanism over HTTP, killed with SIGKILL: tests/cloudflare/test_dev_server_agent_tools.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from durable_agents import LocalAgent, run
from durable_agents.agent_tools import child_session_name
from durable_agents.cloudflare.agent_module import AgentModule
from durable_agents.stores import Store, sqlite_store
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
