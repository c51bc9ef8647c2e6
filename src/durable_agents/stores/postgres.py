"""A durable store in PostgreSQL, for CPython processes on several hosts sharing one
database. Needs the `postgres` extra (`pip install durable-agents[postgres]`: psycopg 3;
its connections: `_pg_connections`); a Worker never imports it. Guide: docs/running-at-scale.md.

The same statements as the SQLite store (`_statements`, `_appends`) on the same schema
(`migrations/*.sql`), translated where the dialects differ (`_postgres_sql`). Each write
is one transaction in one round trip: a call of a server-side function made from its
statements (`_pg_writes`), prepared once per connection, so the server neither parses
nor plans them again. A write that has no such function goes as one query of several
statements, which PostgreSQL runs as one implicit transaction, its values bound
client-side (psycopg's `ClientCursor`, escaped by libpq). Measured per step at one
session (fsync off, to see the work): 1.27 ms by the functions, 1.74 ms as queries;
a psycopg pipeline of the statements, prepared, measured no faster than the query.

Why each write first takes a transaction-scoped advisory lock on its session: SQLite
runs one writer at a time (BEGIN IMMEDIATE), so the in-order and scheduled-once
triggers read a history no other transaction is changing. PostgreSQL runs writers side
by side, each trigger seeing only what was committed: an append could pass its in-order
check while a delete of that session is under way, and land after it, stranded. The
lock makes the writes of one session queue, as on SQLite, and leaves other sessions'
writes running side by side; the constraints and triggers then decide as they do there.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError, SessionConflictError, StoreError
from ..limits import MAX_ROW_BYTES
from ..messages import Message
from . import _appends, _paging, _postgres_sql, _rows, _schema, _statements
from ._limits import Statement
from ._pg_writes import WriteFunctions
from .base import (
    ApprovalChange,
    ApprovalEvent,
    Lease,
    LeaseHolder,
    Schedule,
    SessionInfo,
    SessionPage,
)

if TYPE_CHECKING:
    import psycopg

    from ._pg_connections import Connections

# Serialises the writes of one session (see the module docstring); a hash collision of
# two sessions only makes their writes queue too. The migration takes a lock of its own.
_LOCK_SESSION = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
_LOCK_MIGRATION = "SELECT pg_advisory_xact_lock(-4871002537)"
# delete_session's, as the SQLite store's: the session row last (its count is the answer).
_DELETE_SESSION_ROWS = (
    _statements.DELETE_MESSAGES,
    _statements.DELETE_LEASE,
    _statements.DELETE_APPROVALS,
    _statements.DELETE_SCHEDULES,
    _statements.DELETE_SESSION,
)
# delete_idle, once its sessions' locks are held: which of them are idle still.
_STILL_IDLE = "SELECT id FROM agent_sessions WHERE id = ANY(%s) AND updated_at < %s"
_DELETE_BY_IDS: tuple[str, ...] = (
    "DELETE FROM agent_messages WHERE session_id = ANY(%s)",
    "DELETE FROM agent_leases WHERE session_id = ANY(%s)",
    "DELETE FROM agent_approvals WHERE session_id = ANY(%s)",
    "DELETE FROM agent_schedules WHERE session_id = ANY(%s)",
    "DELETE FROM agent_sessions WHERE id = ANY(%s)",
)


@functools.cache
def _sql(shared: str) -> str:
    return _postgres_sql.statement(shared)


class PostgresStore:
    """Sessions in a PostgreSQL database, shared by every process and host that opens it.

    Use it on CPython when more than one machine serves the agents; on one machine
    `sqlite_store` is simpler and faster, on Workers use `d1_store`. Each write is one
    transaction, committed as the server is configured (`synchronous_commit=on`, its
    default: durable once it returns). Connections come from a pool of up to
    `max_connections`, opened on first use, in the event loop that first uses it.
    """

    def __init__(
        self,
        dsn: str,
        *,
        max_connections: int = 10,
        clock: Callable[[], float] = time.time,
        max_row_bytes: int = MAX_ROW_BYTES,
    ) -> None:
        if max_connections < 1:
            raise ConfigurationError(f"max_connections must be 1 or more, not {max_connections}")
        self.dsn = dsn
        self._max_connections = max_connections
        self._clock = clock
        self._max_row_bytes = max_row_bytes
        self._pool: Connections | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the pool's
        self._opening = asyncio.Lock()
        self._functions = WriteFunctions()

    @property
    def durable(self) -> bool:
        return True

    # -- the Store protocol -------------------------------------------------

    async def load_messages(
        self, session_id: str, *, start: int = 0, limit: int | None = None
    ) -> list[Message]:
        params = _statements.page_params(session_id, start, limit)
        rows = await self._read(_statements.SELECT_MESSAGES_FROM, params, session_id)
        return _rows.row_messages(session_id, rows, start=params[1])

    async def load_context(self, session_id: str) -> tuple[int, list[Message]]:
        rows = await self._read(_statements.SELECT_CONTEXT, (session_id, session_id), session_id)
        return _rows.context_rows(session_id, rows)

    async def find_request(self, session_id: str, request_key: str) -> tuple[int, str] | None:
        rows = await self._read(_statements.FIND_REQUEST, (session_id, request_key), session_id)
        return (int(rows[0][0]), str(rows[0][1])) if rows else None

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
            packed=False,
        )  # fmt: skip
        import psycopg

        try:
            await self._write([session_id], statements, session_id)
        except psycopg.IntegrityError as exc:
            if _is_conflict(exc):
                raise SessionConflictError(session_id, expected_seq, _said(exc)) from None
            raise StoreError(
                f"append to session {session_id!r} failed: {_said(exc)}", session_id=session_id
            ) from exc
        return expected_seq + len(messages)

    async def load_approvals(self, session_id: str) -> list[ApprovalEvent]:
        rows = await self._read(_statements.SELECT_APPROVALS, (session_id,), session_id)
        return [_rows.row_approval_event(row, session_id) for row in rows]

    async def acquire_lease(
        self, session_id: str, owner: str, ttl_ms: int, *, take_from: str | None = None
    ) -> LeaseHolder | None:
        params = _statements.acquire_lease_params(
            session_id, owner, int(self._clock() * 1000), ttl_ms, take_from
        )
        # One conditional write: ON CONFLICT locks the holder's row and checks the
        # condition on its newest version, so two hosts never both take the lease.
        taken = await self._write([], [(_statements.ACQUIRE_LEASE, params)], session_id)
        if taken[0] == 1:
            return None
        rows = await self._read(_statements.SELECT_LEASE, (session_id,), session_id)
        # Released between the two statements: report it as expiring now.
        if not rows:
            return LeaseHolder("(released)", params[3])
        return LeaseHolder(str(rows[0][0]), int(rows[0][1]))

    async def release_lease(self, session_id: str, owner: str) -> None:
        await self._write([], [(_statements.RELEASE_LEASE, (session_id, owner))], session_id)

    async def get_session(self, session_id: str) -> SessionInfo | None:
        rows = await self._read(_statements.SELECT_SESSION, (session_id,), session_id)
        return _rows.row_session_info(rows[0]) if rows else None

    async def list_sessions(
        self, *, limit: int = 50, cursor: str | None = None, agent_name: str | None = None
    ) -> SessionPage:
        sql, params = _paging.list_statement(cursor, limit, agent_name)
        rows = await self._read(sql, params)
        return SessionPage(*_paging.page_of([_rows.row_session_info(r) for r in rows], limit))

    async def find_sessions(self, name: str) -> list[SessionInfo]:
        rows = await self._read(_statements.FIND_SESSIONS, (name,))
        return [_rows.row_session_info(row) for row in rows]

    async def delete_session(self, session_id: str) -> bool:
        statements = [(sql, (session_id,)) for sql in _DELETE_SESSION_ROWS]
        changed = await self._write([session_id], statements, session_id)
        return changed[-1] > 0

    async def delete_idle(self, before_ms: int, *, limit: int = 100) -> int:
        before, bound = _statements.idle_params(before_ms, limit)
        idle = await self._read(_statements.SELECT_IDLE, (before, bound))
        ids = sorted(str(row[0]) for row in idle)  # locked in one order: no deadlock
        if not ids:
            return 0
        import psycopg

        encoded = list(_postgres_sql.encode_params(ids))
        try:
            async with self._connection() as conn, conn.transaction():
                for session_id in encoded:
                    await conn.execute(_LOCK_SESSION, (session_id,))
                still = await conn.execute(_STILL_IDLE, (encoded, before))
                chosen = [row[0] for row in await still.fetchall()]  # encoded, as stored
                deleted = 0
                for sql in _DELETE_BY_IDS:
                    deleted = (await conn.execute(sql, (chosen,))).rowcount
        except psycopg.Error as exc:
            raise self._failed(exc, None, written=True) from exc
        return deleted

    async def load_schedules(self, session_id: str) -> list[Schedule]:
        rows = await self._read(_statements.SELECT_SCHEDULES, (session_id,), session_id)
        return [_rows.row_schedule(row) for row in rows]

    async def delete_schedule(self, session_id: str, schedule_id: str) -> bool:
        params = (session_id, schedule_id)
        changed = await self._write(
            [session_id], [(_statements.DELETE_SCHEDULE, params)], session_id
        )
        return changed[-1] > 0

    async def due_schedules(
        self, before_ms: int, *, limit: int = 100
    ) -> list[tuple[str, Schedule]]:
        """(session id, schedule) of up to `limit` schedules due before `before_ms`, of
        every session, earliest due first: what `durable-agents worker` fires."""
        rows = await self._read(
            _statements.SELECT_DUE_SCHEDULES, _statements.idle_params(before_ms, limit)
        )
        return [(str(row[0]), _rows.row_schedule(row[1:])) for row in rows]

    async def expired_leases(
        self, *, limit: int = 100, host: str | None = None
    ) -> list[tuple[str, LeaseHolder]]:
        """(session id, holder) of up to `limit` run leases that expired, longest
        expired first, and with `host` that host's unexpired ones after them: as
        `SQLiteStore.expired_leases`, what `durable-agents worker` resumes."""
        now_ms, bound = _statements.idle_params(int(self._clock() * 1000), limit)
        if host is None:
            rows = await self._read(_statements.SELECT_EXPIRED_LEASES, (now_ms, bound))
        else:
            prefix = f"{host}/"
            rows = await self._read(
                _statements.SELECT_EXPIRED_OR_HOST_LEASES, (now_ms, len(prefix), prefix, bound)
            )
        return [(str(row[0]), LeaseHolder(str(row[1]), int(row[2]))) for row in rows]

    async def load_timeline(
        self, session_id: str, *, start: int = 0, limit: int | None = None
    ) -> list[tuple[int, Message]]:
        params = _statements.page_params(session_id, start, limit)
        rows = await self._read(_statements.SELECT_TIMELINE, params, session_id)
        return _rows.timeline_rows(session_id, rows, start=params[1])

    # -- lifecycle ----------------------------------------------------------

    async def close(self) -> None:
        """Close the pool's connections. The store reopens on next use."""
        pool, self._pool = self._pool, None
        if pool is not None and self._loop is asyncio.get_running_loop():
            await pool.close()
        elif pool is not None:  # opened in a loop that has ended
            pool.drop()

    async def __aenter__(self) -> PostgresStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- internals ----------------------------------------------------------

    async def _read(
        self, shared_sql: str, params: Sequence[Any], session_id: str | None = None
    ) -> list[tuple[Any, ...]]:
        import psycopg

        try:
            async with self._connection() as conn:
                cursor = await conn.execute(
                    _sql(shared_sql), _postgres_sql.encode_params(params), prepare=True
                )
                return [_postgres_sql.decode_row(row) for row in await cursor.fetchall()]
        except psycopg.Error as exc:
            raise self._failed(exc, session_id, written=False) from exc

    async def _write(
        self, locked: Sequence[str], statements: Sequence[Statement], session_id: str
    ) -> list[int]:
        """Run `statements` as one transaction, in one round trip, after the locks of the
        sessions `locked`; their row counts. IntegrityError passes through."""
        import psycopg

        sqls = tuple([_LOCK_SESSION] * len(locked) + [_sql(s) for s, _ in statements])
        params = [*locked, *(value for _, values in statements for value in values)]
        encoded = _postgres_sql.encode_params(params)
        try:
            async with self._connection() as conn:
                counts = await self._call(conn, sqls, encoded)
                if counts is None:
                    counts = await _simple_query(conn, sqls, encoded)
                return counts[len(locked) :]
        except psycopg.IntegrityError:
            raise
        except psycopg.Error as exc:
            raise self._failed(exc, session_id, written=True) from exc

    async def _call(
        self, conn: psycopg.AsyncConnection[Any], sqls: tuple[str, ...], params: Sequence[Any]
    ) -> list[int] | None:
        """The write as one call of its shape's function (`_pg_writes`); None where
        the shape has none."""
        import psycopg

        functions = self._functions
        if functions.unusable(sqls, params):
            return None
        call = functions.known(sqls) or await functions.make(conn, sqls)
        if call is None or not call.accepts(params):
            return None
        try:
            cursor = await conn.execute(call.sql, params, prepare=True)
        except psycopg.errors.UndefinedFunction:
            # Dropped since it was made (nothing ran): made again, and called once more.
            functions.forget(sqls)
            call = await functions.make(conn, sqls)
            if call is None:
                return None
            cursor = await conn.execute(call.sql, params, prepare=True)
        row = await cursor.fetchone()
        return [int(n) for n in row[0]] if row else []

    def _failed(self, exc: Exception, session_id: str | None, *, written: bool) -> StoreError:
        import psycopg

        unknown = written and isinstance(exc, psycopg.OperationalError)
        outcome = (
            "; the outcome is unknown (the connection failed during the write): "
            "reload before writing again"
            if unknown
            else ""
        )
        return StoreError(f"PostgreSQL store failed: {_said(exc)}{outcome}", session_id=session_id)

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        pool = self._pool
        if pool is None or self._loop is not asyncio.get_running_loop():
            pool = await self._open()
        async with pool.connection() as conn:
            yield conn

    async def _open(self) -> Connections:
        import psycopg

        from ._pg_connections import Connections

        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # A pool serves the loop that opened it: a store used again under a new
            # loop (a second asyncio.run) opens a new one; the old loop's is gone.
            if self._pool is not None:
                self._pool.drop()
            self._pool, self._loop, self._opening = None, loop, asyncio.Lock()
        async with self._opening:
            if self._pool is not None:
                return self._pool
            # The migration first, on a connection of its own: a wrong URL or a server
            # that is down fails here at once.
            async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
                await _migrate(conn)
            self._pool = Connections(self.dsn, self._max_connections)
            return self._pool


