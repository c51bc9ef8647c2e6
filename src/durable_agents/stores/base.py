"""The store protocol and the session summary every backend returns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..messages import Message


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A stored session's summary row (no messages). Times are Unix milliseconds."""

    id: str
    agent_name: str | None
    state: str
    message_count: int
    created_at: int
    updated_at: int


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

    async def load_messages(self, session_id: str) -> list[Message]:
        """The session's messages in order; `[]` for a session never written."""
        ...

    async def append_messages_atomic(
        self,
        session_id: str,
        expected_seq: int,
        messages: Sequence[Message],
        *,
        agent_name: str | None = None,
        lease: Lease | None = None,
    ) -> int:
        """Append all of `messages` at positions `expected_seq...`, or nothing.

        Creates the session on its first write. Returns the new message count.
        With `lease`, the same transaction renews or releases that lease (a
        no-op if its owner no longer holds it).
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

    async def release_lease(self, session_id: str, owner: str) -> None:
        """Give up the lease if `owner` holds it (else do nothing)."""
        ...

    async def get_session(self, session_id: str) -> SessionInfo | None:
        """The session's summary row (no messages), or None if it was never written."""
        ...

    async def list_sessions(self, *, limit: int = 100, offset: int = 0) -> list[SessionInfo]:
        """Sessions, most recently updated first."""
        ...

    async def delete_session(self, session_id: str) -> bool:
        """Remove a session and its messages; False if there was none."""
        ...
