"""One run's view of a stored session, and its one way to write: an atomic append.

`SessionLog` holds the session's messages from position `base` on (the latest
summary's tail, docs/limits.md) and the next position to write. Every write of a
run goes through `append`: one conditional append that renews the run's lease (or
releases it) in the same transaction, stamps the run's origin, carries what the
step's handlers scheduled (and, on the write that fires a recurring schedule's
occurrence, that schedule moved to its next one: `durable_agents.recurrence`), and
reports each stored message. Which writes a step
makes, and in which order, is the run loop's (`durable_agents.run`,
docs/contract.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from .. import recurrence
from ..events import EventReporter, MessageStored
from ..messages import Message, MessageOrigin
from ..stores.base import ApprovalChange, Lease, Schedule, Store
from .leases import RunLease

__all__ = ["SessionLog"]


class SessionLog:
    """The loaded history of one session from `base` on, and the appends that extend it."""

    def __init__(
        self,
        store: Store,
        agent_name: str,
        session_id: str,
        history: list[Message],
        *,
        base: int = 0,
        lease: RunLease | None = None,
        events: EventReporter | None = None,
        name: str | None = None,
        origin: MessageOrigin | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.agent_name = agent_name
        self.session_id = session_id
        self.history = history
        self.base = base
        self.lease = lease
        self.events = events or EventReporter(None)
        self.name = name  # stored by the append that creates the session
        self.origin = origin  # stamped on every message it stores
        self.clock = clock  # when a recurring schedule's occurrence fired (its next one)
        # What this step's handlers scheduled: stored with their results (write #2).
        self.scheduled: list[Schedule] = []
        self.tokens_used: int | None = None  # the session's, for max_session_tokens

    @property
    def position(self) -> int:
        """The position the next append writes at."""
        return self.base + len(self.history)

    def start_at(self, cut: int) -> None:
        """Forget the history before position `cut` (a summary stored there covers it)."""
        self.history = self.history[cut - self.base :]
        self.base = cut

    async def append(
        self,
        messages: list[Message],
        *,
        hold: float = 0.0,
        release: bool = False,
        approvals: Sequence[ApprovalChange] = (),
    ) -> None:
        """One atomic append, renewing the run's lease (or releasing it) in the same write."""
        lease = None
        if self.lease is not None:
            lease = Lease(self.lease.owner, self.lease.ttl_ms + int(hold * 1000), release)
        position = self.position
        if self.origin is not None:
            messages = [m if m.origin else replace(m, origin=self.origin) for m in messages]
        self.scheduled += await self.next_occurrences(messages)
        await self.store.append_messages_atomic(
            self.session_id,
            position,
            messages,
            agent_name=self.agent_name,
            lease=lease,
            approvals=approvals,
            session_name=self.name,
            # only when there are some: a store written before schedules still works
            **({"schedules": self.scheduled} if self.scheduled else {}),
        )
        self.scheduled = []
        self.history.extend(messages)
        if self.tokens_used is not None:
            self.tokens_used += sum(m.usage.total_tokens for m in messages if m.usage)
        if self.lease is not None and release:
            self.lease.released = True
        if self.events.watched:  # (no event built for no one)
            for offset, stored in enumerate(messages):
                await self.events.emit(MessageStored(position + offset, stored))

    async def next_occurrences(self, messages: Sequence[Message]) -> list[Schedule]:
        """The recurring schedules `messages` fire an occurrence of, each moved to its next
        occurrence (stored by the same append, in place of the fired row). Read as stored
        now: if the row moved on or was deleted meanwhile, none, and the append is refused
        (the schema checks the occurrence is still due), so an occurrence runs once."""
        fired = [
            found
            for m in messages
            if m.origin == "scheduled" and m.role == "user"
            if (found := recurrence.occurrence_of(m.request_key)) is not None
        ]
        if not fired:
            return []
        now_ms = int(self.clock() * 1000)
        stored = await self.store.load_schedules(self.session_id)
        return [
            recurrence.advanced(s, now_ms)
            for s in stored
            if s.rule is not None and (s.schedule_id, s.due_at) in fired
        ]
