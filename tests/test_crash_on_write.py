"""`crash_on_write`: a crash point named by what the write stores, or counted.

The agent is a dentist's booking agent: a read (`find_slots`, safe to retry), a
booking a person approves (`book_slot`, declared first, so it is answered last), and
an SMS (`send_sms`, a keyed side effect). Every test counts the handlers' runs.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field
from tests.support.postgres_server import postgres_fixture  # noqa: F401 - fixture

from durable_agents import (
    Agent,
    ConfigurationError,
    ToolContext,
    ToolDurabilityError,
    approve,
    pending_approvals,
    run,
    tool,
)
from durable_agents.stores import Store, postgres_store, sqlite_store
from durable_agents.testing import SimulatedCrash, TestLLM, count_writes, crash_on_write

RAN: Counter[str] = Counter()


class Day(BaseModel):
    date: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")


class Booking(BaseModel):
    slot: str = Field(min_length=1)


class Sms(BaseModel):
    to: str = Field(pattern=r"^\+\d{8,15}$")


@tool(safe_to_retry=True)
async def find_slots(args: Day, ctx: ToolContext) -> list[str]:
    """Free slots on a day."""
    RAN["find_slots"] += 1
    return [f"{args.date}T09:00"]


@tool(requires_approval=True)
async def book_slot(args: Booking, ctx: ToolContext) -> str:
    """Book a slot, once a person approves."""
    RAN["book_slot"] += 1
    return "booked"


@tool
async def send_sms(args: Sms, ctx: ToolContext) -> str:
    """Text the patient."""
    RAN["send_sms"] += 1
    return "sent"


AGENT = Agent("dentist", "Book appointments.", [book_slot, find_slots, send_sms])


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    RAN.clear()
    if request.param == "postgres":
        backend: Any = postgres_store(request.getfixturevalue("postgres").fresh_dsn())
    else:
        backend = sqlite_store(tmp_path / "s.db")
    yield backend
    await backend.close()


async def turn(store: Store, session: str, message: str | None = "book me in") -> Any:
    return await run(AGENT, llm=TestLLM(), message=message, session_id=session, store=store)


async def approve_all(store: Store, session: str) -> None:
    for pending in await pending_approvals(store, session):
        await approve(store, session, pending.tool_call_id, digest=pending.digest, approved=True)


async def finish(store: Store, session: str) -> Any:
    """Go on as a caller would after a crash: resume, deciding what waits, until done."""
    for _ in range(5):
        result = await turn(store, session, None)
        if result.status != "awaiting_approval":
            return result
        await approve_all(store, session)
    raise AssertionError("the turn did not finish")


async def test_the_writes_of_a_turn_by_name(store: Store) -> None:
    counting = count_writes(store)
    assert (await turn(counting, "s")).status == "awaiting_approval"
    await approve_all(counting, "s")
    assert (await turn(counting, "s", None)).status == "complete"
    assert counting.writes == [
        "call of book_slot, find_slots, send_sms",
        "result of find_slots, send_sms",
        "decision on book_slot",
        "claim of book_slot",
        "result of book_slot",
        "final reply",
    ]
    assert counting.appends == 6


async def test_before_the_result_of_a_side_effect(store: Store) -> None:
    crashing = crash_on_write(store, before="result of send_sms")
    with pytest.raises(SimulatedCrash, match=r"before atomic append #2 \(result of send_sms\)"):
        await turn(crashing, "s")
    assert crashing.crashed
    assert RAN == {"find_slots": 1, "send_sms": 1}  # both ran; their results were lost
    result = await finish(store, "s")
    assert result.status == "complete"
    assert RAN == {"find_slots": 2, "send_sms": 1, "book_slot": 1}  # the read ran again
    lost = [e.tool_name for m in result.messages if (e := ToolDurabilityError.from_message(m))]
    assert lost == ["send_sms"]


async def test_after_the_call_of_the_gated_tool(store: Store) -> None:
    crashing = crash_on_write(store, after="call of book_slot")
    with pytest.raises(SimulatedCrash, match="after atomic append #1"):
        await turn(crashing, "s")
    assert RAN == {}  # stored, nothing ran
    assert (await finish(store, "s")).status == "complete"
    assert RAN == {"find_slots": 1, "book_slot": 1}  # the unsafe SMS is answered as lost


async def test_after_the_decision_and_before_the_claim(store: Store) -> None:
    assert (await turn(store, "s")).status == "awaiting_approval"
    deciding = crash_on_write(store, after="the decision on book_slot")
    with pytest.raises(SimulatedCrash, match=r"after atomic append #1 \(the decision on"):
        await approve_all(deciding, "s")
    assert await pending_approvals(store, "s") == []  # the decision landed

    claiming = crash_on_write(store, before="claim of book_slot")
    with pytest.raises(SimulatedCrash, match="before atomic append #1"):
        await turn(claiming, "s", None)
    assert RAN["book_slot"] == 0  # approved, never claimed: never started
    assert (await finish(store, "s")).status == "complete"
    assert RAN["book_slot"] == 1


async def test_before_the_final_reply(store: Store) -> None:
    await turn(store, "s")
    await approve_all(store, "s")
    crashing = crash_on_write(store, before="final reply")
    with pytest.raises(SimulatedCrash):
        await turn(crashing, "s", None)
    assert crashing.writes[-1] == "final reply"
    result = await finish(store, "s")
    assert result.status == "complete"
    assert RAN == {"find_slots": 1, "send_sms": 1, "book_slot": 1}


async def test_counting_still_works(store: Store) -> None:
    with pytest.raises(SimulatedCrash, match=r"before atomic append #2$"):
        await turn(crash_on_write(store, 2), "a")
    with pytest.raises(SimulatedCrash, match=r"after atomic append #2$"):
        await turn(crash_on_write(store, 2, when="after"), "b")
    assert RAN == {"find_slots": 2, "send_sms": 2}


async def test_a_write_the_turn_never_makes_fails_at_its_end(store: Store) -> None:
    crashing = crash_on_write(store, after="result of send_SMS")  # not the tool's name
    await turn(crashing, "s")  # awaiting approval: the turn is not over, no verdict yet
    await approve_all(crashing, "s")
    with pytest.raises(AssertionError) as failure:
        await turn(crashing, "s", None)
    text = str(failure.value)
    assert "crash_on_write(..., after='result of send_SMS'): the turn ended" in text
    assert "without ever making that write, so it never crashed" in text
    assert "#2 result of find_slots, send_sms" in text  # what it saw, by the names it takes
    assert "#6 final reply" in text
    assert not crashing.crashed


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"n": "result of send_sms"}, "name a write with before= or after="),
        ({"before": "reslt of send_sms"}, "cannot tell which write 'reslt of send_sms' means"),
        ({"after": "result of"}, "'call of TOOL'"),
        ({}, "exactly one of"),
        ({"n": 2, "before": "final reply"}, "exactly one of"),
        ({"before": "final reply", "after": "final reply"}, "exactly one of"),
        ({"before": "final reply", "when": "after"}, "when= goes with n"),
        ({"n": 0}, "counts from 1"),
    ],
)
def test_what_it_cannot_read_is_refused_at_once(
    tmp_path: Path, arguments: dict[str, Any], error: str
) -> None:
    with pytest.raises(ConfigurationError, match=error):
        crash_on_write(sqlite_store(tmp_path / "s.db"), **arguments)
