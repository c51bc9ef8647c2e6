"""A dentist's front desk: finds, books and moves appointments in the clinic's booking
system, an MCP server.

An agent module (the protocol is in `durable_agents.cloudflare.agent_module`).
Try it offline (MCP_URL empty: its dev stub, below, is the booking system), or
against the example's server (`examples/clinic/mcp_server.py`, written with the
official MCP SDK):

    scripts/dev --agent examples/clinic/agent.py
    .venv/bin/python examples/clinic/mcp_server.py --port 8931 &
    MCP_URL=http://127.0.0.1:8931/mcp scripts/dev --agent examples/clinic/agent.py

- The booking system's tools come from the server, listed every turn
  (`MCPTools(url_setting="MCP_URL", approve_destructive=True)`): `find_slots`
  and `list_bookings` are read-only (sent again if a crash lost their result);
  `book_slot` and `cancel_booking` are destructive, so each call waits for a
  person's approval, who may correct the slot as they approve; `leave_message`
  is a side effect that needs no approval and is never sent twice.
- `check_date` (the agent's own, `safe_to_retry`) checks the day the caller
  asked for. A day in the past or a Sunday raises `ModelRetry`: the model is
  told to try again with another day.
- The instructions are made per turn (`instructions(ctx)`): today's date from
  the run's clock, and the caller from the session's name
  (`/sessions/ada-lovelace/...` is Ada Lovelace).
- The answer is typed (`output_type=FrontDeskReply`): what to tell the caller,
  and the appointment booked or moved, if any.

`make_llm`: offline (`LLM_PROVIDER` unset or `demo`) a `FunctionLLM`,
`play_clinic`, that reads the day from the message ("a check-up on
2026-06-15"), checks it, books the first free slot, and answers with what
was booked (the slot the desk approved), denied, or lost; with a provider
set, `llm_from_env`.
"""

from __future__ import annotations

import datetime
import json
import re
from typing import Any

import httpx
from pydantic import BaseModel, Field

from durable_agents import (
    LLM,
    Agent,
    LLMResponse,
    Message,
    ModelRetry,
    RunContext,
    ToolCall,
    ToolContext,
    ToolSpec,
    tool,
)
from durable_agents.llm import FunctionLLM, llm_from_env
from durable_agents.llm.settings import setting
from durable_agents.mcp import MCPTools, mcp_stub

CLINIC = "Bright Smile Dental"


class Day(BaseModel):
    date: str = Field(description="The day, YYYY-MM-DD", pattern=r"^\d{4}-\d{2}-\d{2}$")


class OpeningHours(BaseModel):
    date: str
    weekday: str
    opens: str
    closes: str


class Appointment(BaseModel):
    booking_id: str
    slot_id: str = Field(description="The day and time, e.g. 2026-06-15T10:30")
    dentist: str
    treatment: str


class FrontDeskReply(BaseModel):
    """What to tell the caller, and the appointment booked or moved in this turn, if any."""

    message: str = Field(description="The answer to the caller, in a few sentences")
    appointment: Appointment | None = None


@tool(safe_to_retry=True)
async def check_date(args: Day, ctx: ToolContext) -> OpeningHours:
    """Check a day the caller asked for, before looking for slots: the clinic's hours then."""
    try:
        day = datetime.date.fromisoformat(args.date)
    except ValueError:
        raise ModelRetry(f"{args.date} is not a date; give it as YYYY-MM-DD") from None
    today = ctx.now.date()  # by the run's clock
    if day < today:
        raise ModelRetry(
            f"{day} is in the past (today is {today}); ask for, or pick, a day from today on"
        )
    if day.weekday() == 6:
        raise ModelRetry(f"{day} is a Sunday, when the clinic is closed; pick another day")
    closes = "12:00" if day.weekday() == 5 else "17:00"
    return OpeningHours(date=args.date, weekday=f"{day:%A}", opens="09:00", closes=closes)


def caller(session_name: str | None) -> str:
    """The caller's name from the session's: "ada-lovelace" is "Ada Lovelace"."""
    return (session_name or "").replace("-", " ").replace("_", " ").strip().title() or "a caller"


