"""A durable store in a SQLite file, for CPython.

One connection per store, used from one dedicated thread (`_call_thread`): sqlite3 calls
block (a durable commit waits for fsync), and running them off the event loop
keeps other tasks moving. Several processes may share the file: WAL lets
readers run beside a writer, and the busy timeout makes writers queue instead
of failing at once.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from ..errors import SessionConflictError, StoreError
from ..limits import MAX_ROW_BYTES
from ..messages import Message
from . import _appends, _paging, _rows, _schema, _statements
from ._call_thread import CallThread
from .base import (
    ApprovalChange,
    ApprovalEvent,
    Lease,
    LeaseHolder,
    Schedule,
    SessionInfo,
    SessionPage,
)

T = TypeVar("T")


class SQLiteStore:
    """Sessions in a SQLite file (or `":memory:"`, which is not durable).

    Each append is one `BEGIN IMMEDIATE` transaction committed with
    `synchronous=FULL`: when it returns, the rows survive a crash or power loss.
    Use it on CPython; on Workers use `d1_store`.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout_ms: int = 10_000,
        clock: Callable[[], float] = time.time,
        max_row_bytes: int = MAX_ROW_BYTES,
    ) -> None:
        self.path = str(path)
        self._busy_timeout_ms = busy_timeout_ms
        self._clock = clock
        self._max_row_bytes = max_row_bytes
        self._conn: sqlite3.Connection | None = None
        self._thread: CallThread | None = None

    @property
    def durable(self) -> bool:
        # "" is SQLite's private temporary database, deleted on close.
        path = self.path.strip()
        return bool(path) and path != ":memory:" and not path.startswith("file::memory:")

    # -- the Store protocol -------------------------------------------------

    async def load_messages(
        self, session_id: str, *, start: int = 0, limit: int | None = None
    ) -> list[Message]:
        params = _statements.page_params(session_id, start, limit)
        # Decoded in the store's thread too: a long history should not stall the loop.
        return await self._call(
            lambda c: _rows.row_messages(
                session_id, c.execute(_statements.SELECT_MESSAGES_FROM, params), start=params[1]
            ),
            session_id,
        )

    async def load_context(self, session_id: str) -> tuple[int, list[Message]]:
        return await self._call(
            lambda c: _rows.context_rows(
                session_id,
                c.execute(_statements.SELECT_CONTEXT, (session_id, session_id)).fetchall(),
            ),
            session_id,
        )

    async def find_request(self, session_id: str, request_key: str) -> tuple[int, str] | None:
        def find(c: sqlite3.Connection) -> tuple[int, str] | None:
            row = c.execute(_statements.FIND_REQUEST, (session_id, request_key)).fetchone()
            return None if row is None else (int(row[0]), str(row[1]))

        return await self._call(find, session_id)

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
        statements = _appends.append_statements(
            session_id, expected_seq, messages, int(self._clock() * 1000),
            agent_name=agent_name, lease=lease, approvals=approvals,
            max_row_bytes=self._max_row_bytes, session_name=session_name, schedules=schedules,
        )  # fmt: skip

        def write(conn: sqlite3.Connection) -> None:
            for sql, params in statements:
                conn.execute(sql, params)

        try:
            await self._call(lambda conn: _transaction(conn, lambda: write(conn)), session_id)
        except sqlite3.IntegrityError as exc:
            if _statements.is_conflict(str(exc)) or _statements.is_approval_conflict(str(exc)):
                raise SessionConflictError(session_id, expected_seq, str(exc)) from None
            raise StoreError(
                f"append to session {session_id!r} failed: {exc}", session_id=session_id
            ) from exc
        return expected_seq + len(messages)

    async def load_approvals(self, session_id: str) -> list[ApprovalEvent]:
        rows = await self._call(
            lambda c: c.execute(_statements.SELECT_APPROVALS, (session_id,)).fetchall(), session_id
        )
        return [_rows.row_approval_event(row, session_id) for row in rows]

    async def acquire_lease(
        self, session_id: str, owner: str, ttl_ms: int, *, take_from: str | None = None
    ) -> LeaseHolder | None:
        params = _statements.acquire_lease_params(
            session_id, owner, int(self._clock() * 1000), ttl_ms, take_from
        )

        def acquire(conn: sqlite3.Connection) -> LeaseHolder | None:
            if conn.execute(_statements.ACQUIRE_LEASE, params).rowcount == 1:
                return None
            row = conn.execute(_statements.SELECT_LEASE, (session_id,)).fetchone()
            # Released between the two statements: report it as expiring now.
            return LeaseHolder(*row) if row else LeaseHolder("(released)", params[3])

        return await self._call(acquire, session_id)

    async def release_lease(self, session_id: str, owner: str) -> None:
        await self._call(
            lambda c: c.execute(_statements.RELEASE_LEASE, (session_id, owner)), session_id
        )

    async def get_session(self, session_id: str) -> SessionInfo | None:
        row = await self._call(
            lambda c: c.execute(_statements.SELECT_SESSION, (session_id,)).fetchone(), session_id
        )
        return _rows.row_session_info(row) if row else None

    async def list_sessions(
        self, *, limit: int = 50, cursor: str | None = None, agent_name: str | None = None
    ) -> SessionPage:
        sql, params = _paging.list_statement(cursor, limit, agent_name)
        rows = await self._call(lambda c: c.execute(sql, params).fetchall())
        return SessionPage(*_paging.page_of([_rows.row_session_info(r) for r in rows], limit))

    async def find_sessions(self, name: str) -> list[SessionInfo]:
        rows = await self._call(lambda c: c.execute(_statements.FIND_SESSIONS, (name,)).fetchall())
        return [_rows.row_session_info(row) for row in rows]

    async def delete_session(self, session_id: str) -> bool:
        def delete(conn: sqlite3.Connection) -> bool:
            return _transaction(conn, lambda: _delete(conn, session_id))

        return await self._call(delete, session_id)

    async def delete_idle(self, before_ms: int, *, limit: int = 100) -> int:
        params = _statements.idle_params(before_ms, limit)

        def delete(conn: sqlite3.Connection) -> int:
            changes = [conn.execute(sql, params).rowcount for sql in _statements.DELETE_IDLE]
            return changes[-1]

        return await self._call(lambda conn: _transaction(conn, lambda: delete(conn)))

    async def load_schedules(self, session_id: str) -> list[Schedule]:
        rows = await self._call(
            lambda c: c.execute(_statements.SELECT_SCHEDULES, (session_id,)).fetchall(), session_id
        )
        return [_rows.row_schedule(row) for row in rows]

    async def delete_schedule(self, session_id: str, schedule_id: str) -> bool:
        params = (session_id, schedule_id)
        changed = await self._call(
            lambda c: _transaction(
                c, lambda: c.execute(_statements.DELETE_SCHEDULE, params).rowcount
            ),
            session_id,
        )
        return bool(changed)

    async def due_schedules(
        self, before_ms: int, *, limit: int = 100
    ) -> list[tuple[str, Schedule]]:
        """(session id, schedule) of up to `limit` schedules due before `before_ms`, of
        every session, earliest due first: what `durable-agents worker` fires."""
        params = _statements.idle_params(before_ms, limit)
        rows = await self._call(
            lambda c: c.execute(_statements.SELECT_DUE_SCHEDULES, params).fetchall()
        )
        return [(str(row[0]), _rows.row_schedule(row[1:])) for row in rows]

    async def expired_leases(
        self, *, limit: int = 100, host: str | None = None
    ) -> list[tuple[str, LeaseHolder]]:
        """(session id, holder) of up to `limit` run leases that expired, longest expired
        first: a run took the lease and never released it, so its turn did not finish
        (its process died). With `host`, also the unexpired leases of that host's
        processes (owners `host/pid/...`), after those: the caller checks which of
        their processes are gone (what `durable-agents worker` resumes)."""
        now_ms, bound = _statements.idle_params(int(self._clock() * 1000), limit)
        params: tuple[int | str, ...]
        if host is None:
            sql, params = _statements.SELECT_EXPIRED_LEASES, (now_ms, bound)
        else:
            prefix = f"{host}/"
            sql, params = (
                _statements.SELECT_EXPIRED_OR_HOST_LEASES,
                (now_ms, len(prefix), prefix, bound),
            )
        rows = await self._call(lambda c: c.execute(sql, params).fetchall())
        return [(str(row[0]), LeaseHolder(str(row[1]), int(row[2]))) for row in rows]

    async def load_timeline(
        self, session_id: str, *, start: int = 0, limit: int | None = None
    ) -> list[tuple[int, Message]]:
        params = _statements.page_params(session_id, start, limit)
        return await self._call(
            lambda c: _rows.timeline_rows(
                session_id, c.execute(_statements.SELECT_TIMELINE, params), start=params[1]
            ),
            session_id,
        )

    # -- lifecycle ----------------------------------------------------------

    async def close(self) -> None:
        """Close the connection and its thread. The store reopens on next use."""
        if self._thread is None:
            return
        thread, self._thread = self._thread, None
        try:
            await thread.call(self._close_connection, None)
        finally:
            thread.stop()

    async def __aenter__(self) -> SQLiteStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- internals ----------------------------------------------------------

    async def _call(
        self, fn: Callable[[sqlite3.Connection], T], session_id: str | None = None
    ) -> T:
        if self._thread is None:
            self._thread = CallThread("durable-agents-sqlite")
        try:
            return await self._thread.call(self._with_connection, fn)
        except sqlite3.IntegrityError:
            raise
        except sqlite3.Error as exc:
            raise StoreError(
                f"SQLite store at {self.path!r} failed: {exc}", session_id=session_id
            ) from exc

    def _with_connection(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn is None:
            self._conn = self._connect()
        return fn(self._conn)

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: transactions are explicit (see _transaction).
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_ms)}")
            if self.durable:
                conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = FULL")
            _transaction(conn, lambda: _migrate(conn))
        except BaseException:
            conn.close()
            raise
        return conn

    def _close_connection(self, _: None) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _transaction(conn: sqlite3.Connection, body: Callable[[], T]) -> T:
    # BEGIN IMMEDIATE takes the write lock up front, so a busy writer waits
    # (busy_timeout) instead of failing later on a lock upgrade.
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = body()
        conn.execute("COMMIT")
    except BaseException:
        # SQLite may have rolled back already (some errors end the transaction);
        # a transaction left open would lock every other writer out of the file.
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


