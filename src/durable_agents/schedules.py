"""Scheduled turns: a message a session runs as a turn later, once, or on a rhythm.

Three ways to make one, all stored in the session's store (`Store`, the
`agent_schedules` table):

    # a tool, durably: stored with its step's results (write #2), or not at all
    async def book(args: Booking, ctx: ToolContext) -> str:
        ctx.schedule(f"Send the reminder for booking {args.id}", at=args.day_before)

    # the Worker's API (an API token):
    POST /sessions/{name}/schedules  {"message": "...", "delay_seconds": 3600}

    # Python, on a stored session:
    await schedule(store, session_id, "Check the build", delay_seconds=600)

    # recurring, by each door: cron= (with timezone=, default UTC) or every_seconds=
    await schedule(store, session_id, "Digest", cron="0 9 * * 1-5", timezone="Europe/Berlin")

What fires them: the session's Durable Object (its alarm, set to the earliest
due schedule), or on CPython `durable-agents worker --db FILE`. Either runs
`fire(...)`: the schedule's message as a turn whose user message is stored with
the request key `schedule:<id>` and origin "scheduled". That first write also
removes the schedule, and lands only while the schedule is stored (a trigger
checks it), so a schedule runs at most once: a crash mid-turn leaves a turn
that resumes like any other; a cancelled schedule never runs. A recurring schedule
is one row with its rule: each occurrence fires as above under the key
`schedule:<id>@<due ms>`, and its first write moves the row to the next occurrence
instead of removing it (`durable_agents.recurrence`: once per occurrence, no drift,
missed occurrences run once).
"""

from __future__ import annotations

import datetime
import math
import time
import uuid
from collections.abc import Callable
from typing import Any

from . import recurrence
from ._json import repair_text
from .errors import ScheduleError, SessionNotFoundError
from .limits import MAX_BOUND_INT, MAX_ROW_BYTES
from .stores.base import Schedule, Store

# The furthest ahead a schedule may be: a year and a bit (a Durable Object's alarm
# takes any time; this bounds what a typo such as seconds-for-milliseconds makes).
MAX_DELAY_SECONDS = 400 * 86400
# A tool may schedule this many messages per call; the step's write carries them.
MAX_SCHEDULES_PER_CALL = 10
# And a session holds at most this many waiting schedules, whichever door adds them:
# `schedule()`, the Worker's API and a tool's `ctx.schedule` (see `ScheduleRoom`).
MAX_SCHEDULES_PER_SESSION = 100


def due_time(
    now_ms: int, *, delay_seconds: float | None = None, at: str | datetime.datetime | None = None
) -> int:
    """When a schedule is due (Unix ms): `delay_seconds` from `now_ms`, or `at` (an
    ISO 8601 string with a time zone, or an aware datetime). A time in the past is
    due at once; one more than MAX_DELAY_SECONDS ahead is a ScheduleError."""
    if (delay_seconds is None) == (at is None):
        raise ScheduleError("give exactly one of delay_seconds and at")
    if delay_seconds is not None:
        if isinstance(delay_seconds, bool) or not isinstance(delay_seconds, int | float):
            raise ScheduleError(f"delay_seconds must be a number, got {delay_seconds!r}")
        if isinstance(delay_seconds, int) and delay_seconds < 0:  # (any size: no isfinite)
            raise ScheduleError("delay_seconds must be 0 or more, got a negative number")
        if isinstance(delay_seconds, int) and delay_seconds > MAX_DELAY_SECONDS:
            # (before isfinite: an int past a double's range would be an OverflowError)
            raise ScheduleError(
                f"delay_seconds may be at most {MAX_DELAY_SECONDS:,} (400 days), got more"
            )
        if not math.isfinite(delay_seconds) or delay_seconds < 0:
            raise ScheduleError(f"delay_seconds must be 0 or more, got {delay_seconds!r}")
        if delay_seconds > MAX_DELAY_SECONDS:
            raise ScheduleError(
                f"delay_seconds may be at most {MAX_DELAY_SECONDS:,} (400 days), "
                f"got {delay_seconds!r}"
            )
        return now_ms + math.ceil(delay_seconds * 1000)
    moment = parse_time(at)
    due = math.floor(moment.timestamp() * 1000)
    if due > now_ms + MAX_DELAY_SECONDS * 1000:
        raise ScheduleError(f"at may be at most 400 days ahead, got {moment.isoformat()}")
    return max(due, 0)


