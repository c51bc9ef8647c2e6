"""A session object's one alarm: turns that finish by themselves, and scheduled turns.

A Durable Object is reset by every deploy, by eviction and by crashes; a turn it
was running then stops halfway. So each turn leaves a mark in the object's own
storage when it starts (`TURN_KEY`: how many times it was resumed, by which
instance, when to check it) and arms the object's alarm for that check; the
turn's end clears the mark. The alarm ends up in `on_alarm`:

    a turn runs in this instance        -> check again later (it ends by itself)
    a client's turn another instance    -> resume it, as POST /resume would
      left, or a mark past its check       (origin "self-resumed"; the wait doubles
                                            after each self-resume that crashed)
    MAX_SELF_RESUMES resumes crashed    -> stop it (`run.stop_turn`): the history
                                            and the listing ("stopped") say so
    schedules due (the session's store) -> each runs its message as a turn, once
                                           (a recurring one's occurrence moves it on)

then arms the alarm for what comes next (a mark's check, the earliest schedule),
or deletes it. The first request a new instance serves looks for a client's turn
the instance before it left, and sets the alarm for now: a turn cut short by a
deploy goes on as soon as anyone talks to its object, or within
`SELF_RESUME_SECONDS` (a setting, default 30) otherwise. A client following
/events reconnects (Last-Event-ID) and follows the resumed turn to its end.

Every turn goes through the object's lock (`LiveSession`), so the alarm never
runs a second copy of a turn that a client's POST /resume runs, or the reverse.
At most once holds as for any resume: a lost unsafe call becomes a
`tool-durability-error` the model sees, a lost safe one is run again.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from .._json import loads
from ..errors import ConfigurationError
from ..run import stop_reason
from ..stores.base import Store
from .live import LiveSession

TURN_KEY = "durable-agents:turn"
DEFAULT_SELF_RESUME_SECONDS = 30.0
MAX_SELF_RESUMES = 3
# A due schedule that cannot run yet (calls wait for a person's decision): tried again then.
BLOCKED_RETRY_SECONDS = 60.0


class ObjectAlarm:
    """The object's alarm and its turn mark, in `storage` (the object's `ctx.storage`:
    `get`/`put`/`delete` of a key, `setAlarm`/`deleteAlarm`), or in what `storage_of()`
    returns each time: a Durable Object's storage is read from its `ctx` per request,
    since one held from another request's handler is refused by workerd ("Cannot perform
    I/O on behalf of a different request"). `instance` tells this
    instance of the object from the one before a reset (default: drawn now, when the
    object is built). `key`: where the mark is kept (one per object)."""

    def __init__(
        self,
        storage: Any = None,
        instance: str | None = None,
        *,
        storage_of: Callable[[], Any] | None = None,
        clock: Callable[[], float] = time.time,
        watch_seconds: float = DEFAULT_SELF_RESUME_SECONDS,
        key: str = TURN_KEY,
    ) -> None:
        self._storage_of = storage_of or (lambda: storage)
        self.key = key
        self.instance = instance or uuid.uuid4().hex
        self.clock = clock
        self.watch_ms = int(watch_seconds * 1000)
        self.adopted = False  # looked for a mark of the instance before this one

    @property
    def storage(self) -> Any:
        return self._storage_of()

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    async def mark(self) -> dict[str, Any] | None:
        raw = await self.storage.get(self.key)
        if raw is None or not isinstance(raw, str):
            return None
        try:
            mark = loads(raw)
        except ValueError:
            return None
        return mark if isinstance(mark, dict) else None

    async def turn_started(self, origin: str | None) -> None:
        """Mark a turn as running and arm the alarm to check on it. A self-resume counts
        one more resume than the mark it found; any other turn starts from none. Best
        effort: a turn whose mark cannot be written runs all the same (unwatched)."""
        try:
            await self._mark_started(origin)
        except Exception as exc:
            print(f"durable-agents: the turn runs unwatched ({exc})", file=sys.stderr)

    async def _mark_started(self, origin: str | None) -> None:
        previous = await self.mark()
        resumes = int(previous.get("resumes", 0)) if previous else 0
        if previous and previous.get("continues"):
            if origin != "self-resumed":
                return  # a client's request while a deferred step waits: leave its mark
            # (going on with a deferred step is no resume of a crash: not counted)
        elif origin == "self-resumed":
            resumes += 1
        elif origin != "stopped":
            resumes = 0
        check_at = self.now_ms() + self.watch_ms * 2 ** min(resumes, 6)
        mark = {"resumes": resumes, "instance": self.instance, "check_at": check_at}
        await self.storage.put(self.key, json.dumps(mark))
        await self.storage.setAlarm(check_at)

    async def turn_ended(self, store: Store, session_id: str, *, keep_watch: bool) -> None:
        """Clear the mark (unless `keep_watch`: the turn failed for a cause that may pass,
        a store down, so the alarm tries it again) and arm for what comes next. Best
        effort: a mark left behind only makes the alarm find a finished turn."""
        try:
            mark = await self.mark()
            waiting = mark is not None and bool(mark.get("continues"))  # (a deferred step)
            if not keep_watch and not waiting:
                await self.storage.delete(self.key)
            await self.arm(store, session_id)
        except Exception as exc:
            print(f"durable-agents: the turn's mark was not cleared ({exc})", file=sys.stderr)

    async def turn_continues(self) -> None:
        """The turn stopped at its invocation's budget with calls deferred (run status
        "deferred"): mark it to go on at once, and set the alarm for now; the alarm is a
        fresh invocation, with a fresh budget."""
        try:
            mark = await self.mark() or {"resumes": 0}
            now = self.now_ms()
            mark.update(instance=self.instance, check_at=now, continues=True)
            await self.storage.put(self.key, json.dumps(mark))
            await self.storage.setAlarm(now)
        except Exception as exc:  # the mark of the turn's start stays: its check resumes it
            print(f"durable-agents: the deferred step waits for its check ({exc})", file=sys.stderr)

    async def arm(self, store: Store, session_id: str, *, not_before: int | None = None) -> None:
        """Set the alarm to the earliest of the mark's check and the first schedule (no
        earlier than `not_before` for schedules), or delete it when nothing waits."""
        times = []
        mark = await self.mark()
        if mark is not None:
            times.append(int(mark.get("check_at", 0)))
        schedules = await store.load_schedules(session_id)
        if schedules:
            times.append(max(schedules[0].due_at, not_before or 0))
        if times:
            await self.storage.setAlarm(max(min(times), 0))
        else:
            await self.storage.deleteAlarm()

    async def adopt(self) -> bool:
        """Once per instance: whether the instance before this one left a client's turn
        marked as running (never self-resumed: one that was waits its back-off). The
        object then sets its alarm for now (`turns.resume_left_turn`)."""
        if self.adopted:
            return False
        self.adopted = True
        try:
            mark = await self.mark()
            return not (mark is None or mark.get("instance") == self.instance or mark["resumes"])
        except Exception as exc:  # never in the way of the request: the alarm comes anyway
            print(f"durable-agents: could not check the turn mark: {exc}", file=sys.stderr)
            return False


def self_resume_seconds(env: Any) -> float:
    """The setting SELF_RESUME_SECONDS: how long a turn may go unfinished before its
    object checks on it (default 30)."""
    from ..llm.settings import setting

    raw = setting(env, "SELF_RESUME_SECONDS")
    if raw is None or str(raw).strip() == "":
        return DEFAULT_SELF_RESUME_SECONDS
    try:
        value = float(str(raw))
    except ValueError:
        value = -1.0
    if not 1 <= value <= 3600:
        raise ConfigurationError(f"SELF_RESUME_SECONDS must be 1 to 3600 seconds, got {raw!r}")
    return value


class TurnReply(Protocol):
    """What `on_alarm` reads of a turn's answer (`wire.Reply`)."""

    @property
    def status(self) -> int: ...

    @property
    def run_status(self) -> str | None: ...

    @property
    def error_code(self) -> str | None: ...