def _migrate(conn: sqlite3.Connection) -> None:
    # In one BEGIN IMMEDIATE transaction: two processes opening an old file
    # queue here, and the second sees the columns the first added.
    columns = {
        table: {row[1] for row in conn.execute(_schema.table_info(table))}
        for table in _schema.altered_tables()
    }
    for statement in _schema.schema_plan(columns):
        conn.execute(statement)


def _delete(conn: sqlite3.Connection, session_id: str) -> bool:
    conn.execute(_statements.DELETE_MESSAGES, (session_id,))
    conn.execute(_statements.DELETE_LEASE, (session_id,))
    conn.execute(_statements.DELETE_APPROVALS, (session_id,))
    conn.execute(_statements.DELETE_SCHEDULES, (session_id,))
    return conn.execute(_statements.DELETE_SESSION, (session_id,)).rowcount > 0


def sqlite_store(
    path: str | Path,
    *,
    busy_timeout_ms: int = 10_000,
    clock: Callable[[], float] = time.time,
    max_row_bytes: int = MAX_ROW_BYTES,
) -> SQLiteStore:
    """A durable store in the SQLite file at `path` (created if missing).

    `":memory:"` gives a private in-memory database, which is not durable.
    """
    return SQLiteStore(
        path, busy_timeout_ms=busy_timeout_ms, clock=clock, max_row_bytes=max_row_bytes
    )