def parse_time(value: Any) -> datetime.datetime:
    """An aware datetime from an ISO 8601 string with a time zone (or an aware datetime)."""
    if isinstance(value, datetime.datetime):
        moment = value
    elif isinstance(value, str) and 0 < len(value) <= 64:
        text = value.strip()
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        try:
            moment = datetime.datetime.fromisoformat(text)
        except ValueError:
            raise ScheduleError(
                f"at must be an ISO 8601 time with a time zone, such as "
                f"2027-01-31T09:00:00Z, got {value!r}"
            ) from None
    else:
        raise ScheduleError(f"at must be an ISO 8601 string, got {type(value).__name__}")
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ScheduleError(f"at needs a time zone (Z or +01:00): {value!r}")
    try:
        moment.timestamp()
    except (OverflowError, ValueError, OSError):
        raise ScheduleError(f"at is not a time a schedule can have: {value!r}") from None
    return moment


def new_schedule(
    message: str,
    *,
    schedule_id: str,
    now_ms: int,
    delay_seconds: float | None = None,
    at: str | datetime.datetime | None = None,
    cron: str | None = None,
    timezone: str | None = None,
    every_seconds: int | None = None,
    max_message_bytes: int = MAX_ROW_BYTES,
) -> Schedule:
    """A checked Schedule (not stored yet): its message as it will be stored (no lone
    surrogates) and no larger than `max_message_bytes` (the agent's limit, when known).
    With `cron` (and `timezone`) or `every_seconds`, a recurring one (see `when`)."""
    if not isinstance(message, str) or not message.strip():
        raise ScheduleError("a schedule needs a message (non-empty text)")
    message = repair_text(message)  # stored as UTF-8, like every other text
    if len(message.encode()) > max_message_bytes:
        raise ScheduleError(
            f"the schedule's message is over the agent's {max_message_bytes:,}-byte limit"
        )
    due, rule = when(
        now_ms, delay_seconds=delay_seconds, at=at, cron=cron, timezone=timezone,
        every_seconds=every_seconds,
    )  # fmt: skip
    if not 0 <= due <= MAX_BOUND_INT:
        raise ScheduleError("that time is outside what a store keeps")
    return Schedule(schedule_id, message, due, now_ms, rule)


def when(
    now_ms: int,
    *,
    delay_seconds: float | None = None,
    at: str | datetime.datetime | None = None,
    cron: str | None = None,
    timezone: str | None = None,
    every_seconds: int | None = None,
) -> tuple[int, str | None]:
    """A new schedule's first due time (Unix ms) and its rule as stored (None: once).
    Once: `delay_seconds` or `at` (`due_time`). Recurring: `cron` in `timezone` (default
    UTC), or `every_seconds` (at least 60), first due at `at` if given (intervals only),
    else the rule's first occurrence after now. ScheduleError says what is wrong."""
    if cron is None and every_seconds is None:
        if timezone is not None:
            raise ScheduleError("timezone goes with cron")
        return due_time(now_ms, delay_seconds=delay_seconds, at=at), None
    if delay_seconds is not None:
        raise ScheduleError(
            "delay_seconds is for a one-off schedule; a recurring one's first occurrence "
            "comes from its rule (or, for every_seconds, from at)"
        )
    rule = recurrence.parse_rule(cron=cron, timezone=timezone, every_seconds=every_seconds)
    start = None if at is None else due_time(now_ms, at=at)
    return recurrence.first_due(rule, now_ms, start), rule.to_text()


def full(session_id: str) -> ScheduleError:
    """The refusal of a schedule past MAX_SCHEDULES_PER_SESSION, at every door."""
    return ScheduleError(
        f"session {session_id} has {MAX_SCHEDULES_PER_SESSION} schedules waiting already "
        "(the most a session may hold); cancel one or wait for one to fire"
    )


class ScheduleRoom:
    """How many more schedules a session may hold, shared by a run's tool calls.

    Counted from what is stored when the run first runs a handler; each
    `ctx.schedule` takes a place, a handler that fails gives its places back
    (what it scheduled is not stored). So the calls of one step, run
    concurrently, are checked together with what is already stored."""

    def __init__(self, session_id: str, stored: int) -> None:
        self.session_id = session_id
        self.left = MAX_SCHEDULES_PER_SESSION - stored

    def take(self) -> None:
        if self.left <= 0:
            raise full(self.session_id)
        self.left -= 1


