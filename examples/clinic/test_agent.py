"""The clinic example on CPython, against its own MCP server (examples/clinic/mcp_server.py,
the official MCP SDK's, started once as a subprocess on 127.0.0.1).

The story: Ada asks for a check-up "on Monday"; the model first picks a Monday in
the past and `check_date` sends it back (`ModelRetry`); it finds the slots, asks to
book 09:00, and the booking waits for the front desk, who approves it moved to
10:30 (an edited approval); it runs once, with the edit, and the turn ends with a
typed answer. Then: an answer that breaks the type, a tool that keeps asking for
retries, a crash after the booking ran, and the module served through the
Worker's API.
"""

from __future__ import annotations

import datetime
import json
import select
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from durable_agents import (
    LLMResponse,
    Message,
    ToolCall,
    ToolContext,
    ToolDurabilityError,
    approval_digest,
    approve,
    run,
)
from durable_agents.cloudflare import d1_store
from durable_agents.cloudflare.agent_module import AgentModule
from durable_agents.cloudflare.app import Command, LiveSession, serve_session
from durable_agents.mcp import MCPTools
from durable_agents.stores import sqlite_store
from durable_agents.testing import ScriptedLLM, SimulatedCrash, crash_on_write
from durable_agents.testing.fake_d1 import FakeD1Database
from durable_agents.tools import RunContext
from examples.clinic import agent as clinic

SERVER = Path(__file__).with_name("mcp_server.py")
WEDNESDAY = datetime.datetime(2026, 6, 10, 9, 0, tzinfo=datetime.UTC).timestamp()
THURSDAY = WEDNESDAY + 86_400


