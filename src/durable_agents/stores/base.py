"""The store protocol and the session summary every backend returns."""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from ..messages import Message


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A stored session's summary row (no messages). Times are Unix milliseconds.

    `name` is what the session was created under (`run(session_name=)`, the
    Worker's URL name; the id for a session stored before names were), kept
    from its first write on. `input_tokens` / `output_tokens` total the usage
    of its stored messages, kept by the appends themselves.
    """

    id: str
    agent_name: str | None
    state: str
    message_count: int
    created_at: int
    updated_at: int
    name: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The session as `GET /sessions` lists it (times as ISO 8601 UTC, to the ms).
        `state` is what it waits for: "idle", "awaiting_llm", "awaiting_tool_results",
        or "stopped" (a turn whose resumes kept crashing was ended by the kit)."""
        return {
            "name": self.name,
            "session_id": self.id,
            "agent": self.agent_name,
            "message_count": self.message_count,
            "state": self.state,
            "created_at": _iso_time(self.created_at),
            "updated_at": _iso_time(self.updated_at),
            "usage": {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens},
        }


def _iso_time(unix_ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(unix_ms / 1000, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class SessionPage:
    """One page of `list_sessions`: the sessions, newest created first, and the
    cursor of the next page (None on the last one)."""

    sessions: list[SessionInfo]
    next_cursor: str | None


ApprovalEventName = Literal["requested", "approved", "denied", "claimed"]


@dataclass(frozen=True, slots=True)
class ApprovalChange:
    """One approval event an append records (see `durable_agents.approvals`).

    `requested` (with write #1 of the step that made the call) stores the
    call's `digest`; `approved` / `denied` land only if the call was requested
    with that same digest and not decided yet; `claimed` (written just before
    an approved call runs) lands only once, and only for an approved call.
    A change whose condition fails fails its whole append with
    `SessionConflictError`, nothing written.

    `arguments` (an `approved` event only): the arguments the approver edited
    the call to, which it runs with instead of the model's; `arguments_digest`
    is their own digest (`approval_digest` of the call with them).
    """

    tool_call_id: str
    event: ApprovalEventName
    digest: str
    tool_name: str = ""
    reason: str | None = None
    arguments: dict[str, Any] | None = None
    arguments_digest: str | None = None


@dataclass(frozen=True, slots=True)
class ApprovalEvent:
    """A stored approval event, as `load_approvals` returns it. Times are Unix ms."""

    tool_call_id: str
    event: ApprovalEventName
    tool_name: str
    digest: str
    reason: str | None
    created_at: int
    arguments: dict[str, Any] | None = None  # an approval's edited arguments
    arguments_digest: str | None = None


@dataclass(frozen=True, slots=True)
class Schedule:
    """A message to run as a turn of its session later (see `durable_agents.schedules`).
    Times are Unix milliseconds. Stored until its turn's first write, which removes
    it in the same transaction: a stored schedule has not run.

    A recurring one has a `rule` (JSON: `cron` and `timezone`, or `every_seconds`;
    `durable_agents.recurrence`) and `due_at` is its next occurrence: the first write of
    that occurrence's turn moves the row to the one after, in the same transaction."""

    schedule_id: str
    message: str
    due_at: int
    created_at: int = 0
    rule: str | None = None

    @property
    def request_key(self) -> str:
        """The key its turn's user message is stored with: a turn per schedule, once; a
        recurring schedule's names its current occurrence (`schedule:<id>@<due ms>`)."""
        occurrence = "" if self.rule is None else f"@{self.due_at}"
        return f"schedule:{self.schedule_id}{occurrence}"

    def to_dict(self) -> dict[str, Any]:
        """As answers show it: `at` (a one-off's time, a recurring one's next occurrence,
        also as `next_at`) and a recurring one's rule fields."""
        shown = {
            "schedule_id": self.schedule_id,
            "message": self.message,
            "at": _iso_time(self.due_at),
            "created_at": _iso_time(self.created_at),
        }
        if self.rule is not None:
            try:
                fields = json.loads(self.rule)
            except ValueError:
                fields = None
            rule = fields if isinstance(fields, dict) else {"rule": self.rule}
            shown.update(next_at=shown["at"], **rule)
        return shown


@dataclass(frozen=True, slots=True)
class Lease:
    """What an append does to the run lease `owner` holds on its session: renew
    it for `ttl_ms` from now, or, with `release`, give it up (the turn's last
    write). In the append's own transaction, so it costs no extra write."""

    owner: str
    ttl_ms: int
    release: bool = False


@dataclass(frozen=True, slots=True)
class LeaseHolder:
    """Who holds a session's run lease, until when (Unix milliseconds)."""

    owner: str
    expires_at: int


@runtime_checkable
class Store(Protocol):
    """What `run()` needs from a store. Implement it to add a backend; run the
    conformance suite (`durable_agents.testing.conformance`) against it."""

    @property
    def durable(self) -> bool:
        """Whether a committed append survives the process dying."""
        ...

    async def load_messages(
        self, session_id: str, *, start: int = 0, limit: int | None = None
    ) -> list[Message]:
        """The session's messages in order, from position `start` on, at most `limit`
        of them (None: all); `[]` for a session never written."""
        ...

    async def load_context(self, session_id: str) -> tuple[int, list[Message]]:
        """What a turn needs, however long the history: the messages from where the
        latest summary's tail begins (its `summary_of`; 0 without a summary) on, and
        that position. One read; `(0, [])` for a session never written."""
        ...

    async def find_request(self, session_id: str, request_key: str) -> tuple[int, str] | None:
        """(position, content) of the user message stored with `request_key`, or None."""
        ...

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
        """Append all of `messages` at positions `expected_seq...`, or nothing.

        Creates the session on its first write, under `session_name` (default:
        its id; a later append's name is ignored). Returns the new message
        count. The same write adds the messages' usage to the session's totals.
        With `lease`, the same transaction renews or releases that lease (a
        no-op if its owner no longer holds it). `approvals` are recorded in
        the same transaction, each only if its condition holds (see
        `ApprovalChange`); `schedules` are stored in it too. A user message with
        origin "scheduled" fires the schedule its `request_key` names
        (`Schedule.request_key`): the same write removes it, and fails
        (`SessionConflictError`) if it is gone (cancelled, or fired by another
        run; a recurring one's occurrence: moved on). A schedule in `schedules`
        with the id of the one fired replaces it (a recurring schedule's next
        occurrence). An append of approval changes or
        schedules alone (no messages) is not positional: `expected_seq` is
        returned unchanged.
        Raises `SessionConflictError` if the session does not hold exactly
        `expected_seq` messages and `MessageTooLargeError` for a row over the
        limit (nothing landed), `StoreError` if the store fails (nothing landed,
        unless its message says the outcome is unknown, as after a network
        error to a remote database: reload before writing again).
        """
        ...

    async def acquire_lease(
        self, session_id: str, owner: str, ttl_ms: int, *, take_from: str | None = None
    ) -> LeaseHolder | None:
        """Take the session's run lease for `ttl_ms` in one conditional write.

        Taken (None returned) if nobody holds it, it expired, `owner` holds it
        already, or `take_from` holds it (a holder known to be dead). Else
        nothing is written and the holder is returned. The session need not
        exist; a lease creates no session.
        """
        ...

    async def load_approvals(self, session_id: str) -> list[ApprovalEvent]:
        """The session's approval events, in the order they were written."""
        ...

    async def release_lease(self, session_id: str, owner: str) -> None:
        """Give up the lease if `owner` holds it (else do nothing)."""
        ...

    async def get_session(self, session_id: str) -> SessionInfo | None:
        """The session's summary row (no messages), or None if it was never written."""
        ...

    async def list_sessions(
        self, *, limit: int = 50, cursor: str | None = None, agent_name: str | None = None
    ) -> SessionPage:
        """Up to `limit` sessions, newest created first (by created_at, then id,
        both descending), after `cursor` (a `next_cursor` of the page before).

        The keys never change, so paging while sessions are written lists every
        session that existed when paging began exactly once (sessions created
        meanwhile may or may not appear). Raises `InvalidCursorError` for a
        cursor the store did not hand out, `ConfigurationError` for `limit < 1`.
        With `agent_name`, only the sessions of that agent (`Agent.name`, as stored).
        """
        ...

    async def find_sessions(self, name: str) -> list[SessionInfo]:
        """The sessions stored under `name`, newest created first."""
        ...

    async def delete_session(self, session_id: str) -> bool:
        """Remove every row of the session (messages, approvals, schedules, lease,
        session row) in one atomic write; False if there was none. A run still writing
        to it then gets `SessionConflictError` (its append expects a position
        that no longer follows anything)."""
        ...

    async def delete_idle(self, before_ms: int, *, limit: int = 100) -> int:
        """Delete up to `limit` sessions last written before `before_ms` (Unix
        ms), oldest first, with all their rows, in one atomic write; returns
        how many. Call again while it returns `limit`."""
        ...

    async def load_schedules(self, session_id: str) -> list[Schedule]:
        """The session's schedules not yet fired, earliest due first."""
        ...

    async def delete_schedule(self, session_id: str, schedule_id: str) -> bool:
        """Cancel a schedule that has not fired; False if there is none by that id."""
        ...

    async def load_timeline(
        self, session_id: str, *, start: int = 0, limit: int | None = None
    ) -> list[tuple[int, Message]]:
        """The session's messages in order, each with when it was stored (Unix ms):
        from position `start` on, at most `limit` of them, as `load_messages` pages."""
        ...
