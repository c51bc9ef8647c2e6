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
    ) -> int:
        """Append all of `messages` at positions `expected_seq...`, or nothing.

        Creates the session on its first write. Returns the new message count.
        Raises `SessionConflictError` if the session does not hold exactly
        `expected_seq` messages and `MessageTooLargeError` for a row over the
        limit (nothing landed), `StoreError` if the store fails (nothing landed,
        unless its message says the outcome is unknown, as after a network
        error to a remote database: reload before writing again).
        """
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