@pytest.fixture(scope="module")
def mcp_url() -> Iterator[str]:
    """The clinic's MCP server on a free port; its bookings last for this module."""
    server = subprocess.Popen(
        [sys.executable, str(SERVER), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert server.stdout is not None
    try:
        ready, _, _ = select.select([server.stdout], [], [], 20)
        line = server.stdout.readline().decode() if ready else ""
        assert line.startswith("listening "), f"the MCP server did not start: {line!r}"
        yield f"http://127.0.0.1:{int(line.split()[1])}/mcp"
    finally:
        server.kill()
        server.wait()
        for pipe in (server.stdout, server.stderr):
            if pipe is not None:
                pipe.close()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as client:
        yield client


def step(call_id: str, name: str, **arguments: Any) -> LLMResponse:
    return LLMResponse(tool_calls=[ToolCall(call_id, name, arguments)])


def last_result(messages: list[Message]) -> Any:
    return json.loads(messages[-1].content)


async def bookings(url: str, http: httpx.AsyncClient, patient: str) -> list[dict[str, Any]]:
    """What the booking system holds for `patient`, read through its own list_bookings."""
    tools = await MCPTools(url=url).list_tools(RunContext("probe", None, clinic_now(), http=http))
    lister = next(t for t in tools if t.name == "list_bookings")
    assert lister.handler is not None
    found = await lister.handler({"patient": patient}, ToolContext("probe", "p1", "list", "k"))
    return list(found["bookings"])


def clinic_now() -> datetime.datetime:
    return datetime.datetime.fromtimestamp(WEDNESDAY, datetime.UTC)


async def test_a_booking_retried_approved_with_another_slot_and_answered_typed(
    tmp_path: Path, mcp_url: str, http: httpx.AsyncClient
) -> None:
    asked = {"slot_id": "2026-06-15T09:00", "patient": "Ada Lovelace", "treatment": "check-up"}
    edited = {**asked, "slot_id": "2026-06-15T10:30"}

    def answer(messages: list[Message], tools: Any) -> LLMResponse:
        booked = json.loads(messages[-1].content)["result"]
        appointment = {k: booked[k] for k in ("booking_id", "slot_id", "dentist", "treatment")}
        reply = {"message": "You are booked for Monday at 10:30.", "appointment": appointment}
        return step("a6", "final_result", **reply)

    llm = ScriptedLLM([
        step("a1", "check_date", date="2026-06-08"),  # last Monday: sent back
        step("a2", "check_date", date="2026-06-15"),
        step("a3", "find_slots", date="2026-06-15"),
        step("a4", "book_slot", **asked),
        answer,
    ])  # fmt: skip
    store = sqlite_store(tmp_path / "clinic.db")
    common: dict[str, Any] = dict(
        llm=llm, session_id="s1", store=store, settings={"MCP_URL": mcp_url}, http=http,
    )  # fmt: skip
    waiting = await run(
        clinic.AGENT, message="A check-up on Monday, please", session_name="ada-lovelace",
        clock=lambda: WEDNESDAY, **common,
    )  # fmt: skip

    # The instructions were made for this turn: today's date and the caller.
    system = llm.calls[0].messages[0].content
    assert "Today is Wednesday 2026-06-10" in system
    assert "talking to Ada Lovelace" in system
    # check_date sent the model back with a reason; the second day passed.
    retried = json.loads(llm.calls[1].messages[-1].content)
    assert retried["kind"] == "tool-retry"
    assert "2026-06-08 is in the past (today is 2026-06-10)" in retried["error"]
    assert json.loads(llm.calls[2].messages[-1].content)["weekday"] == "Monday"
    # book_slot is destructive on the server: it waits for the front desk.
    assert waiting.status == "awaiting_approval"
    (pending,) = waiting.pending
    assert (pending.tool_name, pending.arguments) == ("book_slot", asked)
    assert await bookings(mcp_url, http, "Ada Lovelace") == []

    await approve(
        store, "s1", pending.tool_call_id, digest=pending.digest, approved=True,
        arguments=edited, reason="desk: Ada called back, 09:00 is too early",
    )  # fmt: skip
    done = await run(clinic.AGENT, clock=lambda: THURSDAY, **common)  # resumed a day later

    assert done.status == "complete", done.error
    assert done.output is not None  # a FrontDeskReply
    assert done.output.appointment is not None
    assert done.output.appointment.slot_id == "2026-06-15T10:30"
    assert json.loads(done.response) == done.output.model_dump()  # the stored answer: JSON
    # The resumed turn was sent the instructions stored with its message, not Thursday's.
    assert llm.calls[-1].messages[0].content == system
    history = await store.load_messages("s1")
    assert history[0].instructions == system
    # The booking ran once, with the edit; the model was told so.
    (booking,) = await bookings(mcp_url, http, "Ada Lovelace")
    assert booking["slot_id"] == "2026-06-15T10:30"
    result = json.loads(next(m.content for m in history if m.tool_call_id == "a4"))
    assert (result["result"]["slot_id"], result["edited_arguments"]) == ("2026-06-15T10:30", edited)
    # Both versions are kept: the model's call, and the edit with its own digest.
    call = next(c for m in history for c in m.tool_calls if c.id == "a4")
    assert call.arguments == asked
    decision = next(e for e in await store.load_approvals("s1") if e.event == "approved")
    assert decision.digest == pending.digest
    assert decision.arguments == edited
    assert decision.arguments_digest == approval_digest("s1", "a4", "book_slot", edited)
    # What the kit decided from the server's annotations is stored with each call.
    policies = {c.name: c.policy for m in history for c in m.tool_calls}
    assert policies["check_date"] is None  # the agent's own tool
    find_slots, book_slot = policies["find_slots"], policies["book_slot"]
    assert find_slots is not None
    assert find_slots["safe_to_retry"]
    assert book_slot is not None
    assert book_slot == {
        "source": "mcp:clinic",
        "safe_to_retry": False,
        "requires_approval": True,
        "annotations": {"readOnlyHint": False, "destructiveHint": True},
        "input_schema": book_slot["input_schema"],
    }
    await store.close()


async def test_an_answer_that_breaks_the_type_goes_back_to_the_model(
    tmp_path: Path, mcp_url: str, http: httpx.AsyncClient
) -> None:
    llm = ScriptedLLM([
        step("b1", "final_result", appointment=None),  # no message: invalid
        LLMResponse('{"message": "We are closed on Sundays; any other day?"}'),  # text, as JSON
    ])  # fmt: skip
    store = sqlite_store(tmp_path / "clinic.db")
    done = await run(
        clinic.AGENT, llm=llm, message="Sunday?", session_id="s2", store=store,
        settings={"MCP_URL": mcp_url}, http=http, )  # fmt: skip
    await store.close()
    rejected = json.loads(llm.calls[1].messages[-1].content)
    assert rejected["kind"] == "invalid-arguments"
    assert "message: Field required" in rejected["error"]
    assert done.status == "complete"
    assert done.output == clinic.FrontDeskReply(message="We are closed on Sundays; any other day?")


async def test_check_date_asks_for_retries_at_most_max_tool_retries_times(
    tmp_path: Path, mcp_url: str, http: httpx.AsyncClient
) -> None:
    llm = ScriptedLLM([
        *(step(f"c{n}", "check_date", date="2026-06-14") for n in range(3)),  # a Sunday
        step("c9", "final_result", message="Which day suits you?"),
    ])  # fmt: skip
    store = sqlite_store(tmp_path / "clinic.db")
    done = await run(
        clinic.AGENT, llm=llm, message="The 14th", session_id="s3", store=store,
        settings={"MCP_URL": mcp_url}, http=http, clock=lambda: WEDNESDAY,
    )  # fmt: skip
    await store.close()
    kinds = [json.loads(m.content)["kind"] for m in done.messages if m.tool_name == "check_date"]
    assert kinds == ["tool-retry", "tool-retry", "tool-failed"]  # max_tool_retries=2
    assert done.status == "complete"


async def test_a_crash_after_the_booking_ran_books_once_and_the_model_is_told(
    tmp_path: Path, mcp_url: str, http: httpx.AsyncClient
) -> None:
    asked = {"slot_id": "2026-06-16T14:00", "patient": "Grace Hopper", "treatment": "filling"}
    llm = ScriptedLLM([
        step("d1", "book_slot", **asked),
        step("d2", "list_bookings", patient="Grace Hopper"),  # after the lost result: look
        step("d3", "final_result", message="You are booked for Tuesday at 14:00."),
    ])  # fmt: skip
    store = sqlite_store(tmp_path / "clinic.db")
    common: dict[str, Any] = dict(
        session_id="s4", settings={"MCP_URL": mcp_url}, http=http, )  # fmt: skip
    waiting = await run(clinic.AGENT, llm=llm, message="Book it", store=store, **common)
    (pending,) = waiting.pending
    await approve(store, "s4", "d1", digest=pending.digest, approved=True)
    with pytest.raises(SimulatedCrash):  # the booking is made; its result is never stored
        await run(
            clinic.AGENT, llm=llm, store=crash_on_write(store, before="result of book_slot"),
            **common,
        )  # fmt: skip
    done = await run(clinic.AGENT, llm=llm, store=store, **common)
    history = await store.load_messages("s4")
    await store.close()
    assert done.status == "complete"
    lost = [e for m in history if (e := ToolDurabilityError.from_message(m))]
    assert [e.tool_name for e in lost] == ["book_slot"]  # not sent again: destructive
    assert len(await bookings(mcp_url, http, "Grace Hopper")) == 1


async def test_the_module_served_by_the_worker_api_with_an_edited_approval(
    mcp_url: str, http: httpx.AsyncClient
) -> None:
    served = AgentModule.load(clinic)
    assert served.settings == ("MCP_URL",)  # read by the toolset: the Worker passes it
    today = datetime.datetime.now(datetime.UTC).date()
    monday = today + datetime.timedelta(days=7 - today.weekday() + 7)
    asked = {"slot_id": f"{monday}T14:00", "patient": "Alan Turing", "treatment": "cleaning"}

    def answer(messages: list[Message], tools: Any) -> LLMResponse:
        booked = json.loads(messages[-1].content)["result"]
        appointment = {k: booked[k] for k in ("booking_id", "slot_id", "dentist", "treatment")}
        return step("e3", "final_result", message="Booked.", appointment=appointment)

    llm = ScriptedLLM([step("e1", "check_date", date=str(monday)), step("e2", "book_slot", **asked),
                       answer])  # fmt: skip
    store = d1_store(FakeD1Database())
    await store.create_tables()

    async def serve(command: Command) -> Any:
        return await serve_session(
            command, session_id="ab" * 32, store=store, env={"MCP_URL": mcp_url},
            live=LiveSession(), agent=served.agent, make_deps=served.make_deps, llm=llm,
            http_client=http,
        )  # fmt: skip

    waiting = await serve(Command("message", "A cleaning, please", name="alan-turing"))
    assert waiting.status == 200, waiting.body
    (pending,) = waiting.body["pending"]
    decision = {"tool_call_id": "e2", "approved": True, "digest": pending["digest"]}
    bad = await serve(Command("approve", decision={**decision, "arguments": {"slot_id": 7}}))
    assert bad.status == 422
    assert bad.body["error"]["code"] == "invalid-arguments"
    edited = {**asked, "slot_id": f"{monday}T15:30"}
    reply = await serve(Command("approve", decision={**decision, "arguments": edited}))
    assert reply.status == 200, reply.body
    assert reply.body["status"] == "complete"
    assert reply.body["output"]["appointment"]["slot_id"] == f"{monday}T15:30"


async def test_the_offline_model_books_the_slot_the_desk_approved(
    tmp_path: Path, mcp_url: str, http: httpx.AsyncClient
) -> None:
    llm = clinic.make_llm({})  # LLM_PROVIDER unset: play_clinic
    store = sqlite_store(tmp_path / "clinic.db")
    common: dict[str, Any] = dict(
        llm=llm, store=store, settings={"MCP_URL": mcp_url}, http=http,
        clock=lambda: WEDNESDAY,
    )  # fmt: skip
    past = await run(clinic.AGENT, message="A check-up on 2026-06-01", session_id="s6", **common)
    assert past.output is not None
    assert past.output.message.startswith("2026-06-01 is in the past (today is 2026-06-10)")
    waiting = await run(
        clinic.AGENT, message="A cleaning on 2026-06-17, please", session_id="s7",
        session_name="ada-byron", **common,
    )  # fmt: skip
    (pending,) = waiting.pending
    assert pending.arguments == {"slot_id": "2026-06-17T09:00", "patient": "Ada Byron",
                                 "treatment": "cleaning"}  # fmt: skip
    edited = {**pending.arguments, "slot_id": "2026-06-17T14:00"}
    await approve(store, "s7", pending.tool_call_id, digest=pending.digest, approved=True,
                  arguments=edited)  # fmt: skip
    done = await run(clinic.AGENT, session_id="s7", **common)
    await store.close()
    assert done.output is not None
    assert done.output.message == "You are booked for 2026-06-17T14:00 with Dr. Okafor."
    assert done.output.appointment is not None
    assert done.output.appointment.treatment == "cleaning"


def test_the_offline_model_looks_before_booking_again_after_a_lost_result() -> None:
    call = ToolCall("c1", "book_slot", {})
    lost = ToolDurabilityError("book_slot", "c1").to_content()
    system = Message.system("You are talking to Ada Lovelace; book in that name.")
    turn = [system, Message.user("on 2026-06-15"), Message.assistant("", [call]),
            Message.tool_result(call, lost)]  # fmt: skip
    (look,) = clinic.play_clinic(turn, []).tool_calls
    assert (look.name, look.arguments) == ("list_bookings", {"patient": "Ada Lovelace"})
    asks = clinic.play_clinic([system, Message.user("hello")], []).tool_calls[0]
    assert asks.name == "final_result"
    assert "Which day suits you?" in asks.arguments["message"]


def test_the_caller_comes_from_the_session_name() -> None:
    assert clinic.caller("ada-lovelace") == "Ada Lovelace"
    assert clinic.caller(None) == "a caller"
