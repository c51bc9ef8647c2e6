"""A store in this process's memory: fast, shared by every run in the process, lost on exit."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import SessionConflictError, StoreError
from ..limits import MAX_ROW_BYTES
from ..messages import Message
from ._appends import append_rows, fired_schedules
from ._limits import check_limit
from ._paging import decode_cursor, page_of
from ._rows import encode_arguments, session_state, usage_totals
from .base import (
    ApprovalChange,
    ApprovalEvent,
    Lease,
    LeaseHolder,
    Schedule,
    SessionInfo,
    SessionPage,
)


@dataclass
class _Session:
    agent_name: str | None
    created_at: int
    updated_at: int
    name: str
    messages: list[Message] = field(default_factory=list)
    stored_at: list[int] = field(default_factory=list)  # each message's created_at
    input_tokens: int = 0
    output_tokens: int = 0
    answered: set[str] = field(default_factory=set)  # tool_call_ids with a stored result
    request_keys: set[str] = field(default_factory=set)


class MemoryStore:
    """Sessions in a dict. Not durable: use it for tests and stateless runs.

    It keeps the same contract as the durable stores (ordered append-only
    history, conditional atomic appends, the same row size limit), so code
    tested against it behaves the same on SQLite or D1.
    """

    durable = False

    def __init__(
        self, *, clock: Callable[[], float] = time.time, max_row_bytes: int = MAX_ROW_BYTES
    ) -> None:
        self._sessions: dict[str, _Session] = {}
        self._leases: dict[str, LeaseHolder] = {}
        self._approvals: dict[str, list[ApprovalEvent]] = {}
        self._schedules: dict[str, dict[str, Schedule]] = {}
        self._clock = clock
        self._max_row_bytes = max_row_bytes

    async def load_messages(
        self, session_id: str, *, start: int = 0, limit: int | None = None
    ) -> list[Message]:
        session = self._sessions.get(session_id)
        if session is None:
            return []
        start = max(start, 0)
        end = None if limit is None else start + max(limit, 0)
        return list(session.messages[start:end])

    async def load_context(self, session_id: str) -> tuple[int, list[Message]]:
        session = self._sessions.get(session_id)
        messages = session.messages if session else []
        summaries = (m.summary_of for m in reversed(messages) if m.summary_of is not None)
        start = next(summaries, 0)
        return start, list(messages[start:])

    async def find_request(self, session_id: str, request_key: str) -> tuple[int, str] | None:
        session = self._sessions.get(session_id)
        for position, message in enumerate(session.messages if session else []):
            if message.role == "user" and message.request_key == request_key:
                return position, message.content
        return None

    async def append_messages_atomic(
        self,
        session_id: str,
        expected_seq: int,
        messages: Sequence[Message],
        *,
        agent_name: str | None = None,
        lease: Lease | None = None,
        approvals: Sequence[ApprovalChange] = (),
        session_name: str | None = None,
        schedules: Sequence[Schedule] = (),
    ) -> int:
        now = int(self._clock() * 1000)
        # Built for their checks only (empty, position, size), as the SQL stores do.
        append_rows(
            session_id, expected_seq, messages, now, self._max_row_bytes, approvals, schedules
        )
        session = self._sessions.get(session_id)
        stored = len(session.messages) if session else 0
        if messages and stored != expected_seq:
            raise SessionConflictError(session_id, expected_seq, f"{stored} messages are stored")
        # checked, not yet kept
        events = self._approval_events(session_id, approvals, now) if approvals else []
        _check_unique(session_id, expected_seq, session, messages)
        fired = self._fired_schedules(session_id, expected_seq, messages, schedules)
        # Every check passed: keep it all.
        for schedule_id in fired:
            del self._schedules[session_id][schedule_id]
        for schedule in schedules:
            self._schedules.setdefault(session_id, {})[schedule.schedule_id] = schedule
        if events:
            self._approvals.setdefault(session_id, []).extend(events)
        self._renew_or_release(session_id, lease, now)
        if not messages:
            return expected_seq
        if session is None:
            name = session_id if session_name is None else session_name
            session = self._sessions[session_id] = _Session(agent_name, now, now, name)
        _keep_messages(session, messages, now, agent_name)
        return len(session.messages)

    def _fired_schedules(
        self,
        session_id: str,
        expected_seq: int,
        messages: Sequence[Message],
        schedules: Sequence[Schedule],
    ) -> list[str]:
        """The ids of the stored schedules whose turns `messages` start, checked as the SQL
        schema checks them (each must be stored, a recurring one with that occurrence due;
        a new schedule's id must not be, unless it replaces one fired)."""
        keys = fired_schedules(messages)
        if not keys and not schedules:
            return []  # (a step's appends: nothing to look up)
        stored = self._schedules.get(session_id, {})
        by_key = {s.request_key: schedule_id for schedule_id, s in stored.items()}
        if any(key not in by_key for key in keys):
            raise SessionConflictError(
                session_id, expected_seq, "the schedule was cancelled or has fired already"
            )
        fired = [by_key[key] for key in keys]
        if any(s.schedule_id in stored and s.schedule_id not in fired for s in schedules):
            raise StoreError(f"session {session_id!r} has that schedule id already")
        return fired

    def _approval_events(
        self, session_id: str, changes: Sequence[ApprovalChange], now: int
    ) -> list[ApprovalEvent]:
        """The events of `changes`, each checked against what is stored (and the ones
        before it) as the SQL schema checks them; nothing is kept if one fails."""
        known = list(self._approvals.get(session_id, ()))
        for change in changes:

            def has(event: str, call_id: str = change.tool_call_id) -> ApprovalEvent | None:
                return next(
                    (e for e in known if e.tool_call_id == call_id and e.event == event), None
                )

            depends = {"requested": None, "claimed": "approved"}.get(change.event, "requested")
            basis = has(depends) if depends else None
            decided = has("approved") or has("denied")
            broken = (
                has(change.event) is not None
                or (change.event in ("approved", "denied") and decided is not None)
                or (depends is not None and (basis is None or basis.digest != change.digest))
            )
            if broken:
                raise SessionConflictError(
                    session_id, -1, f"approval {change.event} of {change.tool_call_id} refused"
                )
            name = basis.tool_name if basis is not None else change.tool_name
            known.append(
                ApprovalEvent(
                    change.tool_call_id,
                    change.event,
                    name,
                    change.digest,
                    change.reason,
                    now,
                    _stored_copy(change.arguments),
                    change.arguments_digest,
                )
            )
        return known[len(self._approvals.get(session_id, ())) :]

    def _renew_or_release(self, session_id: str, lease: Lease | None, now: int) -> None:
        held = self._leases.get(session_id)
        if lease is not None and held is not None and held.owner == lease.owner:
            if lease.release:
                del self._leases[session_id]
            else:
                self._leases[session_id] = LeaseHolder(lease.owner, now + lease.ttl_ms)

    async def load_approvals(self, session_id: str) -> list[ApprovalEvent]:
        return list(self._approvals.get(session_id, ()))

    async def acquire_lease(
        self, session_id: str, owner: str, ttl_ms: int, *, take_from: str | None = None
    ) -> LeaseHolder | None:
        now = int(self._clock() * 1000)
        held = self._leases.get(session_id)
        if held is None or held.owner in (owner, take_from) or held.expires_at <= now:
            self._leases[session_id] = LeaseHolder(owner, now + ttl_ms)
            return None
        return held

    async def release_lease(self, session_id: str, owner: str) -> None:
        held = self._leases.get(session_id)
        if held is not None and held.owner == owner:
            del self._leases[session_id]

    async def get_session(self, session_id: str) -> SessionInfo | None:
        session = self._sessions.get(session_id)
        return self._info(session_id, session) if session else None

    async def list_sessions(
        self, *, limit: int = 50, cursor: str | None = None, agent_name: str | None = None
    ) -> SessionPage:
        check_limit(limit)
        after = decode_cursor(cursor)
        infos = [
            self._info(sid, s) for sid, s in self._sessions.items() if (s.created_at, sid) < after
        ]
        if agent_name is not None:
            infos = [info for info in infos if info.agent_name == agent_name]
        infos.sort(key=lambda info: (info.created_at, info.id), reverse=True)
        return SessionPage(*page_of(infos[: limit + 1], limit))

    async def find_sessions(self, name: str) -> list[SessionInfo]:
        infos = [self._info(sid, s) for sid, s in self._sessions.items() if s.name == name]
        return sorted(infos, key=lambda info: (info.created_at, info.id), reverse=True)

    async def load_schedules(self, session_id: str) -> list[Schedule]:
        schedules = self._schedules.get(session_id, {}).values()
        return sorted(schedules, key=lambda s: (s.due_at, s.schedule_id))

    async def delete_schedule(self, session_id: str, schedule_id: str) -> bool:
        return self._schedules.get(session_id, {}).pop(schedule_id, None) is not None

    async def delete_session(self, session_id: str) -> bool:
        self._leases.pop(session_id, None)
        self._schedules.pop(session_id, None)
        self._approvals.pop(session_id, None)
        return self._sessions.pop(session_id, None) is not None

    async def delete_idle(self, before_ms: int, *, limit: int = 100) -> int:
        check_limit(limit)
        idle = sorted(
            (s.updated_at, sid) for sid, s in self._sessions.items() if s.updated_at < before_ms
        )[:limit]
        for _, session_id in idle:
            await self.delete_session(session_id)
        return len(idle)

    async def load_timeline(
        self, session_id: str, *, start: int = 0, limit: int | None = None
    ) -> list[tuple[int, Message]]:
        session = self._sessions.get(session_id)
        if session is None:
            return []
        start = max(start, 0)
        end = None if limit is None else start + max(limit, 0)
        entries = zip(session.stored_at[start:end], session.messages[start:end], strict=True)
        return list(entries)

    @staticmethod
    def _info(session_id: str, session: _Session) -> SessionInfo:
        return SessionInfo(
            id=session_id,
            agent_name=session.agent_name,
            state=session_state(session.messages[-1]),
            message_count=len(session.messages),
            created_at=session.created_at,
            updated_at=session.updated_at,
            name=session.name,
            input_tokens=session.input_tokens,
            output_tokens=session.output_tokens,
        )


def _stored_copy(arguments: dict[str, Any] | None) -> dict[str, Any] | None:
    """The arguments as a SQL store gives them back (a JSON round trip): the caller's
    dict, changed later, does not change what is stored."""
    text = encode_arguments(arguments)
    return None if text is None else dict(json.loads(text))


def memory_store(
    *, clock: Callable[[], float] = time.time, max_row_bytes: int = MAX_ROW_BYTES
) -> MemoryStore:
    """An in-process, non-durable store (tests, stateless runs). See `MemoryStore`."""
    return MemoryStore(clock=clock, max_row_bytes=max_row_bytes)


def _check_unique(
    session_id: str, expected_seq: int, session: _Session | None, messages: Sequence[Message]
) -> None:
    """SessionConflictError for what the SQL schema's two unique indexes refuse: a second
    result for a tool call, a second turn for a request key."""
    for taken, new, what in (
        (session.answered if session else _NONE,
         [m.tool_call_id for m in messages if m.role == "tool"],
         "a tool call already has a result"),
        (session.request_keys if session else _NONE,
         [m.request_key for m in messages if m.request_key is not None],
         "a request key already started a turn"),
    ):  # fmt: skip
        if new and (not taken.isdisjoint(new) or len(set(new)) < len(new)):
            raise SessionConflictError(session_id, expected_seq, what)


_NONE: frozenset[str] = frozenset()  # the keys of a session not stored yet


def _keep_messages(
    session: _Session, messages: Sequence[Message], now: int, agent_name: str | None
) -> None:
    """Append checked `messages` to `session`, with their keys, times and usage."""
    session.answered.update([m.tool_call_id for m in messages if m.tool_call_id])
    session.request_keys.update([m.request_key for m in messages if m.request_key])
    session.messages.extend(messages)
    session.stored_at.extend([now] * len(messages))
    input_tokens, output_tokens = usage_totals(messages)
    session.input_tokens += input_tokens
    session.output_tokens += output_tokens
    session.updated_at = now
    session.agent_name = agent_name or session.agent_name