TurnRunner = Callable[[str, dict[str, Any]], Awaitable[TurnReply]]


async def on_alarm(
    alarm: ObjectAlarm,
    store: Store,
    session_id: str,
    live: LiveSession,
    run_turn: TurnRunner,
) -> None:
    """The object's alarm fired: resume or stop a turn left unfinished, fire due schedules,
    arm for what comes next. On a failure it sets the alarm to try again later, and
    raises only when it cannot (the platform then retries the alarm itself)."""
    now = alarm.now_ms()
    try:
        if live.current is not None:  # a turn of this instance runs: it ends by itself
            await alarm.storage.setAlarm(now + alarm.watch_ms)
            return
        mark = await alarm.mark()
        if mark is not None and _overdue(mark, alarm, now):
            resumes = int(mark.get("resumes", 0))
            if resumes >= MAX_SELF_RESUMES:
                await run_turn("stop", {"reason": stop_reason(resumes)})
            elif (await run_turn("resume", {})).run_status == "deferred":
                return  # this invocation's budget is spent: the next alarm goes on

        blocked = False
        for schedule in await store.load_schedules(session_id):
            if schedule.due_at > now:
                break
            reply = await run_turn(
                "message", {"message": schedule.message, "request_key": schedule.request_key}
            )
            if reply.run_status == "deferred":
                return  # the schedule's turn goes on in the next alarm; so do the others
            if _blocked(reply):
                blocked = True
                continue
            # Refused for good (a message over the agent's limit, a bug): dropped, so the
            # alarm does not fire it forever. (A recurring one's occurrence that another
            # run took, a conflict, leaves the rule be: it has moved on.)
            taken = schedule.rule is not None and reply.error_code == "session-conflict"
            refused = reply.status >= 400 and reply.run_status is None and not taken
            if refused and await store.delete_schedule(session_id, schedule.schedule_id):
                print(
                    f"durable-agents: schedule {schedule.schedule_id} of session "
                    f"{session_id} was dropped: {getattr(reply, 'body', None)}",
                    file=sys.stderr,
                )
        retry = now + int(BLOCKED_RETRY_SECONDS * 1000) if blocked else None
        await alarm.arm(store, session_id, not_before=retry)
    except Exception as exc:  # the store is down, or a bug: try again later, say why
        print(
            f"durable-agents: the alarm of session {session_id} failed ({type(exc).__name__}: "
            f"{exc}); it tries again in {alarm.watch_ms // 1000} s",
            file=sys.stderr,
        )
        try:
            await alarm.storage.setAlarm(alarm.now_ms() + alarm.watch_ms)
        except Exception:
            # Not even the alarm can be set (workerd refuses the object's storage to an
            # alarm that began while the isolate was still starting for another request:
            # "Cannot perform I/O on behalf of a different request"). Raise: the platform
            # runs a failed alarm again, with its own back-off.
            raise exc from None


def _overdue(mark: dict[str, Any], alarm: ObjectAlarm, now: int) -> bool:
    """Whether a marked turn is due its resume: its check time passed, or it is a client's
    turn (never resumed yet) that an instance before this one left, which goes on at once.
    A turn whose self-resume crashed waits its back-off."""
    if int(mark.get("check_at", 0)) <= now:
        return True
    return mark.get("instance") != alarm.instance and int(mark.get("resumes", 0)) == 0


def _blocked(reply: TurnReply) -> bool:
    """Whether a scheduled turn could not start yet (and should be tried again later)."""
    return reply.error_code in ("approval-pending", "session-busy", "store")
