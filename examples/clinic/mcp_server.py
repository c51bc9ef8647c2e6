"""The clinic's booking system: a small MCP server for examples/clinic.

    .venv/bin/python examples/clinic/mcp_server.py --port 8931
    # listening 8931        (its endpoint: http://127.0.0.1:8931/mcp)

Written with the official MCP Python SDK (`mcp` 2.x): streamable HTTP on
127.0.0.1, JSON answers, structured results. `--port 0` (the default) takes a
free port; the first line it prints names it. Its tools, and what their
annotations make of them in durable-agents (`MCPTools(approve_destructive=True)`):

    find_slots(date)                        readOnlyHint       a read: sent again if a
                                                               crash lost its result
    list_bookings(patient)                  readOnlyHint       a read
    book_slot(slot_id, patient, treatment)  destructiveHint    a side effect that waits
                                            (it moves the      for a person's approval
                                            patient's booking)
    cancel_booking(booking_id)              destructiveHint    the same
    leave_message(patient, text)            destructiveHint    a side effect, never sent
                                            false              twice; no approval

Bookings live in this process's memory. A `book_slot` call whose idempotency
key (durable-agents sends one in `_meta`) was seen before returns the booking
that key made instead of booking again.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import itertools
import socket
import sys
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel

IDEMPOTENCY_KEY = "io.github.durable-agents/idempotency-key"
READ_ONLY = ToolAnnotations(read_only_hint=True)
DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True)
ADDITIVE = ToolAnnotations(read_only_hint=False, destructive_hint=False)
# Monday to Friday; Saturday mornings; closed on Sundays.
WEEKDAY_SLOTS = {
    "09:00": "Dr. Okafor",
    "10:30": "Dr. Lee",
    "14:00": "Dr. Okafor",
    "15:30": "Dr. Lee",
}
SATURDAY_SLOTS = {"09:00": "Dr. Lee", "10:30": "Dr. Lee"}


class Slot(BaseModel):
    slot_id: str  # "2026-06-15T10:30": the day and the time
    dentist: str


class DaySlots(BaseModel):
    date: str
    free: list[Slot]


class Booking(BaseModel):
    booking_id: str
    slot_id: str
    dentist: str
    patient: str
    treatment: str
    status: str = "booked"  # or "cancelled"
    moved_from: str | None = None  # the slot of the patient's booking it replaced


class Bookings(BaseModel):
    patient: str
    bookings: list[Booking]


class Clinic:
    """The booking book: one booking per patient at a time, one patient per slot."""

    def __init__(self) -> None:
        self.bookings: dict[str, Booking] = {}
        self.by_key: dict[str, str] = {}  # idempotency key -> booking id
        self.messages: list[dict[str, str]] = []
        self.ids = itertools.count(1)

    def slots(self, day: datetime.date) -> dict[str, str]:
        times = {5: SATURDAY_SLOTS, 6: {}}.get(day.weekday(), WEEKDAY_SLOTS)
        return {f"{day.isoformat()}T{time}": dentist for time, dentist in times.items()}

    def taken(self) -> set[str]:
        return {b.slot_id for b in self.bookings.values() if b.status == "booked"}

    def free(self, day: datetime.date) -> list[Slot]:
        taken = self.taken()
        return [Slot(slot_id=s, dentist=d) for s, d in self.slots(day).items() if s not in taken]

    def book(self, slot_id: str, patient: str, treatment: str, key: str | None) -> Booking:
        if key and key in self.by_key:
            return self.bookings[self.by_key[key]]
        day = _day(slot_id.partition("T")[0])
        dentist = self.slots(day).get(slot_id)
        if dentist is None:
            raise ToolError(f"there is no slot {slot_id!r}; find_slots lists the free ones")
        if slot_id in self.taken():
            raise ToolError(f"the slot {slot_id} is taken; find_slots lists the free ones")
        moved_from = None
        for old in self.current(patient):
            old.status, moved_from = "cancelled", old.slot_id
        booking = Booking(
            booking_id=f"bk_{next(self.ids)}",
            slot_id=slot_id,
            dentist=dentist,
            patient=patient,
            treatment=treatment,
            moved_from=moved_from,
        )
        self.bookings[booking.booking_id] = booking
        if key:
            self.by_key[key] = booking.booking_id
        return booking

    def current(self, patient: str) -> list[Booking]:
        return [
            b
            for b in self.bookings.values()
            if b.status == "booked" and b.patient.casefold() == patient.casefold()
        ]


def _day(text: str) -> datetime.date:
    try:
        return datetime.date.fromisoformat(text)
    except ValueError:
        raise ToolError(f"{text!r} is not a date (YYYY-MM-DD)") from None


def _key(ctx: Context) -> str | None:
    meta: Any = ctx.request_context.meta or {}
    key = meta.get(IDEMPOTENCY_KEY)
    return key if isinstance(key, str) else None


def make_server(clinic: Clinic) -> MCPServer:
    server = MCPServer("clinic", log_level="WARNING")

    @server.tool(annotations=READ_ONLY)
    def find_slots(date: str) -> DaySlots:
        """The free appointment slots on a day (YYYY-MM-DD)."""
        return DaySlots(date=date, free=clinic.free(_day(date)))

    @server.tool(annotations=READ_ONLY)
    def list_bookings(patient: str) -> Bookings:
        """A patient's current bookings."""
        return Bookings(patient=patient, bookings=clinic.current(patient))

    @server.tool(annotations=DESTRUCTIVE)
    def book_slot(slot_id: str, patient: str, treatment: str, ctx: Context) -> Booking:
        """Book a free slot for a patient. A booking the patient has already is moved to it
        (the old slot is given up)."""
        return clinic.book(slot_id, patient, treatment, _key(ctx))

    @server.tool(annotations=DESTRUCTIVE)
    def cancel_booking(booking_id: str) -> Booking:
        """Cancel a booking; its slot becomes free."""
        booking = clinic.bookings.get(booking_id)
        if booking is None:
            raise ToolError(f"there is no booking {booking_id!r}")
        booking.status = "cancelled"
        return booking

    @server.tool(annotations=ADDITIVE, structured_output=False)
    def leave_message(patient: str, text: str) -> str:
        """Leave a message for the front desk to call the patient back."""
        clinic.messages.append({"patient": patient, "text": text})
        return f"message {len(clinic.messages)} left for the front desk"

    return server


async def serve(port: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    sock.setblocking(False)
    app = make_server(Clinic()).streamable_http_app(json_response=True)  # at /mcp
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
            return
        await asyncio.sleep(0.01)
    print(f"listening {sock.getsockname()[1]}", flush=True)
    await task


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    sys.exit(asyncio.run(serve(parser.parse_args().port)))
