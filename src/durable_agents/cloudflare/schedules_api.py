"""The schedule endpoints, both sides: the Worker checks a schedule (its time with its own
clock) and forwards it; the session's object stores, lists or cancels it and arms its
alarm for the earliest. The schedules themselves are `durable_agents.schedules`; the
guide is docs/contract.md#scheduled-turns.
"""

from __future__ import annotations

import uuid

from ..errors import ConfigurationError, ScheduleError
from ..schedules import new_schedule, room_left, when
from .bodies import ScheduleBody
from .commands import SCHEDULE_ID, ListSchedules, Schedule, ScheduleSpec, Unschedule
from .object_context import ObjectContext, handles
from .routing import Request
from .wire import Reply, error_for, error_reply, no_session

__all__ = [
    "cancel_schedule",
    "delete_schedule",
    "list_schedules",
    "make_schedule",
    "post_schedule",
]


# --- the Worker's side ---


async def post_schedule(request: Request) -> Reply:
    """POST .../schedules: the body, its time (or rule) checked with the Worker's clock."""
    body = await request.json_body(ScheduleBody, required=True)
    if isinstance(body, Reply):
        return body
    try:  # checked here with this clock; the object sets the time with its own
        when(int(request.now * 1000), **body.model_dump(exclude={"message"}))
    except ScheduleError as exc:
        return error_reply(422, exc.code, str(exc))
    return await request.forward(Schedule(schedule=ScheduleSpec(**body.model_dump())))


async def delete_schedule(request: Request) -> Reply:
    """DELETE .../schedules/{schedule_id}."""
    schedule_id = request.params["schedule_id"]
    if SCHEDULE_ID.fullmatch(schedule_id) is None:
        return error_reply(
            404, "schedule-not-found",
            f"session {request.name!r} has no schedule {schedule_id[:100]!r}",
        )  # fmt: skip
    return await request.forward(Unschedule(schedule_id=schedule_id))


# --- the object's side ---


@handles(ListSchedules)
async def list_schedules(command: ListSchedules, ctx: ObjectContext) -> Reply:
    """The session's schedules, earliest first."""
    found = await ctx.store.load_schedules(ctx.session_id)
    if not found and await ctx.store.get_session(ctx.session_id) is None:
        return no_session(ctx.session_id)
    return Reply(200, {"session_id": ctx.session_id, "schedules": [s.to_dict() for s in found]})


@handles(Unschedule)
async def cancel_schedule(command: Unschedule, ctx: ObjectContext) -> Reply:
    """Delete one schedule; the alarm is armed for the next."""
    if not await ctx.store.delete_schedule(ctx.session_id, command.schedule_id):
        return error_reply(
            404, "schedule-not-found",
            f"session {ctx.session_id} has no schedule {command.schedule_id!r} waiting (it ran "
            "already, was cancelled, or never was)",
        )  # fmt: skip
    if ctx.alarm is not None:
        await ctx.alarm.arm(ctx.store, ctx.session_id)
    return Reply(200, {"schedule_id": command.schedule_id, "deleted": True})


@handles(Schedule)
async def make_schedule(command: Schedule, ctx: ObjectContext) -> Reply:
    """Store a schedule at the object's own time (one atomic write), then arm the alarm."""
    store, session_id, alarm = ctx.store, ctx.session_id, ctx.alarm
    if alarm is None:
        return error_for(ConfigurationError("this session's object has no alarm to fire schedules"))
    info = await store.get_session(session_id)
    if info is None or info.message_count == 0:
        return no_session(session_id)
    try:
        (await room_left(store, session_id)).take()
    except ScheduleError as exc:
        return error_for(exc)  # 422 invalid-schedule
    spec = command.schedule
    try:
        made = new_schedule(
            spec.message,
            schedule_id=f"sch_{uuid.uuid4().hex}",
            now_ms=alarm.now_ms(),
            max_message_bytes=ctx.agent.max_message_bytes,
            **spec.model_dump(exclude={"message"}),
        )
    except ScheduleError as exc:  # (the Worker checked it with its clock; this is the object's)
        return error_for(exc)
    await store.append_messages_atomic(session_id, info.message_count, [], schedules=[made])
    await alarm.arm(store, session_id)
    return Reply(201, {"session_id": session_id, **made.to_dict()})
