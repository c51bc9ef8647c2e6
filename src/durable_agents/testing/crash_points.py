"""Crash points: a store wrapper whose chosen write raises `SimulatedCrash`.

A crash point is one atomic append (a write), named by what it stores
(`crash_on_write(store, after="call of book_slot")`) or counted
(`crash_on_write(store, 3)`). The names, and a crash test written with them:
docs/testing.md ("Offline models and crash points").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from ..errors import ConfigurationError
from ..messages import Message
from ..stores.base import (
    ApprovalChange,
    ApprovalEvent,
    Lease,
    LeaseHolder,
    Schedule,
    SessionInfo,
    SessionPage,
    Store,
)
from ._write_names import WriteKind, WriteName, write_description, write_names


class SimulatedCrash(BaseException):
    """The process 'died' here. A BaseException so nothing in between can catch it."""


class CrashingStore:
    """Wraps a store; the atomic append it is told of raises `SimulatedCrash`.

    Which one: the `crash_on`-th (from 1), or the first whose content `write`
    names (see `crash_on_write`). With `when="before"` (the default) nothing of
    that append lands; with `when="after"` it lands and then the crash happens,
    as when a process dies right after a commit returns. `crash_on=None` and no
    `write` never crashes (see `count_writes`). Every other method passes
    through (taking and releasing a run's lease are not appends: they are not
    counted). `appends` counts the calls made, `writes` names each
    ("call of lookup, post", "result of lookup, post", "final reply", ...) and
    `crashed` says whether the crash happened.

    A named write that a turn ends without making (its final reply lands
    first) fails the test then: `AssertionError`, listing the writes seen.
    """

    def __init__(
        self,
        store: Store,
        crash_on: int | None,
        when: Literal["before", "after"] = "before",
        *,
        write: str | None = None,
    ) -> None:
        if crash_on is not None and crash_on < 1:
            raise ConfigurationError("crash_on counts from 1")
        if crash_on is not None and write is not None:
            raise ConfigurationError("crash on a write by its number or by its name, not both")
        self.inner = store
        self.crash_on = crash_on
        self.when = when
        self.write = WriteName.parse(write) if write is not None else None
        self.appends = 0
        self.writes: list[str] = []
        self.crashed = False
        self._tool_of: dict[str, str] = {}  # call id -> tool name, for approval events

    @property
    def durable(self) -> bool:
        return self.inner.durable

    async def load_messages(
        self, session_id: str, *, start: int = 0, limit: int | None = None
    ) -> list[Message]:
        return await self.inner.load_messages(session_id, start=start, limit=limit)

    async def load_context(self, session_id: str) -> tuple[int, list[Message]]:
        return await self.inner.load_context(session_id)

    async def find_request(self, session_id: str, request_key: str) -> tuple[int, str] | None:
        return await self.inner.find_request(session_id, request_key)

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
        self.appends += 1
        names = await self._names(session_id, messages, approvals)
        self.writes.append(write_description(names, messages, approvals))
        crash = self._crashes_here(names)
        what = f"atomic append #{self.appends}" + (
            f" ({self.write.text})" if crash and self.write is not None else ""
        )
        if crash and self.when == "before":
            self.crashed = True
            raise SimulatedCrash(f"simulated crash before {what}")
        count = await self.inner.append_messages_atomic(
            session_id, expected_seq, messages, agent_name=agent_name, lease=lease,
            approvals=approvals, session_name=session_name, schedules=schedules,
        )  # fmt: skip
        if crash:
            self.crashed = True
            raise SimulatedCrash(f"simulated crash after {what}")
        self._refuse_an_uncrashed_end(names)
        return count

    def _crashes_here(self, names: Sequence[WriteKind]) -> bool:
        """Whether this append (the `appends`-th, matching `names`) is the crash point."""
        if self.crashed:
            return False
        named = self.write is not None and (self.write.kind, self.write.tool) in names
        return self.appends == self.crash_on or named

    def _refuse_an_uncrashed_end(self, names: Sequence[WriteKind]) -> None:
        """A turn's final reply stored while the named write never came: the test's mistake."""
        if self.write is None or self.crashed or ("final reply", None) not in names:
            return
        raise AssertionError(
            f"crash_on_write(..., {self.when}={self.write.text!r}): the turn ended (its "
            f"final reply was stored, write #{self.appends}) without ever making that "
            "write, so it never crashed. The writes it saw: "
            + "; ".join(f"#{n} {w}" for n, w in enumerate(self.writes, 1))
            + ". Check the tool's name, or wrap the store only for the turn that makes "
            "the write."
        )

    async def _names(
        self, session_id: str, messages: Sequence[Message], approvals: Sequence[ApprovalChange]
    ) -> list[WriteKind]:
        for m in messages:
            self._tool_of.update((c.id, c.name) for c in m.tool_calls)
        self._tool_of.update((a.tool_call_id, a.tool_name) for a in approvals if a.tool_name)
        unknown = {a.tool_call_id for a in approvals} - set(self._tool_of)
        if unknown:  # decided or claimed calls this wrapper has not seen stored
            for m in await self.inner.load_messages(session_id):
                self._tool_of.update((c.id, c.name) for c in m.tool_calls)
        return write_names(messages, approvals, self._tool_of)

    async def acquire_lease(
        self, session_id: str, owner: str, ttl_ms: int, *, take_from: str | None = None
    ) -> LeaseHolder | None:
        return await self.inner.acquire_lease(session_id, owner, ttl_ms, take_from=take_from)

    async def release_lease(self, session_id: str, owner: str) -> None:
        await self.inner.release_lease(session_id, owner)

    async def load_approvals(self, session_id: str) -> list[ApprovalEvent]:
        return await self.inner.load_approvals(session_id)

    async def load_schedules(self, session_id: str) -> list[Schedule]:
        return await self.inner.load_schedules(session_id)

    async def delete_schedule(self, session_id: str, schedule_id: str) -> bool:
        return await self.inner.delete_schedule(session_id, schedule_id)

    async def get_session(self, session_id: str) -> SessionInfo | None:
        return await self.inner.get_session(session_id)

    async def list_sessions(
        self, *, limit: int = 50, cursor: str | None = None, agent_name: str | None = None
    ) -> SessionPage:
        wanted = {} if agent_name is None else {"agent_name": agent_name}
        return await self.inner.list_sessions(limit=limit, cursor=cursor, **wanted)

    async def find_sessions(self, name: str) -> list[SessionInfo]:
        return await self.inner.find_sessions(name)

    async def delete_session(self, session_id: str) -> bool:
        return await self.inner.delete_session(session_id)

    async def delete_idle(self, before_ms: int, *, limit: int = 100) -> int:
        return await self.inner.delete_idle(before_ms, limit=limit)

    async def load_timeline(
        self, session_id: str, *, start: int = 0, limit: int | None = None
    ) -> list[tuple[int, Message]]:
        return await self.inner.load_timeline(session_id, start=start, limit=limit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def crash_on_write(
    store: Store,
    n: int | None = None,
    *,
    when: Literal["before", "after"] | None = None,
    before: str | None = None,
    after: str | None = None,
) -> CrashingStore:
    """`store`, except that one atomic append (a write) raises `SimulatedCrash`.

    Name the write by what it stores, and the side of it to die on:

        crash_on_write(store, before="result of send_sms")  # it ran; its result is lost
        crash_on_write(store, after="call of book_slot")     # stored; nothing ran yet
        crash_on_write(store, after="decision on book_slot") # approve() landed, then died
        crash_on_write(store, before="claim of book_slot")   # approved, never started
        crash_on_write(store, before="final reply")

    A name is "call of TOOL", "result of TOOL", "decision on TOOL", "claim of
    TOOL" or "final reply"; the first write that stores it is the one.
    `count_writes(store).writes` lists a run's writes by these names. If the
    turn ends without such a write, its final write raises `AssertionError`
    (listing the writes it saw) instead of the test passing uncrashed: wrap
    the store for the turn that makes the write.

    Or count: `crash_on_write(store, n)` crashes on the n-th append (from 1),
    `when="before"` (the default) or `"after"` it lands.
    """
    names = {"before": before, "after": after}
    named = {side: text for side, text in names.items() if text is not None}
    if isinstance(n, str):
        raise ConfigurationError(
            f"crash_on_write(store, {n!r}): name a write with before= or after=, e.g. "
            f"crash_on_write(store, before={n!r}); n counts appends"
        )
    if len(named) + (n is not None) != 1:
        raise ConfigurationError(
            "crash_on_write needs exactly one of: n (which append, from 1), before='<a "
            "write>' or after='<a write>'"
        )
    if named:
        if when is not None:
            raise ConfigurationError(
                "when= goes with n; with a named write, before= or after= says the side"
            )
        side, text = next(iter(named.items()))
        return CrashingStore(store, None, "before" if side == "before" else "after", write=text)
    return CrashingStore(store, n, when or "before")


def count_writes(store: Store) -> CrashingStore:
    """`store`, counting its atomic appends in `.appends` (one commit each) and naming
    them in `.writes` (the names `crash_on_write` takes); never crashes."""
    return CrashingStore(store, None)


def crash_after_tool_results(store: Store) -> CrashingStore:
    """Crash on the 2nd append: step 1's write #2, after its handlers ran."""
    return crash_on_write(store, 2)