async def _migrate(conn: psycopg.AsyncConnection[Any]) -> None:
    # A database that is current is left alone: no DDL, so a role that may use the
    # tables but not create them (its schema made by another) opens it, and a fleet of
    # processes starting takes no lock on the tables. Else in one transaction behind a
    # lock: two processes opening an old database queue here, and the second sees the
    # columns the first added.
    objects = await (await conn.execute(_postgres_sql.SELECT_OBJECTS)).fetchall()
    if _schema.is_current([str(row[0]) for row in objects], await _columns(conn)):
        return
    async with conn.transaction():
        await conn.execute(_LOCK_MIGRATION)
        plan = _schema.schema_plan(await _columns(conn))  # as the lock's last holder left it
        for statement in _postgres_sql.schema_statements(plan):
            await conn.execute(statement)


async def _columns(conn: psycopg.AsyncConnection[Any]) -> dict[str, set[str]]:
    """Each table of the schema, and its columns."""
    found: dict[str, set[str]] = {}
    for table, column in await (await conn.execute(_postgres_sql.SELECT_COLUMNS)).fetchall():
        found.setdefault(str(table), set()).add(str(column))
    return found


async def _simple_query(
    conn: psycopg.AsyncConnection[Any], sqls: Sequence[str], params: Sequence[Any]
) -> list[int]:
    """The statements as one query (one implicit transaction), values bound client-side:
    a query of several statements cannot carry server-side parameters."""
    import psycopg

    cursor = psycopg.AsyncClientCursor(conn)
    await cursor.execute(";\n".join(sqls), params)
    counts = [cursor.rowcount]
    while cursor.nextset():
        counts.append(cursor.rowcount)
    return counts