def instructions(ctx: RunContext) -> str:
    """Made once per turn; a resumed turn is sent what was stored with its message."""
    today = ctx.now.date()
    return (
        f"You are the front desk of {CLINIC}, a dentist's clinic. Today is "
        f"{today:%A} {today.isoformat()}. You are talking to {caller(ctx.session_name)}; "
        "book in that name. To book: check the day with check_date, find a free slot "
        "with find_slots, then book it with book_slot (a person at the desk approves each "
        "booking and may change the slot: tell the caller the slot that was booked). "
        "If a booking's result is a tool-durability-error, it may have gone through: look "
        "with list_bookings before booking again. Answer with final_result."
    )


booking_system = MCPTools(url_setting="MCP_URL", name="clinic", approve_destructive=True)

AGENT = Agent(
    "clinic",
    instructions,
    [check_date],
    toolsets=[booking_system],
    output_type=FrontDeskReply,
    max_steps=10,
)


# --- offline: the booking system as a dev stub -------------------------------------
# What answers while MCP_URL is empty (scripts/dev, check_agent, scripts/check): an MCP
# server of these tools (`mcp_stub`), bookings in memory. The real one, with the official
# MCP SDK, is examples/clinic/mcp_server.py; these answer its tools alike, more simply.

_HOURS = {"09:00": "Dr. Okafor", "10:30": "Dr. Lee", "14:00": "Dr. Okafor", "15:30": "Dr. Lee"}
_booked: dict[str, dict[str, str]] = {}  # booking id -> booking


@tool(safe_to_retry=True)
def find_slots(date: str) -> dict[str, Any]:
    """The free appointment slots on a day (YYYY-MM-DD)."""
    taken = {b["slot_id"] for b in _booked.values() if b["status"] == "booked"}
    slots = {f"{date}T{time}": dentist for time, dentist in _HOURS.items()}
    free = [{"slot_id": s, "dentist": d} for s, d in slots.items() if s not in taken]
    return {"date": date, "free": free}


@tool(safe_to_retry=True)
def list_bookings(patient: str) -> dict[str, Any]:
    """A patient's current bookings."""
    mine = [b for b in _booked.values() if b["patient"] == patient and b["status"] == "booked"]
    return {"patient": patient, "bookings": mine}


@tool
def book_slot(slot_id: str, patient: str, treatment: str) -> dict[str, str]:
    """Book a free slot for a patient; a booking the patient has already is moved to it."""
    dentist = _HOURS.get(slot_id.partition("T")[2])
    if dentist is None:
        raise ValueError(f"there is no slot {slot_id!r}; find_slots lists the free ones")
    for booking in list(_booked.values()):
        if booking["status"] == "booked" and booking["slot_id"] == slot_id:
            if booking["patient"] != patient:
                raise ValueError(f"the slot {slot_id} is taken; find_slots lists the free ones")
            return booking  # the patient's own: booked already
        if booking["status"] == "booked" and booking["patient"] == patient:
            booking["status"] = "cancelled"  # moved
    booking_id = f"bk_{len(_booked) + 1}"
    booking = {"booking_id": booking_id, "slot_id": slot_id, "dentist": dentist}
    _booked[booking_id] = {**booking, "patient": patient, "treatment": treatment,
                           "status": "booked"}  # fmt: skip
    return _booked[booking_id]


@tool
def cancel_booking(booking_id: str) -> dict[str, str]:
    """Cancel a booking; its slot becomes free."""
    if booking_id not in _booked:
        raise ValueError(f"there is no booking {booking_id!r}")
    _booked[booking_id]["status"] = "cancelled"
    return _booked[booking_id]


@tool
def leave_message(patient: str, text: str) -> str:
    """Leave a message for the front desk to call the patient back."""
    return f"message left for the front desk about {patient}"


DESTRUCTIVE = {"readOnlyHint": False, "destructiveHint": True}
DEV_STUBS = {
    "MCP_URL": mcp_stub(
        find_slots, list_bookings, book_slot, cancel_booking, leave_message, name="clinic",
        annotations={"book_slot": DESTRUCTIVE, "cancel_booking": DESTRUCTIVE,
                     "leave_message": {"readOnlyHint": False, "destructiveHint": False}},
    )
}  # fmt: skip
# check_agent's arguments where TestLLM's would only be refused (a day far ahead, a slot
# of it, a booking the check makes): tests/test_agent.py runs the template's check.
CHECK_AGENT = {
    "arguments": {
        "check_date": {"date": "2099-06-16"},
        "find_slots": {"date": "2099-06-16"},
        "book_slot": {"slot_id": "2099-06-16T09:00", "patient": "Ada", "treatment": "check-up"},
        "cancel_booking": {"booking_id": "bk_1"},
    }
}