async def room_left(store: Store, session_id: str) -> ScheduleRoom:
    """The room for more schedules in the session, counted from what is stored now: every
    door (`schedule`, the Worker's API, a run's `ctx.schedule`) takes its places from it."""
    return ScheduleRoom(session_id, len(await store.load_schedules(session_id)))


class StepSchedules:
    """The schedules a step's handlers make, stored with the step's results.

    `ToolContext.schedule` adds to the call's own list; the run loop keeps a
    call's list only if its handler returned (a failed call schedules nothing:
    `discard`)."""

    def __init__(
        self,
        new_id: Callable[[], str],
        clock: Callable[[], float],
        max_message_bytes: int,
        room: ScheduleRoom,
    ) -> None:
        self.made: list[Schedule] = []
        self._new_id = new_id
        self._clock = clock
        self._max_message_bytes = max_message_bytes
        self._room = room

    def discard(self) -> None:
        """Forget what this call scheduled (its handler failed), giving the places back."""
        self._room.left += len(self.made)
        self.made = []

    def add(
        self,
        message: str,
        *,
        delay_seconds: float | None = None,
        at: str | datetime.datetime | None = None,
        cron: str | None = None,
        timezone: str | None = None,
        every_seconds: int | None = None,
    ) -> Schedule:
        if len(self.made) >= MAX_SCHEDULES_PER_CALL:
            raise ScheduleError(f"one tool call may schedule at most {MAX_SCHEDULES_PER_CALL}")
        made = new_schedule(
            message,
            schedule_id=f"sch_{self._new_id()}",
            now_ms=int(self._clock() * 1000),
            delay_seconds=delay_seconds,
            at=at,
            cron=cron,
            timezone=timezone,
            every_seconds=every_seconds,
            max_message_bytes=self._max_message_bytes,
        )
        self._room.take()
        self.made.append(made)
        return made


async def schedule(
    store: Store,
    session_id: str,
    message: str,
    *,
    delay_seconds: float | None = None,
    at: str | datetime.datetime | None = None,
    cron: str | None = None,
    timezone: str | None = None,
    every_seconds: int | None = None,
    new_id: Callable[[], str] | None = None,
    clock: Callable[[], float] | None = None,
    max_message_bytes: int = MAX_ROW_BYTES,
) -> Schedule:
    """Store a schedule for an existing session (one write); returns it. Pass the
    agent's `max_message_bytes` so its turn can take the message when it fires.
    Once (`delay_seconds` or `at`) or recurring (`cron` with `timezone`, or
    `every_seconds`, optionally from `at`): see `when`. A recurring schedule counts
    once against MAX_SCHEDULES_PER_SESSION.

    Raises ScheduleError for a bad time or message or a session holding
    MAX_SCHEDULES_PER_SESSION already, SessionNotFoundError for a session
    never written. Cancel it with `store.delete_schedule(session_id, schedule_id)`."""
    info = await store.get_session(session_id)
    if info is None or info.message_count == 0:
        raise SessionNotFoundError(session_id)
    (await room_left(store, session_id)).take()
    made = new_schedule(
        message,
        schedule_id=f"sch_{(new_id or (lambda: uuid.uuid4().hex))()}",
        now_ms=int((clock or time.time)() * 1000),
        delay_seconds=delay_seconds,
        at=at,
        cron=cron,
        timezone=timezone,
        every_seconds=every_seconds,
        max_message_bytes=max_message_bytes,
    )
    await store.append_messages_atomic(session_id, info.message_count, [], schedules=[made])
    return made


def fired_by(request_key: str | None) -> str | None:
    """Which schedule a scheduled turn's user message (its `request_key`) came from, as
    the timeline and `sessions show` mark it: `schedule sch_…`, and for a recurring
    schedule's occurrence also the time it was due. None for a key no schedule makes."""
    occurrence = recurrence.occurrence_of(request_key)
    if occurrence is not None:
        schedule_id, due_ms = occurrence
        due = Schedule(schedule_id, "", due_ms).to_dict()["at"]
        return f"recurring schedule {schedule_id}, occurrence due {due}"
    if request_key is not None and request_key.startswith("schedule:"):
        return f"schedule {request_key.removeprefix('schedule:')}"
    return None