def _said(exc: Exception) -> str:
    """What the server said, without its CONTEXT lines (which name the write function
    and quote its statements): the message, and its detail where it has one."""
    import psycopg

    if not isinstance(exc, psycopg.Error) or not exc.diag.message_primary:
        return str(exc)
    detail = exc.diag.message_detail
    return exc.diag.message_primary + (f" ({detail})" if detail else "")


def _is_conflict(exc: psycopg.IntegrityError) -> bool:
    """Whether a failed append lost a race (as `_statements.is_conflict` judges SQLite's)."""
    import psycopg.errors

    table = exc.diag.table_name
    if table == "agent_approvals":
        return True  # a decision or claim whose condition failed (see `_schema`, 0003)
    if table == "agent_messages" and isinstance(exc, psycopg.errors.UniqueViolation):
        return True
    return _statements.is_conflict(str(exc))


def postgres_store(
    dsn: str,
    *,
    max_connections: int = 10,
    clock: Callable[[], float] = time.time,
    max_row_bytes: int = MAX_ROW_BYTES,
) -> PostgresStore:
    """A durable store in the PostgreSQL database at `dsn` (`postgresql://...`), its
    tables created or migrated on first use. Needs `durable-agents[postgres]`."""
    try:
        import psycopg  # noqa: F401
    except ImportError as exc:
        raise ConfigurationError(
            "postgres_store needs psycopg 3: pip install 'durable-agents[postgres]'"
        ) from exc
    return PostgresStore(
        dsn, max_connections=max_connections, clock=clock, max_row_bytes=max_row_bytes
    )