def make_deps(env: Any, http: httpx.AsyncClient) -> None:
    """No deps: MCP_URL is read by `booking_system` itself, from the run's settings; the
    Worker passes it, and the kit's client over `fetch`."""
    return None


def make_llm(env: Any) -> LLM:
    """Offline (LLM_PROVIDER unset or demo): the scripted front desk. Else `llm_from_env`."""
    provider = setting(env, "LLM_PROVIDER")
    offline = provider is None and setting(env, "LLM_API_KEY") is None
    if offline or str(provider).strip().lower() == "demo":
        return FunctionLLM(play_clinic)
    return llm_from_env(env)


# --- the offline model -------------------------------------------------------------

_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
_CALLER = re.compile(r"You are talking to (.+?); book in that name")
_TREATMENTS = ("cleaning", "filling", "check-up")


def play_clinic(messages: list[Message], tools: list[ToolSpec]) -> LLMResponse:
    """The front desk's next move in the current turn, read from the conversation alone.

    Asked for a day ("a check-up on 2026-06-15"), it checks the day, finds the
    free slots, asks to book the first one (the desk approves it, or moves it),
    then answers with `final_result`. A day `check_date` sends back, a denied or
    failed booking, or one whose result was lost (it looks with `list_bookings`
    instead of booking again) ends the turn with a message saying so.
    """
    start = max((i for i, m in enumerate(messages) if m.role == "user"), default=0)
    turn = messages[start:]
    ask = turn[0].content if turn and turn[0].role == "user" else ""
    found = _CALLER.search(messages[0].content) if messages else None
    patient = found.group(1) if found else "a caller"
    day = _DATE.search(ask)
    treatment = next((t for t in _TREATMENTS if t in ask.lower()), "check-up")
    results = {m.tool_name: _parse(m.content) for m in turn if m.role == "tool"}
    call_id = f"demo_{len(messages)}"

    def call(name: str, **arguments: Any) -> LLMResponse:
        return LLMResponse(tool_calls=[ToolCall(call_id, name, arguments)])

    def answer(message: str, booking: dict[str, Any] | None = None) -> LLMResponse:
        keys = ("booking_id", "slot_id", "dentist", "treatment")
        appointment = {k: booking[k] for k in keys} if booking else None
        return call("final_result", message=message, appointment=appointment)

    if "list_bookings" in results:
        booked = results["list_bookings"].get("bookings") or []
        if booked:
            return answer(f"You are booked for {booked[0]['slot_id']}.", booked[0])
        return answer("The booking did not go through. Shall I try again?")
    if "book_slot" in results:
        booking = results["book_slot"]
        kind = booking.get("kind")
        if kind == "tool-durability-error":  # it may have gone through: look, do not rebook
            return call("list_bookings", patient=patient)
        if kind == "tool-denied":
            return answer("The front desk could not confirm that slot: nothing was booked.")
        if "error" in booking:
            return answer(f"I could not book it: {booking['error']}")
        booking = booking.get("result", booking)  # approved with edited arguments: says so
        when, dentist = booking["slot_id"], booking["dentist"]
        return answer(f"You are booked for {when} with {dentist}.", booking)
    if "find_slots" in results:
        free = results["find_slots"].get("free") or []
        if not free:
            return answer("There is no free slot that day. Which other day suits you?")
        return call("book_slot", slot_id=free[0]["slot_id"], patient=patient, treatment=treatment)
    if "check_date" in results:
        checked = results["check_date"]
        if "error" in checked:
            return answer(f"{checked['error']}. Which day suits you?")
        return call("find_slots", date=checked["date"])
    if day is not None:
        return call("check_date", date=day.group(0))
    return answer("Which day suits you? Say it as YYYY-MM-DD, e.g. 'a check-up on 2026-06-15'.")


def _parse(content: str) -> dict[str, Any]:
    # Tool results are JSON the kit wrote (bounded in depth), or plain text.
    try:
        data = json.loads(content)
    except (ValueError, RecursionError):
        return {"text": content}
    return data if isinstance(data, dict) else {"value": data}
