"""The PostgreSQL store's connections: up to a number of them, opened when a call needs
one and kept for the next, in the event loop that opened them.

It runs no task of its own. psycopg-pool's pool does (maintenance workers that open
connections in the background), and a worker cancelled while it runs a task goes on
waiting for the next one: a loop that ends with that pool open, as `asyncio.run` ends
a program that did not close its store, then waits for it for ever (seen in one run in
six of the kit's tests). Here a connection is opened by the call that needs it, and a
call that fails or is cancelled mid-query closes its connection instead of keeping it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

__all__ = ["Connections"]


class Connections:
    """At most `size` connections to `dsn` in use at once (autocommit: each statement or
    explicit transaction commits itself); `close()` closes the idle ones, and the rest
    as their calls end."""

    def __init__(self, dsn: str, size: int) -> None:
        self.dsn = dsn
        self._idle: list[psycopg.AsyncConnection[Any]] = []
        self._slots = asyncio.Semaphore(size)
        self._closed = False

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection for one call: an idle one, or a new one."""
        async with self._slots:
            conn = self._take() or await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
            kept = False
            try:
                yield conn
                kept = not self._closed and _reusable(conn)
            finally:
                if kept:
                    self._idle.append(conn)
                else:
                    await conn.close()

    def _take(self) -> psycopg.AsyncConnection[Any] | None:
        while self._idle:
            conn = self._idle.pop()
            if _reusable(conn):
                return conn
        return None

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()

    def drop(self) -> None:
        """Close the idle connections without a loop (theirs has ended: a store used
        under a new loop, a second `asyncio.run`, opens new ones)."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.pgconn.finish()


def _reusable(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Open, and between transactions (not left mid-query by a failure)."""
    return (
        not conn.closed
        and not conn.broken
        and (conn.info.transaction_status == TransactionStatus.IDLE)
    )
