"""Recurring schedules' rules: a cron expression in a time zone, or a fixed interval.

A recurring schedule is one stored row (`Schedule.rule` set) whose `due_at` is its
next occurrence. Firing it stores the occurrence's user message under the key
`schedule:<id>@<due ms>` and, in the same atomic write, moves the row to the rule's
first occurrence strictly after max(now, that due): computed from the rule, never
from when a turn ended (no drift), and occurrences missed while nothing ran collapse
into the one being fired (a day of downtime is one catch-up turn, not 96). The
schema lets the occurrence's message land only while the row still has that due
time, so a second firing of it (another worker, a replay) stores nothing.

Cron expressions are parsed by `cronsim` (pure Python, runs in Pyodide); zones come
from the standard library's `zoneinfo` (in a Worker from the `tzdata` package, since
Pyodide has no system zone database). Guide: docs/contract.md#recurring-schedules.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
from typing import Any

from .errors import ScheduleError
from .stores.base import Schedule

# The shortest interval: a turn a minute at most, as cron's own granularity.
MIN_EVERY_SECONDS = 60
# The longest interval, and how far ahead a rule's next occurrence may be: as a
# one-off schedule's bound (`schedules.MAX_DELAY_SECONDS`).
MAX_EVERY_SECONDS = 400 * 86400
_NICKNAMES = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
_OCCURRENCE = re.compile(r"schedule:(.+)@(\d{1,16})")


@dataclasses.dataclass(frozen=True, slots=True)
class Rule:
    """When a recurring schedule's occurrences are: `cron` in `timezone` (an IANA
    name), or every `every_seconds` from its first occurrence. Build one with
    `parse_rule`, which checks it."""

    cron: str | None = None
    timezone: str | None = None
    every_seconds: int | None = None

    def to_text(self) -> str:
        """The rule as its schedule row stores it (`Schedule.rule`, JSON)."""
        fields = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        return json.dumps(fields, separators=(",", ":"))

    @classmethod
    def from_text(cls, text: str) -> Rule:
        """The rule a stored row holds (see `to_text`); ScheduleError if it is not one."""
        try:
            fields = json.loads(text)
            return parse_rule(**fields) if isinstance(fields, dict) else parse_rule()
        except (TypeError, ValueError):
            raise ScheduleError(
                f"a stored schedule has a rule this kit cannot read: {text!r}"
            ) from None

    def next_after(self, after_ms: int, due_ms: int) -> int:
        """The first occurrence strictly after `after_ms` (Unix ms), of the rule whose
        current occurrence is `due_ms` (an interval's occurrences are `due_ms` plus
        whole intervals)."""
        if self.every_seconds is not None:
            step = self.every_seconds * 1000
            return due_ms + step * (max(after_ms - due_ms, 0) // step + 1)
        return _next_cron(self, after_ms)


def parse_rule(cron: Any = None, timezone: Any = None, every_seconds: Any = None) -> Rule:
    """A checked Rule: exactly one of `cron` (five fields, or @daily and its kin) with an
    optional `timezone` (default UTC), or `every_seconds` (an integer, at least
    MIN_EVERY_SECONDS). ScheduleError says what is wrong."""
    if (cron is None) == (every_seconds is None):
        raise ScheduleError("a recurring schedule needs exactly one of cron and every_seconds")
    if every_seconds is not None:
        if timezone is not None:
            raise ScheduleError("timezone goes with cron; every_seconds needs none")
        if isinstance(every_seconds, bool) or not isinstance(every_seconds, int):
            raise ScheduleError(f"every_seconds must be a whole number, got {every_seconds!r}")
        if not MIN_EVERY_SECONDS <= every_seconds <= MAX_EVERY_SECONDS:
            raise ScheduleError(
                f"every_seconds must be {MIN_EVERY_SECONDS} to {MAX_EVERY_SECONDS:,} "
                f"(a minute to 400 days), got {every_seconds}"
            )
        return Rule(every_seconds=every_seconds)
    if not isinstance(cron, str) or not 0 < len(cron) <= 100:
        raise ScheduleError("cron must be a cron expression such as '0 9 * * 1-5'")
    expression = " ".join(cron.split())
    if len(expression.split()) != 5 and expression.lower() not in _NICKNAMES:
        raise ScheduleError(
            f"cron must have five fields (minute hour day month weekday), such as "
            f"'0 9 * * 1-5', or be one of {', '.join(_NICKNAMES)}; got {cron!r}"
        )
    rule = Rule(cron=expression, timezone=_zone_name(timezone))
    _next_cron(rule, 0)  # parses it: a bad field is refused now, not when it is due
    return rule


def _zone_name(timezone: Any) -> str:
    if timezone is None:
        return "UTC"
    if not isinstance(timezone, str) or not 0 < len(timezone) <= 64:
        raise ScheduleError("timezone must be an IANA time zone name such as 'Europe/Berlin'")
    _zone(timezone)
    return timezone


def _zone(name: str) -> datetime.tzinfo:
    if name == "UTC":  # the default needs no zone database (Pyodide has none)
        return datetime.UTC
    import zoneinfo  # (at call time: in a Worker it reads the tzdata package's files)

    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        if not _has_zones():
            raise ScheduleError(
                f"time zone {name!r} cannot be read here: there is no time zone database "
                "(a Worker needs the tzdata package, `scripts/add-package tzdata`); "
                "UTC needs none"
            ) from None
        raise ScheduleError(
            f"unknown time zone {name!r}: give an IANA name such as 'Europe/Berlin' or 'UTC'"
        ) from None


def _has_zones() -> bool:
    """Whether there is a zone database here at all (a Worker without tzdata has none)."""
    import zoneinfo

    try:
        zoneinfo.ZoneInfo("Etc/UTC")
    except zoneinfo.ZoneInfoNotFoundError:
        return False
    return True


def _next_cron(rule: Rule, after_ms: int) -> int:
    from cronsim import CronSim, CronSimError  # (a Worker loads it only for cron rules)

    zone = _zone(rule.timezone or "UTC")
    try:
        start = datetime.datetime.fromtimestamp(after_ms // 1000, zone)  # whole seconds
        moment = next(CronSim(rule.cron or "", start))
    except CronSimError as exc:
        raise ScheduleError(f"cron {rule.cron!r} is not a valid expression: {exc}") from None
    except (StopIteration, ValueError, OverflowError, OSError):
        raise ScheduleError(f"cron {rule.cron!r} has no next occurrence") from None
    return int(moment.timestamp()) * 1000


def first_due(rule: Rule, now_ms: int, start_ms: int | None = None) -> int:
    """A new rule's first occurrence: `start_ms` for an interval given one (then every
    interval from it), else the rule's first after `now_ms`. ScheduleError if that is
    more than MAX_EVERY_SECONDS ahead."""
    if start_ms is not None and rule.every_seconds is None:
        raise ScheduleError("a cron rule's occurrences come from its expression: give no at")
    due = start_ms if start_ms is not None else rule.next_after(now_ms, now_ms)
    if due > now_ms + MAX_EVERY_SECONDS * 1000:
        raise ScheduleError("the rule's first occurrence is more than 400 days ahead")
    return max(due, 0)


def occurrence_key(schedule_id: str, due_ms: int) -> str:
    """The request key of a recurring schedule's occurrence due at `due_ms`."""
    return f"schedule:{schedule_id}@{due_ms}"


def occurrence_of(request_key: str | None) -> tuple[str, int] | None:
    """(schedule id, due ms) of an occurrence's request key; None for any other key."""
    found = _OCCURRENCE.fullmatch(request_key or "")
    return None if found is None else (found[1], int(found[2]))


def advanced(schedule: Schedule, now_ms: int) -> Schedule:
    """The row of a recurring `schedule` once its current occurrence fires at `now_ms`:
    due at the rule's first occurrence strictly after max(now, its due)."""
    assert schedule.rule is not None
    rule = Rule.from_text(schedule.rule)
    due = rule.next_after(max(now_ms, schedule.due_at), schedule.due_at)
    return dataclasses.replace(schedule, due_at=due)
