"""Where sessions live. One protocol, one backend per module.

- `memory_store()`: a dict in this process. Not durable: for tests and
  stateless runs only (a `session_id` with it raises
  `MemoryStoreNotDurableError`).
- `sqlite_store(path)`: a SQLite file, durable across crashes and shared by
  processes on one machine. The CPython choice.
- `postgres_store(dsn)`: a PostgreSQL database, shared by processes on several hosts
  (the `postgres` extra).
- `durable_agents.cloudflare.d1_store(env.DB)`: Cloudflare D1. The Workers choice.

Every store keeps a session as an append-only list of messages numbered from
0. Its one write path is `append_messages_atomic(session_id, expected_seq,
messages)`: all messages land or none do, and only if the session holds
exactly `expected_seq` messages when the write commits; otherwise it raises
`SessionConflictError`. That condition is what makes two concurrent runs of
one session safe.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import (
    ApprovalChange,
    ApprovalEvent,
    Lease,
    LeaseHolder,
    Schedule,
    SessionInfo,
    SessionPage,
    Store,
)

if TYPE_CHECKING:
    from .memory import MemoryStore, memory_store
    from .postgres import PostgresStore, postgres_store
    from .sqlite import SQLiteStore, sqlite_store


def __getattr__(name: str) -> Any:
    # The SQLite store loads on first use: a Worker imports this package (every
    # `import durable_agents` does) but never SQLite, and its bundle leaves it out.
    # The memory store too: a Worker keeps its sessions in D1 or its Durable Object.
    if name in ("SQLiteStore", "sqlite_store"):
        from . import sqlite

        return getattr(sqlite, name)
    if name in ("MemoryStore", "memory_store"):
        from . import memory

        return getattr(memory, name)
    if name in ("PostgresStore", "postgres_store"):  # psycopg itself loads on first use
        from . import postgres

        return getattr(postgres, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ApprovalChange",
    "ApprovalEvent",
    "Lease",
    "LeaseHolder",
    "MemoryStore",
    "PostgresStore",
    "SQLiteStore",
    "Schedule",
    "SessionInfo",
    "SessionPage",
    "Store",
    "memory_store",
    "postgres_store",
    "sqlite_store",
]
